"""Proposers: guess the next tokens of each request (n-gram lookup, draft model, early exit).

``get_proposer(method, **kwargs)`` builds one by name; see :mod:`proposers.base` for the
interface the engine calls.
"""

from proposers.base import Proposal, Proposer, ProposeRequest
from proposers.registry import get_proposer, register_proposer

__all__ = ["Proposal", "ProposeRequest", "Proposer", "get_proposer", "register_proposer"]
