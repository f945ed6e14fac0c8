"""Verification samplers and logits processing for speculative decoding.

Fast path: ``get_sampler(name).verify(target_logits, metadata, sampling, draft_probs)`` on ragged
batches (``SpecDecodeMetadata``). Plain sampling: ``sample(logits, sampling)``. The seeds' APIs:
``speculative_sampling``, ``greedy_match``, and the dense ``RejectionSampler()(...)`` /
``TypicalAcceptanceSampler(...)(...)``.
"""

from samplers.base import VerificationSampler
from samplers.functional import greedy_match, speculative_sampling
from samplers.greedy import GreedySampler
from samplers.logits_processing import logits_to_probs, process_logits
from samplers.metadata import SpecDecodeMetadata
from samplers.registry import available_samplers, get_sampler, register_sampler
from samplers.rejection import RejectionSampler
from samplers.sampler import sample
from samplers.sampling_tensors import SamplingTensors
from samplers.typical import TypicalAcceptanceSampler
from samplers.validation import parse_output
from samplers.verify_triton import INVALID_TOKEN_ID, MAX_SPEC_LEN

PLACEHOLDER_TOKEN_ID = -1

__all__ = [
    "INVALID_TOKEN_ID",
    "MAX_SPEC_LEN",
    "PLACEHOLDER_TOKEN_ID",
    "GreedySampler",
    "RejectionSampler",
    "SamplingTensors",
    "SpecDecodeMetadata",
    "TypicalAcceptanceSampler",
    "VerificationSampler",
    "available_samplers",
    "get_sampler",
    "greedy_match",
    "logits_to_probs",
    "parse_output",
    "process_logits",
    "register_sampler",
    "sample",
    "speculative_sampling",
]
