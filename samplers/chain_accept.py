"""Greedy verification of uniform chains from the target's argmax, in one launch.

Why. An overlapped drafting step of greedy requests verified its chains with the verification
kernels (a pass over every logits row, then the decision and the output row: three launches
and the graph's input copies), then took each chain's accepted count, its last token and its
next first position in six more small kernels. A drafting step at batch 1 is bound by its number
of kernels (docs/design.md, "The drafting step's GPU time"), and where the forward's CUDA graph
ran the output head it computed every row's argmax already
(:func:`samplers.greedy.argmax_tokens`, the verification kernels' pick, ``INVALID_TOKEN_ID``
for a NaN, +inf or all -inf row). Greedy verification needs nothing else, so here one program a
chain decides from those argmaxes and writes all four results.

What (:func:`accept_chains_reference` in PyTorch, :class:`~samplers.greedy.GreedySampler`'s
rule). Chain ``b`` drafted ``drafts[b] [k]`` after a fed token; ``argmax[b * (k + 1) + j]`` is
the target's greedy token after draft ``j - 1`` (after the fed token for ``j = 0``):

- ``tokens [batch, k + 1]``: the drafts up to the first ``j`` where ``drafts[b, j] !=
  argmax[b, j]``, then the target's token there (the bonus token when all ``k`` match), then
  ``PLACEHOLDER_TOKEN_ID``; ``INVALID_TOKEN_ID`` in every slot when a row of the chain is
  invalid or a draft is outside ``[0, vocab_size)`` (as the verification kernels mark it);
- ``accepted [batch]``: the drafts accepted (``k`` for an invalid chain: every slot is taken);
- ``last [batch, 1]``: the chain's last token, the target's (0 for an invalid chain: it fails
  at the commit, and the next step's input for it is dropped);
- ``next_base [batch]``: ``base + accepted + 1``, where the next step's fed token goes.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

from samplers.metadata import INVALID_TOKEN_ID, PLACEHOLDER_TOKEN_ID

__all__ = ["accept_chains", "accept_chains_reference"]

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # (Triton runs CPU tensors too)


@triton.jit(do_not_specialize=["drafts_stride", "width"])  # (one kernel for every step)
def _accept_kernel(argmax_ptr, drafts_ptr, drafts_stride, base_ptr, tokens_ptr, accepted_ptr,
                   last_ptr, next_base_ptr, width, vocab_size, INVALID: tl.constexpr,
                   PLACEHOLDER: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK)
    live = j < width
    drafted = j < width - 1
    target = tl.load(argmax_ptr + b * width + j, mask=live, other=0)
    draft = tl.load(drafts_ptr + b * drafts_stride + j, mask=drafted, other=0)
    bad = live & ((target < 0) | (drafted & ((draft < 0) | (draft >= vocab_size))))
    invalid = tl.max(bad.to(tl.int32), axis=0) > 0
    # (the first mismatch; the bonus row when every draft matches)
    stop = tl.min(tl.where(live & ((draft != target) | (j == width - 1)), j, BLOCK), axis=0)
    out = tl.where(j < stop, draft, tl.where(j == stop, target, PLACEHOLDER))
    tl.store(tokens_ptr + b * width + j, tl.where(invalid, INVALID, out), mask=live)
    accepted = tl.where(invalid, width - 1, stop)
    tl.store(accepted_ptr + b, accepted)
    tl.store(last_ptr + b, tl.where(invalid, 0, tl.sum(tl.where(j == stop, target, 0), axis=0)))
    tl.store(next_base_ptr + b, tl.load(base_ptr + b) + accepted + 1)


def accept_chains(argmax: torch.Tensor, drafts: torch.Tensor, base: torch.Tensor,
                  vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor]:
    """``(tokens [batch, k + 1], accepted [batch], last [batch, 1], next_base [batch])``, int64,
    from ``argmax`` (int64 ``[batch * (k + 1)]``, chain after chain), ``drafts`` (int64
    ``[batch, k]``) and ``base`` (int64 ``[batch]``): see the module docstring. One launch on
    CUDA (or under Triton's interpreter), else :func:`accept_chains_reference`."""
    if (not (argmax.is_cuda or _INTERPRETED)
            or not drafts.device == argmax.device == base.device):
        return accept_chains_reference(argmax, drafts, base, vocab_size)
    batch, k = drafts.shape
    drafts = drafts if drafts.stride(1) == 1 else drafts.contiguous()
    tokens = torch.empty((batch, k + 1), dtype=torch.long, device=argmax.device)
    accepted, last, next_base = torch.empty((3, batch), dtype=torch.long, device=argmax.device)
    if batch:
        with torch.cuda.device(argmax.device) if argmax.is_cuda else nullcontext():
            _accept_kernel[(batch,)](argmax.contiguous(), drafts, drafts.stride(0),
                                     base.contiguous(), tokens, accepted, last, next_base,
                                     k + 1, vocab_size, INVALID=INVALID_TOKEN_ID,
                                     PLACEHOLDER=PLACEHOLDER_TOKEN_ID,
                                     BLOCK=triton.next_power_of_2(k + 1))
    return tokens, accepted, last[:, None], next_base


def accept_chains_reference(argmax: torch.Tensor, drafts: torch.Tensor, base: torch.Tensor,
                            vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                      torch.Tensor]:
    """:func:`accept_chains` in PyTorch."""
    batch, k = drafts.shape
    target = argmax.view(batch, k + 1)
    invalid = (target < 0).any(dim=1) | ((drafts < 0) | (drafts >= vocab_size)).any(dim=1)
    match = torch.cat([drafts == target[:, :k],
                       torch.zeros((batch, 1), dtype=torch.bool, device=drafts.device)], dim=1)
    stop = (~match).int().argmax(dim=1)  # [batch] the first mismatch (the bonus row at k)
    columns = torch.arange(k + 1, device=drafts.device)
    padded = torch.cat([drafts, target[:, k:]], dim=1)
    tokens = torch.where(columns < stop[:, None], padded,
                         torch.where(columns == stop[:, None], target, PLACEHOLDER_TOKEN_ID))
    tokens[invalid] = INVALID_TOKEN_ID
    accepted = torch.where(invalid, k, stop)
    last = torch.where(invalid, 0, target.gather(1, stop[:, None])[:, 0])
    return tokens, accepted, last[:, None], base + accepted + 1
