"""Modified rejection sampling: lossless verification of draft tokens."""

from __future__ import annotations

import torch

from samplers.base import VerificationSampler
from samplers.registry import register_sampler
from samplers.v0_module import call_dense, check_strict_mode


@register_sampler("rejection", "rejection_sampler")
class RejectionSampler(VerificationSampler):
    """Modified rejection sampling (Leviathan et al., arXiv 2211.17192; Chen et al., 2302.01318).

    For each draft ``x_j`` of a request, in order, with ``p_j`` the processed target distribution
    and ``d_j`` the draft distribution:

    - accept with probability ``min(1, p_j(x_j) / d_j(x_j))`` (``p > u * d``, ``u ~ U[0, 1)``);
    - at the first rejection emit a token from ``normalize(max(p_j - d_j, 0))`` and stop;
    - if all ``k`` are accepted emit a bonus token from ``p_k``.

    Every emitted token is then distributed exactly as the target would sample it. One-hot drafts
    (``draft_probs=None``: n-gram or greedy drafts) have ``d_j = delta(x_j)``: accept with
    probability ``p_j(x_j)``, and on rejection sample ``p_j`` with ``x_j`` removed, renormalised.
    Greedy requests (temperature 0) in the batch are verified by argmax match instead.

    Example: ``p_0 = [0.5, 0.3, 0.2]``, ``d_0 = [0.2, 0.6, 0.2]``, ``x_0 = 1`` is accepted with
    probability 0.3 / 0.6 = 0.5; otherwise the token comes from ``max(p_0 - d_0, 0) =
    [0.3, 0, 0]``, i.e. token 0.

    Called like vLLM V0's module, ``sampler(target_with_bonus_probs [batch, k + 1, vocab],
    bonus_token_ids [batch, 1], draft_probs [batch, k, vocab], draft_token_ids [batch, k])``
    returns ``[batch, k + 1]`` int64: the given bonus id in the last slot when all ``k`` drafts
    are accepted, -1 after the first rejection (:func:`samplers.seed_api.verify_dense`).
    ``strict_mode=True`` first checks shapes, devices, dtypes and token-id ranges
    (:func:`samplers.v0_module.check_inputs`); other keywords go to ``VerificationSampler``.
    """

    def __init__(self, strict_mode: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.strict_mode = check_strict_mode(strict_mode)

    def __call__(
        self,
        target_with_bonus_probs: torch.Tensor,  # [batch_size, k + 1, vocab_size]
        bonus_token_ids: torch.Tensor,  # [batch_size, 1]
        draft_probs: torch.Tensor | None,  # [batch_size, k, vocab_size]; None = one-hot drafts
        draft_token_ids: torch.Tensor,  # [batch_size, k]
    ) -> torch.Tensor:
        """vLLM V0's dense call; returns int64 ``[batch_size, k + 1]``, -1 after a rejection."""
        return call_dense(self, target_with_bonus_probs, bonus_token_ids, draft_probs,
                          draft_token_ids)

    forward = __call__  # the name vLLM V0's module gave the same call
