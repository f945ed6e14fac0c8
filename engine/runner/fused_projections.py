"""One matrix product where a decoder layer runs several on one input: the attention's query, key
and value projections, and a gated MLP's gate and up projections (then SiLU-and-multiply in one
kernel, :func:`engine.runner.fused_ops.silu_mul`).

Why. A decode step of a small batch is bound by its number of kernels (docs/design.md,
"Measured reasons behind the runner's choices"): at batch 1 a key or value projection reads a
few megabytes in a launch that costs as much as the query's. Stacked, the three read the same
bytes in one launch, and the MLP's gate and up in one more; SiLU and the product are one kernel
instead of two. Four launches fewer a layer.

How. :func:`install_fused_projections` stacks each group's weights ``[sum of out_features,
in_features]`` into one tensor and makes every member's ``weight`` (and bias) a view of its rows,
so the model's memory does not grow and transformers' own code, outside the runner, computes what
it did. Then, only inside a runner forward (:func:`engine.runner.fused_ops.fused_forward` with
``projections``):

- the MLP's forward is ``down_proj(silu_mul(x @ stacked^T))``, where the module computes exactly
  ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU: checked on its own weights against
  its own forward before anything changes (any other activation or form keeps its code);
- the query projection computes all three and keeps the key and value parts; the key and value
  projections called next on the same tensor (``is``) return them. Called on anything else, each
  computes its own product, so a call order other than transformers' (q, k, v on one input)
  costs speed, never a wrong value.

A group whose views were broken since (the model moved with ``.to()``, which copies each
parameter alone) runs unfused until a runner installs it again. Only exact ``nn.Linear``
members on one device, with no forward of their own (accelerate's hooks) and no ``DTensor``
(tensor parallel), are stacked. The products' values are the unfused ones up to the matrix
kernel's summation order (cuBLAS may tile a wider product differently); the plain and the
speculative engine both run the fused form, so greedy speculation stays exact.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from engine.runner.fused_ops import projections_active, runs_here, silu_mul
from engine.runner.gemv import linear, module_product

__all__ = ["install_fused_projections", "remove_fused_projections"]

_GROUP = "_specdec_projections"  # the owning module's Stacked


@dataclass
class Stacked:
    """A group's stacked ``weight [sum(sizes), in_features]`` (and ``bias [sum(sizes)]``), its
    members whose parameters are views of its rows, and (attention) the outputs a first call
    left for the members after it: ``(input, {k_proj: key, v_proj: value})``."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    members: tuple[nn.Linear, ...]
    sizes: tuple[int, ...]
    left: tuple[torch.Tensor, dict[nn.Linear, torch.Tensor]] | None = field(default=None,
                                                                           repr=False)

    def intact(self) -> bool:
        """Every member's parameters are still the views made at installation."""
        offset = 0
        for member, size in zip(self.members, self.sizes, strict=True):
            if (member.weight.data_ptr() != self.weight[offset].data_ptr()
                    or self.bias is not None
                    and member.bias.data_ptr() != self.bias[offset].data_ptr()):
                return False
            offset += size
        return True

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in_features]`` times the stacked weight: ``[..., sum(sizes)]``."""
        return linear(x, self.weight, self.bias)  # (a few rows: engine/runner/gemv.py)


def _stackable(linears: list[object]) -> bool:
    first = linears[0]
    return all(type(m) is nn.Linear and "forward" not in m.__dict__
               and not isinstance(m.weight, DTensor) and m.weight.device == first.weight.device
               and m.weight.dtype == first.weight.dtype
               and m.in_features == first.in_features
               and (m.bias is None) == (first.bias is None) for m in linears)


@torch.no_grad()
def _stack(linears: tuple[nn.Linear, ...]) -> Stacked:
    """The members' weights (and biases) copied into one tensor, each member's now a view."""
    sizes = tuple(m.out_features for m in linears)
    weight = torch.cat([m.weight for m in linears])  # [sum(sizes), in_features]
    bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
    offset = 0
    for member, size in zip(linears, sizes, strict=True):
        member.weight.data = weight[offset:offset + size]
        if bias is not None:
            member.bias.data = bias[offset:offset + size]
        offset += size
    return Stacked(weight, bias, linears, sizes)


# ---- the gated MLP ------------------------------------------------------------------------------

def _fused_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    group: Stacked = getattr(self, _GROUP)
    if projections_active() and group.intact() and runs_here(x, group.weight):
        return module_product(self.down_proj, silu_mul(group.product(x)))  # [..., hidden]
    return type(self).forward(self, x)


@torch.no_grad()
def _is_silu_gated(module: nn.Module, group: Stacked) -> bool:
    """``module(x)`` is ``down_proj(silu(gate_proj(x)) * up_proj(x))`` on its own weights,
    within the products' rounding (another activation or form is far off)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    weight = group.weight
    x = torch.randn(8, weight.shape[1], generator=gen).to(weight.device, weight.dtype)
    try:
        want = type(module).forward(module, x).float()
        if not runs_here(x, weight):
            return False
        got = module.down_proj(silu_mul(group.product(x))).float()
    except Exception:  # (a module that cannot take this input keeps its own forward)
        return False
    scale = want.abs().max().clamp_min(1e-6)
    return got.shape == want.shape and bool((got - want).abs().max() <= 0.02 * scale)


