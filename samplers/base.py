"""The verification step shared by every sampler: checks, filters, random numbers, dispatch."""

from __future__ import annotations

import torch

from samplers.logits_processing import apply_filters
from samplers.metadata import SpecDecodeMetadata, host_to_device
from samplers.random_draws import draw_randoms
from samplers.sampling_tensors import SamplingTensors
from samplers.validation import check_structure, check_values
from samplers.verify_reference import REJECTION_MODE, TYPICAL_MODE, verify_reference
from samplers.verify_triton import verify_triton


class VerificationSampler:
    """Base class: subclasses set the acceptance rule through three class attributes.

    Args:
        validate: read tensor contents for NaN/inf logits and out-of-vocabulary drafts (this
            synchronises). None: on CPU tensors only.
        use_triton: run the Triton kernels. None: when the logits are on CUDA.
        chunk_size: vocabulary chunk of one Triton program (power of two); None picks one.
    """

    typical: bool = False  # Medusa typical acceptance instead of rejection sampling
    lossless: bool = True  # the output follows the target distribution (greedy: its argmax)
    all_greedy: bool = False  # every request verified by argmax match
    uses_draft_probs: bool = True

    def __init__(self, validate: bool | None = None, use_triton: bool | None = None,
                 chunk_size: int | None = None) -> None:
        self.validate = validate
        self.use_triton = use_triton
        self.chunk_size = chunk_size

    @classmethod
    def from_config(cls, config: object) -> VerificationSampler:
        """The sampler for the engine's ``SpeculativeConfig`` (read for the fields it needs)."""
        return cls()

    def _thresholds(self) -> tuple[float, float]:
        return 0.0, 0.0

    def verify(
        self,
        target_logits: torch.Tensor,  # [num_tokens + batch_size, vocab_size]
        metadata: SpecDecodeMetadata,
        sampling: SamplingTensors,
        draft_probs: torch.Tensor | None = None,  # [num_tokens, vocab_size]; None = one-hot
    ) -> torch.Tensor:
        """Verify every request's drafts; returns int64 ``[batch_size, max_spec_len + 1]``.

        Row ``i`` holds the accepted drafts, then one recovered or bonus token, then -1. A keyed
        request (``sampling.keys``: it has a seed) is verified by matching its keyed samples
        (:mod:`samplers.keyed_random`) whatever the sampler's rule: lossless, and its tokens do
        not depend on its drafts.
        """
        check_structure(target_logits, metadata, sampling, draft_probs)
        device = target_logits.device
        validate = self.validate if self.validate is not None else device.type == "cpu"
        if validate:
            check_values(target_logits, metadata, draft_probs)
        if not self.uses_draft_probs:
            draft_probs = None
        logits = target_logits
        if sampling.needs_filters and not self.all_greedy:
            rows = [n + 1 for n in metadata.num_draft_tokens]
            if len(set(rows)) == 1:  # (made on the device: a copy from pageable memory would
                # wait for the work queued before it, an overlapped step's forward)
                row_request = torch.arange(len(rows), device=device).repeat_interleave(rows[0])
            else:
                row_request = host_to_device([i for i, n in enumerate(rows) for _ in range(n)],
                                             torch.int64, device)
            logits = apply_filters(logits, sampling, row_request)
        vocab_size = logits.shape[1]
        if self.all_greedy or sampling.all_greedy:
            q = torch.empty(metadata.batch_size, vocab_size, dtype=torch.float32, device=device)
            u = torch.empty(metadata.batch_size, max(metadata.max_spec_len, 1),
                            dtype=torch.float32, device=device)
        else:
            q, u = draw_randoms(sampling, metadata.num_draft_tokens, vocab_size, device,
                                need_uniform=not self.typical)
        inv_temperature = sampling.inv_temperature
        if self.all_greedy:
            inv_temperature = torch.ones_like(inv_temperature)
        threshold, alpha = self._thresholds()
        use_triton = self.use_triton if self.use_triton is not None else device.type == "cuda"
        keys = sampling.keys if sampling.any_keyed and not self.all_greedy else None
        if use_triton:
            is_greedy = None if self.all_greedy or sampling.all_greedy else sampling.is_greedy
            return verify_triton(logits.contiguous(), metadata, inv_temperature, is_greedy,
                                 None if draft_probs is None else draft_probs.contiguous(),
                                 q, u, self.typical, threshold, alpha, self.chunk_size, keys)
        is_greedy = sampling.is_greedy.bool()
        if self.all_greedy:
            is_greedy = torch.ones_like(is_greedy)
        mode = TYPICAL_MODE if self.typical else REJECTION_MODE
        keyed_rows = None
        if keys is not None:  # (the rows of the keyed requests, from the host lists)
            rows, row = [], 0
            for keyed, n in zip(sampling.keyed, metadata.num_draft_tokens, strict=True):
                if keyed:
                    rows.extend(range(row, row + n + 1))
                row += n + 1
            keyed_rows = host_to_device(rows, torch.int64, device)
        return verify_reference(logits, metadata, inv_temperature, is_greedy, draft_probs, q, u,
                                mode, threshold, alpha, keys, keyed_rows)
