"""Proposers: guess the next tokens of each request (n-gram lookup, draft model, early exit, a
trained draft head on the target's features).

``get_proposer(method, config, ctx)`` builds one by name and ``register_proposer(name)`` adds
one (:mod:`proposers.registry`); see :mod:`proposers.base` for the interface the engine calls.
The registry functions import without torch; the interface types are imported on first use, and
a built-in proposer's module when its name is first looked up.
"""

from __future__ import annotations

import importlib
from typing import Any

from proposers.registry import (
    available_proposers,
    get_proposer,
    proposer_needs_kv_cache,
    register_proposer,
)

_BASE_TYPES = ("DraftRunner", "FeatureUpdate", "Proposal", "ProposeRequest", "Proposer",
               "ProposerContext")

__all__ = [*_BASE_TYPES, "available_proposers", "get_proposer", "proposer_needs_kv_cache",
           "register_proposer"]


def __getattr__(name: str) -> Any:
    if name in _BASE_TYPES:
        return getattr(importlib.import_module("proposers.base"), name)
    raise AttributeError(f"module 'proposers' has no attribute {name!r}")