# ---- the attention's q, k, v ---------------------------------------------------------------------

def _first_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    group: Stacked = self._specdec_stacked
    if projections_active() and group.intact() and runs_here(x, group.weight):
        parts = group.product(x).split(group.sizes, dim=-1)  # each [..., size] (a view)
        group.left = (x, dict(zip(group.members[1:], parts[1:], strict=True)))
        return parts[0]
    group.left = None
    return nn.Linear.forward(self, x)


def _later_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    group: Stacked = self._specdec_stacked
    left = group.left
    part = left[1].pop(self, None) if left is not None and left[0] is x else None
    if left is not None and not left[1]:
        group.left = None  # (nothing kept alive past the layer)
    return nn.Linear.forward(self, x) if part is None else part


# ---- installation -------------------------------------------------------------------------------

def install_fused_projections(model: nn.Module) -> dict[str, int]:
    """Stack each attention's q/k/v and each SiLU-gated MLP's gate/up (see the module docstring);
    returns how many of each were taken. A group stacked before and still intact is counted
    again; one broken since is stacked anew."""
    taken = {"qkv": 0, "gate_up": 0}
    for module in model.modules():
        own = module.__dict__.get("forward")
        linears = [getattr(module, name, None) for name in ("q_proj", "k_proj", "v_proj")]
        if all(isinstance(m, nn.Linear) for m in linears):
            group = getattr(module, _GROUP, None)
            if group is None and not _stackable(linears):
                continue
            if group is None or not group.intact():
                group = _stack(tuple(linears))
                setattr(module, _GROUP, group)
                for i, member in enumerate(linears):
                    member._specdec_stacked = group
                    member.forward = types.MethodType(_first_forward if i == 0
                                                      else _later_forward, member)
            taken["qkv"] += 1
            continue
        linears = [getattr(module, name, None) for name in ("gate_proj", "up_proj")]
        if not (all(isinstance(m, nn.Linear) for m in linears)
                and isinstance(getattr(module, "down_proj", None), nn.Module)):
            continue
        group = getattr(module, _GROUP, None)
        if group is not None and getattr(own, "__func__", None) is _fused_mlp_forward:
            if not group.intact():
                setattr(module, _GROUP, _stack(group.members))
            taken["gate_up"] += 1
            continue
        if own is not None or not _stackable(linears):  # (accelerate's hooks: left alone)
            continue
        # (checked with a stacked copy before the members' weights become its views)
        with torch.no_grad():
            trial = Stacked(torch.cat([m.weight for m in linears]),
                            None if linears[0].bias is None
                            else torch.cat([m.bias for m in linears]),
                            tuple(linears), tuple(m.out_features for m in linears))
        if not _is_silu_gated(module, trial):
            continue
        del trial
        setattr(module, _GROUP, _stack(tuple(linears)))
        module.forward = types.MethodType(_fused_mlp_forward, module)
        taken["gate_up"] += 1
    return taken


def remove_fused_projections(model: nn.Module) -> None:
    """Give every member its plain forward back (the parameters stay views: same values), for
    an engine whose products must be its own, one ``nn.Linear`` each (deterministic mode's
    batch-invariant maps, the CPU's packed ones) on a model an earlier runner stacked."""
    for module in model.modules():
        group = module.__dict__.pop(_GROUP, None)
        if group is None:
            continue
        if getattr(module.__dict__.get("forward"), "__func__", None) is _fused_mlp_forward:
            del module.forward
        for member in group.members:
            if getattr(member.__dict__.get("forward"), "__func__", None) in (_first_forward,
                                                                              _later_forward):
                del member.forward
            member.__dict__.pop("_specdec_stacked", None)
