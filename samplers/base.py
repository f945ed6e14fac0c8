"""The verification step shared by every sampler: checks, filters, random numbers, dispatch."""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams
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
    all_greedy: bool = False  # every request verified by argmax match
    uses_draft_probs: bool = True

    def __init__(self, validate: bool | None = None, use_triton: bool | None = None,
                 chunk_size: int | None = None) -> None:
        self.validate = validate
        self.use_triton = use_triton
        self.chunk_size = chunk_size

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

        Row ``i`` holds the accepted drafts, then one recovered or bonus token, then -1.
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
        if use_triton:
            is_greedy = None if self.all_greedy or sampling.all_greedy else sampling.is_greedy
            return verify_triton(logits.contiguous(), metadata, inv_temperature, is_greedy,
                                 None if draft_probs is None else draft_probs.contiguous(),
                                 q, u, self.typical, threshold, alpha, self.chunk_size)
        is_greedy = sampling.is_greedy.bool()
        if self.all_greedy:
            is_greedy = torch.ones_like(is_greedy)
        mode = TYPICAL_MODE if self.typical else REJECTION_MODE
        return verify_reference(logits, metadata, inv_temperature, is_greedy, draft_probs, q, u,
                                mode, threshold, alpha)

    def __call__(
        self,
        target_with_bonus_probs: torch.Tensor,  # [batch_size, k + 1, vocab_size]
        bonus_token_ids: torch.Tensor,  # [batch_size, 1]
        draft_probs: torch.Tensor | None,  # [batch_size, k, vocab_size]
        draft_token_ids: torch.Tensor,  # [batch_size, k]
    ) -> torch.Tensor:
        """Dense form (vLLM V0): probabilities in, ``[batch_size, k + 1]`` out, -1 after the
        first rejection; ``bonus_token_ids`` fill the last slot when every draft is accepted."""
        probs = target_with_bonus_probs
        if probs.dim() != 3:
            raise ValueError(f"target_with_bonus_probs must be [batch_size, k + 1, vocab_size], "
                             f"got {tuple(probs.shape)}")
        batch_size, k, vocab_size = probs.shape[0], probs.shape[1] - 1, probs.shape[2]
        if tuple(draft_token_ids.shape) != (batch_size, k):
            raise ValueError(f"draft_token_ids has shape {tuple(draft_token_ids.shape)}, "
                             f"expected {(batch_size, k)}")
        if tuple(bonus_token_ids.shape) != (batch_size, 1):
            raise ValueError(f"bonus_token_ids has shape {tuple(bonus_token_ids.shape)}, "
                             f"expected {(batch_size, 1)}")
        if draft_probs is not None and self.uses_draft_probs:
            if tuple(draft_probs.shape) != (batch_size, k, vocab_size):
                raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}, expected "
                                 f"{(batch_size, k, vocab_size)}")
            draft_probs = draft_probs.reshape(batch_size * k, vocab_size)
        else:
            draft_probs = None
        device = probs.device
        metadata = SpecDecodeMetadata(
            draft_token_ids=draft_token_ids.reshape(-1).long(),
            num_draft_tokens=[k] * batch_size,
            cu_num_draft_tokens=(torch.arange(1, batch_size + 1, device=device,
                                              dtype=torch.int32) * k),
            max_spec_len=k,
        )
        sampling = _plain_sampling(batch_size, device)
        logits = torch.log(probs.float()).reshape(batch_size * (k + 1), vocab_size)
        out = self.verify(logits, metadata, sampling, draft_probs)
        all_accepted = out[:, k] >= 0
        out[:, k] = torch.where(all_accepted, bonus_token_ids[:, 0].to(out.dtype), out[:, k])
        return out


def _plain_sampling(batch_size: int, device: torch.device) -> SamplingTensors:
    """Temperature 1, no filters, global RNG: the distributions are used as given."""
    return SamplingTensors.from_params([SamplingParams()] * batch_size, None, device)
