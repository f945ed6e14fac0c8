"""Proposers by name: the only switch between them.

A proposer is one file and a decorated factory ``factory(config, ctx) -> Proposer``, where
``config`` is the engine's ``SpeculativeConfig`` (read for the fields the proposer needs) and
``ctx`` a :class:`~proposers.base.ProposerContext`. Registering a name makes it a valid
``SpeculativeConfig.method`` and a choice of the CLI's ``--method``, from user code too::

    from proposers import Proposal, Proposer, register_proposer

    @register_proposer("repeat_last")
    def build(config, ctx):
        return RepeatLast()          # a Proposer subclass

    LLM(speculative_config={"method": "repeat_last", "num_speculative_tokens": 2})

(``examples/custom_proposer.py`` registers a whole proposer this way.) The built-in ones register
in their own modules: ``ngram`` (:mod:`proposers.ngram`), ``draft_model``
(:mod:`proposers.draft_model`) and ``early_exit`` (:mod:`proposers.early_exit`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (proposers.base imports torch: listing names must not)
    from proposers.base import Proposer, ProposerContext

ProposerFactory = Callable[[Any, "ProposerContext"], "Proposer"]

_FACTORIES: dict[str, ProposerFactory] = {}
_NEEDS_KV_CACHE: set[str] = set()
# The built-in proposers' names and the modules that register them, imported at the first lookup,
# so that listing the names (a config check, the CLI's --help) does not import torch
# (tests/proposers/test_proposer_registry.py checks that the modules register exactly these names).
BUILTIN_PROPOSERS = {"ngram": "proposers.ngram", "draft_model": "proposers.draft_model",
                     "early_exit": "proposers.early_exit", "eagle": "proposers.draft_head",
                     "ngram_eagle": "proposers.ngram_or_head", "eagle3": "proposers.eagle3",
                     "suffix": "proposers.suffix", "suffix_eagle": "proposers.suffix"}


def _load(name: str) -> None:
    if name not in _FACTORIES and name in BUILTIN_PROPOSERS:
        importlib.import_module(BUILTIN_PROPOSERS[name])


def register_proposer(name: str, needs_kv_cache: bool = False,
                      ) -> Callable[[ProposerFactory], ProposerFactory]:
    """Decorator: make ``factory(config, ctx) -> Proposer`` the proposer called ``name``.
    ``needs_kv_cache``: it runs a model over a KV cache of its own (``ctx.make_runner``), which
    the engine leaves GPU memory for."""
    if not isinstance(name, str) or not name or name == "none":
        raise ValueError(f"proposer name {name!r} is invalid: allowed a non-empty string other "
                         "than 'none' (the CLI's 'no speculation')")

    def wrap(factory: ProposerFactory) -> ProposerFactory:
        if BUILTIN_PROPOSERS.get(name, factory.__module__) != factory.__module__:
            _load(name)  # (a built-in name is taken even before its module is imported)
        if name in _FACTORIES and _FACTORIES[name] is not factory:
            raise ValueError(f"proposer name {name!r} is already registered by "
                             f"{_FACTORIES[name].__module__}.{_FACTORIES[name].__qualname__}")
        _FACTORIES[name] = factory
        if needs_kv_cache:
            _NEEDS_KV_CACHE.add(name)
        return factory

    return wrap


def get_proposer(method: str, config: Any, ctx: ProposerContext) -> Proposer:
    """Build the proposer registered as ``method``."""
    _load(method)
    if method not in _FACTORIES:
        raise ValueError(f"method={method!r} is invalid: allowed "
                         f"{' | '.join(available_proposers())}")
    return _FACTORIES[method](config, ctx)


def proposer_needs_kv_cache(method: str) -> bool:
    """Whether the proposer ``method`` registered as running a model over its own KV cache."""
    _load(method)
    return method in _NEEDS_KV_CACHE


def available_proposers() -> list[str]:
    """The registered proposer names, sorted (the built-in ones imported or not)."""
    return sorted(set(_FACTORIES) | set(BUILTIN_PROPOSERS))
