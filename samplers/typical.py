"""Medusa typical acceptance: fast, lossy verification."""

from __future__ import annotations

import torch

from samplers.base import VerificationSampler
from samplers.registry import register_sampler
from samplers.v0_module import call_dense, check_strict_mode


@register_sampler("typical", "typical_acceptance_sampler")
class TypicalAcceptanceSampler(VerificationSampler):
    """Typical acceptance (Cai et al., Medusa, arXiv 2401.10774, section 3.3.1).

    **Lossy by design**: the output does not follow the target distribution; it trades exactness
    for longer accepted prefixes. Draft ``x_j`` is accepted when

        p_j(x_j) > min(posterior_threshold, posterior_alpha * exp(-H(p_j)))

    with ``H`` the entropy of the processed target distribution ``p_j``: in flat (uncertain)
    distributions the bar is lower. The first rejected slot gets ``argmax(p_j)``; when all ``k``
    drafts are accepted a bonus token is sampled from ``p_k`` as plain sampling would. Draft
    probabilities are not used. Greedy requests are verified by argmax match.

    Example (defaults 0.09 / 0.3): a uniform ``p`` over 4 tokens has ``H = ln 4`` and bar
    ``min(0.09, 0.3 / 4) = 0.075``, so any draft (``p = 0.25``) is accepted.

    Called like vLLM V0's module, ``sampler(target_with_bonus_probs [batch, k + 1, vocab],
    bonus_token_ids [batch, 1], draft_probs, draft_token_ids [batch, k])`` returns ``[batch,
    k + 1]`` int64: the given bonus id in the last slot when all ``k`` drafts are accepted, -1
    after the first rejection (:func:`samplers.seed_api.verify_dense`); ``draft_probs`` is unused
    (may be None). ``strict_mode=True`` first checks shapes, devices, dtypes and token-id ranges
    (:func:`samplers.v0_module.check_inputs`); other keywords go to ``VerificationSampler``.
    """

    typical = True
    lossless = False
    uses_draft_probs = False

    def __init__(self, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3,
                 strict_mode: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        for name, value in (("posterior_threshold", posterior_threshold),
                            ("posterior_alpha", posterior_alpha)):
            if isinstance(value, bool):  # e.g. vLLM's documented order taken as positional
                raise TypeError(f"{name}={value!r} must be a number, not a bool")
        self.strict_mode = check_strict_mode(strict_mode)
        if not 0.0 < posterior_threshold <= 1.0:
            raise ValueError(f"posterior_threshold={posterior_threshold!r} is invalid: "
                             "allowed (0, 1]")
        if not 0.0 < posterior_alpha <= 1.0:
            raise ValueError(f"posterior_alpha={posterior_alpha!r} is invalid: allowed (0, 1]")
        self.posterior_threshold = float(posterior_threshold)
        self.posterior_alpha = float(posterior_alpha)

    @classmethod
    def from_config(cls, config: object) -> TypicalAcceptanceSampler:
        """``SpeculativeConfig.posterior_threshold`` and ``posterior_alpha``."""
        return cls(config.posterior_threshold, config.posterior_alpha)

    def _thresholds(self) -> tuple[float, float]:
        return self.posterior_threshold, self.posterior_alpha

    def __call__(
        self,
        target_with_bonus_probs: torch.Tensor,  # [batch_size, k + 1, vocab_size]
        bonus_token_ids: torch.Tensor,  # [batch_size, 1]
        draft_probs: torch.Tensor | None,  # unused
        draft_token_ids: torch.Tensor,  # [batch_size, k]
    ) -> torch.Tensor:
        """vLLM V0's dense call; returns int64 ``[batch_size, k + 1]``, -1 after a rejection."""
        return call_dense(self, target_with_bonus_probs, bonus_token_ids, draft_probs,
                          draft_token_ids)

    forward = __call__  # the name vLLM V0's module gave the same call
