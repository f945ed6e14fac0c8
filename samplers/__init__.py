"""Sampling parameters, logits processing and verification samplers for speculative decoding.

Fast path: ``get_sampler(name).verify(target_logits, metadata, sampling, draft_probs)`` on ragged
batches (``SpecDecodeMetadata``); with no drafts it is plain sampling. ``SamplingParams`` and the
per-position adjustments (``samplers.logits_adjust``) live here too. The APIs of the documents
the project started from: ``speculative_sampling``, ``greedy_match`` and ``verify_dense``
(:mod:`samplers.seed_api`), the last also as vLLM V0's module call ``RejectionSampler()(...)``.
"""

from samplers.base import VerificationSampler
from samplers.greedy import GreedySampler
from samplers.logits_processing import logits_to_probs, process_logits
from samplers.metadata import (
    INVALID_TOKEN_ID,
    MAX_SPEC_LEN,
    PLACEHOLDER_TOKEN_ID,
    SpecDecodeMetadata,
)
from samplers.registry import available_samplers, build_sampler, get_sampler, register_sampler
from samplers.rejection import RejectionSampler
from samplers.sampling_params import SamplingParams
from samplers.sampling_tensors import SamplingTensors
from samplers.seed_api import greedy_match, speculative_sampling, verify_dense
from samplers.structured.params import StructuredOutputsParams
from samplers.typical import TypicalAcceptanceSampler
from samplers.validation import parse_output

__all__ = [
    "INVALID_TOKEN_ID",
    "MAX_SPEC_LEN",
    "PLACEHOLDER_TOKEN_ID",
    "GreedySampler",
    "RejectionSampler",
    "SamplingParams",
    "SamplingTensors",
    "SpecDecodeMetadata",
    "StructuredOutputsParams",
    "TypicalAcceptanceSampler",
    "VerificationSampler",
    "available_samplers",
    "build_sampler",
    "get_sampler",
    "greedy_match",
    "logits_to_probs",
    "parse_output",
    "process_logits",
    "register_sampler",
    "speculative_sampling",
    "verify_dense",
]
