"""Verification samplers by name: the only switch between them.

A sampler is one file and a class decorated with ``@register_sampler(name, *aliases)``, a
subclass of :class:`~samplers.base.VerificationSampler`; every registered name is a valid
``SpeculativeConfig.acceptance_method`` and a choice of the CLI's ``--acceptance-method``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

_SAMPLERS: dict[str, type] = {}
# The built-in samplers' names and the modules that register them, imported at the first lookup,
# so that listing the names (a config check, the CLI's --help) does not import torch
# (tests/samplers/test_sampler_registry.py checks that the modules register exactly these names).
BUILTIN_SAMPLERS = {"greedy": "samplers.greedy", "rejection": "samplers.rejection",
                    "rejection_sampler": "samplers.rejection", "typical": "samplers.typical",
                    "typical_acceptance_sampler": "samplers.typical"}


def _load(name: str) -> None:
    if name not in _SAMPLERS and name in BUILTIN_SAMPLERS:
        importlib.import_module(BUILTIN_SAMPLERS[name])


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
    _load(name)
    if name not in _SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}: allowed {available_samplers()}")
    return _SAMPLERS[name](**kwargs)


def build_sampler(name: str, config: object):
    """The sampler registered as ``name``, set up from the engine's ``SpeculativeConfig``
    (``VerificationSampler.from_config``)."""
    _load(name)
    if name not in _SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}: allowed {available_samplers()}")
    return _SAMPLERS[name].from_config(config)


def available_samplers() -> list[str]:
    """Every registered name and alias, sorted (the built-in ones imported or not)."""
    return sorted(set(_SAMPLERS) | set(BUILTIN_SAMPLERS))
