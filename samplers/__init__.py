"""Sampling parameters, logits processing and verification samplers for speculative decoding.

Fast path: ``get_sampler(name).verify(target_logits, metadata, sampling, draft_probs)`` on ragged
batches (``SpecDecodeMetadata``); with no drafts it is plain sampling. ``SamplingParams`` and the
per-position adjustments (``samplers.logits_adjust``) live here too. The APIs of the documents
the project started from: ``speculative_sampling``, ``greedy_match`` and ``verify_dense``
(:mod:`samplers.seed_api`), the last also as vLLM V0's module call ``RejectionSampler()(...)``.

``SamplingParams``, the registry functions and the limits import without torch; the rest is
imported on first use (``samplers.RejectionSampler`` and ``from samplers import ...`` alike), so
that the CLI's ``--help`` and a config check stay light.
"""

from __future__ import annotations

import importlib
from typing import Any

from samplers.limits import INVALID_TOKEN_ID, MAX_SPEC_LEN, PLACEHOLDER_TOKEN_ID
from samplers.registry import available_samplers, build_sampler, get_sampler, register_sampler
from samplers.sampling_params import SamplingParams

# name: the module that defines it (imported when the name is first read)
_LAZY = {
    "VerificationSampler": "samplers.base",
    "GreedySampler": "samplers.greedy",
    "argmax_tokens": "samplers.greedy",
    "logits_to_probs": "samplers.logits_processing",
    "process_logits": "samplers.logits_processing",
    "SpecDecodeMetadata": "samplers.metadata",
    "RejectionSampler": "samplers.rejection",
    "SamplingTensors": "samplers.sampling_tensors",
    "greedy_match": "samplers.seed_api",
    "speculative_sampling": "samplers.seed_api",
    "verify_dense": "samplers.seed_api",
    "StructuredOutputsParams": "samplers.structured.params",
    "TypicalAcceptanceSampler": "samplers.typical",
    "parse_output": "samplers.validation",
}

__all__ = [
    "INVALID_TOKEN_ID",
    "MAX_SPEC_LEN",
    "PLACEHOLDER_TOKEN_ID",
    "SamplingParams",
    "available_samplers",
    "build_sampler",
    "get_sampler",
    "register_sampler",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'samplers' has no attribute {name!r}")
