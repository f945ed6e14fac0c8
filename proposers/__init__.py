"""Proposers: guess the next tokens of each request (n-gram lookup, draft model, early exit, a
trained draft head on the target's features, EAGLE-3 heads in the speculators format).

``get_proposer(method, config, ctx)`` builds one by name and ``register_proposer(name)`` adds
one (:mod:`proposers.registry`); see :mod:`proposers.base` for the interface the engine calls.
"""

from proposers import (  # noqa: F401 (they register themselves)
    draft_head,
    draft_model,
    eagle3,
    early_exit,
    ngram,
    ngram_or_head,
    suffix,
)
from proposers.base import (
    DraftRunner,
    FeatureUpdate,
    Proposal,
    Proposer,
    ProposerContext,
    ProposeRequest,
)
from proposers.registry import (
    available_proposers,
    get_proposer,
    proposer_needs_kv_cache,
    register_proposer,
)

__all__ = ["DraftRunner", "FeatureUpdate", "Proposal", "ProposeRequest", "Proposer",
           "ProposerContext", "available_proposers", "get_proposer", "proposer_needs_kv_cache",
           "register_proposer"]
