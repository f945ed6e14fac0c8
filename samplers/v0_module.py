"""vLLM V0's sampler *module call*, shared by ``RejectionSampler`` and ``TypicalAcceptanceSampler``.

``sampler(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)`` with dense
``[batch_size, k + 1, vocab_size]`` probabilities returns ``[batch_size, k + 1]`` int64 tokens,
-1 after the first rejection. The work is :func:`samplers.seed_api.verify_dense`; this module adds
only the optional ``strict_mode`` input checks (shapes, devices, dtypes, token-id ranges).
"""

from __future__ import annotations

import torch

_ARG_NAMES = ("target_with_bonus_probs", "bonus_token_ids", "draft_probs", "draft_token_ids")
_VERIFY_FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # what ``verify`` takes


def check_strict_mode(strict_mode: object) -> bool:
    """``strict_mode`` as given to a constructor; raises ``TypeError`` unless it is a bool."""
    if not isinstance(strict_mode, bool):
        raise TypeError(f"strict_mode must be a bool, got {strict_mode!r}")
    return strict_mode


def _is_integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def check_inputs(
    target_with_bonus_probs: torch.Tensor,  # [batch_size, k + 1, vocab_size]
    bonus_token_ids: torch.Tensor,  # [batch_size, 1]
    draft_probs: torch.Tensor | None,  # [batch_size, k, vocab_size]; None: not checked
    draft_token_ids: torch.Tensor,  # [batch_size, k]
) -> None:
    """The ``strict_mode`` checks; each error names the argument and what is wrong.

    ``TypeError``: an argument is not a tensor, probabilities are not floating point, token ids
    are not integers. ``ValueError``: a wrong number of dimensions, a batch size, ``k`` or
    vocabulary size that disagrees with ``target_with_bonus_probs``, tensors on several devices,
    token ids outside ``[0, vocab_size)`` (this last check reads the ids, so it synchronises).
    """
    given = dict(zip(_ARG_NAMES, (target_with_bonus_probs, bonus_token_ids, draft_probs,
                                  draft_token_ids), strict=True))
    if draft_probs is None:
        del given["draft_probs"]
    for name, t in given.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name in ("target_with_bonus_probs", "draft_probs"):
        if name in given and not given[name].dtype.is_floating_point:
            raise TypeError(f"{name} has dtype {given[name].dtype}, expected a floating dtype "
                            "(probabilities)")
    for name in ("draft_token_ids", "bonus_token_ids"):
        if not _is_integer(given[name].dtype):
            raise TypeError(f"{name} has dtype {given[name].dtype}, expected an integer dtype")
    layouts = {"target_with_bonus_probs": (3, "[batch_size, k + 1, vocab_size]"),
               "bonus_token_ids": (2, "[batch_size, 1]"),
               "draft_probs": (3, "[batch_size, k, vocab_size]"),
               "draft_token_ids": (2, "[batch_size, k]")}
    for name, t in given.items():
        expected_dim, layout = layouts[name]
        if t.dim() != expected_dim:
            raise ValueError(f"{name} has {t.dim()} dimensions (shape {tuple(t.shape)}), "
                             f"expected {expected_dim}: {layout}")
    batch_size, k_plus_1, vocab_size = target_with_bonus_probs.shape
    if k_plus_1 < 1 or vocab_size < 1:
        raise ValueError(f"target_with_bonus_probs has shape {tuple(target_with_bonus_probs.shape)}"
                         ": expected k + 1 >= 1 positions and vocab_size >= 1")
    for name, t in given.items():
        if t.shape[0] != batch_size:
            raise ValueError(f"{name} has batch size {t.shape[0]}, target_with_bonus_probs has "
                             f"{batch_size}")
    k = draft_token_ids.shape[1]
    if k_plus_1 != k + 1:
        raise ValueError(f"target_with_bonus_probs has {k_plus_1} positions, expected k + 1 = "
                         f"{k + 1} (k = {k} drafts in draft_token_ids)")
    if bonus_token_ids.shape[1] != 1:
        raise ValueError(f"bonus_token_ids has shape {tuple(bonus_token_ids.shape)}, expected "
                         f"[batch_size, 1] = {(batch_size, 1)}")
    if draft_probs is not None:
        if draft_probs.shape[1] != k:
            raise ValueError(f"draft_probs has {draft_probs.shape[1]} draft positions, "
                             f"draft_token_ids has k = {k}")
        if draft_probs.shape[2] != vocab_size:
            raise ValueError(f"draft_probs has vocab_size {draft_probs.shape[2]}, "
                             f"target_with_bonus_probs has {vocab_size}")
    device = target_with_bonus_probs.device
    for name, t in given.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, target_with_bonus_probs on {device}: all "
                             "tensors must be on one device")
    for name in ("draft_token_ids", "bonus_token_ids"):
        ids = given[name]
        if ids.numel() and bool(((ids < 0) | (ids >= vocab_size)).any()):
            raise ValueError(f"{name} has ids outside [0, vocab_size={vocab_size}): "
                             f"min {int(ids.min())}, max {int(ids.max())}")


def call_dense(
    sampler,  # a VerificationSampler with a ``strict_mode`` attribute
    target_with_bonus_probs: torch.Tensor,  # [batch_size, k + 1, vocab_size]
    bonus_token_ids: torch.Tensor,  # [batch_size, 1]
    draft_probs: torch.Tensor | None,  # [batch_size, k, vocab_size]
    draft_token_ids: torch.Tensor,  # [batch_size, k]
) -> torch.Tensor:
    """The module call: optional strict checks, then ``verify_dense``; ``[batch_size, k + 1]``."""
    from samplers.seed_api import verify_dense  # seed_api imports the sampler classes

    if not sampler.uses_draft_probs:
        draft_probs = None  # documented as unused by such samplers: neither checked nor read
    if sampler.strict_mode:
        check_inputs(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)
    if (isinstance(draft_probs, torch.Tensor) and draft_probs.dtype.is_floating_point
            and draft_probs.dtype not in _VERIFY_FLOATS):
        draft_probs = draft_probs.float()  # e.g. float64; the target is cast by verify_dense too
    return verify_dense(sampler, target_with_bonus_probs, bonus_token_ids, draft_probs,
                        draft_token_ids)
