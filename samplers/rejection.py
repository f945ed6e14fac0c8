"""Modified rejection sampling: lossless verification of draft tokens."""

from __future__ import annotations

from samplers.base import VerificationSampler
from samplers.registry import register_sampler


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
    """
