"""Proposers by name: ``get_proposer("ngram" | "draft_model" | "early_exit", **kwargs)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proposers.base import Proposer

_FACTORIES: dict[str, Callable[..., Proposer]] = {}


def register_proposer(name: str) -> Callable[[Callable[..., Proposer]], Callable[..., Proposer]]:
    """Decorator: make ``factory(**kwargs) -> Proposer`` available as ``get_proposer(name)``."""

    def wrap(factory: Callable[..., Proposer]) -> Callable[..., Proposer]:
        _FACTORIES[name] = factory
        return factory

    return wrap


def get_proposer(method: str, **kwargs: Any) -> Proposer:
    """Build the proposer ``method`` with its own keyword arguments."""
    _register_builtins()
    if method not in _FACTORIES:
        raise ValueError(f"method={method!r} is invalid: allowed {' | '.join(sorted(_FACTORIES))}")
    return _FACTORIES[method](**kwargs)


def _register_builtins() -> None:
    """Import the built-in proposers lazily (the model-based ones pull in torch models)."""
    if "ngram" in _FACTORIES:
        return
    from proposers.ngram import NgramProposer

    register_proposer("ngram")(NgramProposer)
