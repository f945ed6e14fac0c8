"""Verification samplers by name, so that a new one plugs in without touching the engine."""

from __future__ import annotations

from collections.abc import Callable

_SAMPLERS: dict[str, type] = {}


def register_sampler(name: str, *aliases: str) -> Callable[[type], type]:
    """Class decorator: ``@register_sampler("rejection", "rejection_sampler")``."""

    def register(cls: type) -> type:
        for key in (name, *aliases):
            if key in _SAMPLERS and _SAMPLERS[key] is not cls:
                raise ValueError(f"sampler name {key!r} is already registered "
                                 f"by {_SAMPLERS[key].__name__}")
            _SAMPLERS[key] = cls
        return cls

    return register


def get_sampler(name: str, **kwargs):
    """Instantiate the sampler registered as ``name`` with ``kwargs``."""
    if name not in _SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}: allowed {sorted(_SAMPLERS)}")
    return _SAMPLERS[name](**kwargs)


def available_samplers() -> list[str]:
    return sorted(_SAMPLERS)
