"""A tensor-parallel output head without DTensor on the step's path.

Transformers' plan splits the output head by vocabulary rows (``colwise_gather_output``): each
rank computes its share of the logits and the plan gathers them through DTensor (``from_local``,
``redistribute``, ``to_local``) on every forward. The runner calls the head eagerly after each
replayed step, so that wrapping's host time lies on every step's critical path (docs/design.md,
"Measured reasons behind the runner's choices"). :func:`gathered_head` computes the same
thing from the local share of the weight with one ``all_gather_into_tensor``: the same matrix
product and the same collective, without the wrapping.

It is used only where it gives exactly what the plan's head gives: checked once, on a probe of
random hidden states, when the runner is built (a collective: every rank builds its runner at
the same point). A head split otherwise (a bias, uneven shares, another placement) keeps the
plan's own forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard

__all__ = ["gathered_head"]


def _local_rows(head: nn.Module, world: int) -> torch.Tensor | None:
    """This rank's ``[vocab / world, hidden]`` rows of the head's weight, or None if the head is
    not split evenly by rows without a bias."""
    weight = getattr(head, "weight", None)
    if not isinstance(head, nn.Linear) or getattr(head, "bias", None) is not None:
        return None
    if not isinstance(weight, DTensor) or tuple(weight.placements) != (Shard(0),):
        return None
    if weight.device_mesh.ndim != 1 or weight.device_mesh.size() != world:
        return None
    local = weight.to_local()
    if local.shape[0] * world != weight.shape[0]:
        return None
    return local


@torch.no_grad()
def gathered_head(head: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``hidden [n, hidden_size] -> logits [n, vocab]`` computed as ``head`` computes them, from
    this rank's rows and one all-gather; None where that is not what ``head`` does (see the
    module docstring). Every rank of the default group calls it at the same point."""
    world = dist.get_world_size()
    local = _local_rows(head, world)
    device = next(head.parameters()).device  # (the default group's: NCCL takes device tensors)
    if not _everywhere(local is not None, device):
        return None

    group = head.weight.device_mesh.get_group()  # (the ranks in the weight's shard order)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        part = F.linear(hidden, local)  # [n, vocab / world]
        n, share = part.shape
        shares = torch.empty((world * n, share), dtype=part.dtype,
                             device=part.device)  # [world * n, vocab / world], rank by rank
        dist.all_gather_into_tensor(shares, part.contiguous(), group=group)
        return shares.view(world, n, share).permute(1, 0, 2).reshape(n, world * share)

    gen = torch.Generator(device="cpu").manual_seed(0)
    probe = torch.randn(3, local.shape[1], generator=gen).to(local.device, local.dtype)
    fast, plan = forward(probe), head(probe)
    try:  # (a head whose forward returned something else than a plain tensor: not ours)
        same = torch.equal(fast, plan)
    except (TypeError, RuntimeError):
        same = False
    return forward if _everywhere(same, device) else None


def _everywhere(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on every rank (an all-reduce of the minimum)."""
    verdict = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    return bool(verdict.item())
