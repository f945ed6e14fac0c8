"""The decoder layers' linear maps on CPU in float32 through MKL's packed GEMM, for steps of
a few rows.

A verification step at batch 1 runs every linear map of the model on k + 1 rows. MKL's float32 GEMM
(what ``nn.Linear`` runs) handles 4 rows or more by repacking the weight on every call. With each
weight packed once (``cblas_sgemm_pack``, reached through ``torch.ops.mkl``) a forward of
``MIN_ROWS`` to ``MAX_ROWS`` rows (batch size x new tokens) runs every decoder ``nn.Linear`` on
the packed weight, and any other forward runs the model unchanged.

The packed format is MKL's, for the weight as it was when packed (weights changed afterwards are
not seen). It costs memory: MKL pads the small maps' packed copies, so a runner holds more than
its weights again. Packing only the MLP's maps would cost less memory but keep less than half of
the gain. The measurements: docs/design.md, "Measured reasons behind the runner's choices".
One packed copy serves every row count (``_mkl_linear`` is told the true row count, so it never
falls back to the plain weight); the results differ from ``nn.Linear``'s by float32 rounding only,
as those of one row and of several already do. Runners over the same weights (the early-exit draft
shares the target's layers) share the packed copies. Elsewhere (GPU, other dtypes, a PyTorch
without MKL's packed GEMM) nothing is packed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

MIN_ROWS = 4
MAX_ROWS = 128

# id(weight) -> (weight, its MKL-packed copy), shared by every runner over that weight; an entry
# leaves with its weight (tensors compare elementwise, so they cannot be WeakKeyDictionary keys)
_PACKED: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    key = id(weight)
    entry = _PACKED.get(key)
    if entry is None or entry[0]() is not weight:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(
            weight.detach(), MIN_ROWS)  # (the row count only tunes MKL's packing)
        entry = _PACKED[key] = (weakref.ref(weight, lambda _: _PACKED.pop(key, None)), packed)
    return entry[1]


def _packable(module: nn.Module) -> bool:
    """A plain float32 ``nn.Linear`` on CPU whose ``forward`` nobody has replaced (accelerate's
    offloading hooks set an instance ``forward``: that one must stay)."""
    return (type(module) is nn.Linear and module.weight.device.type == "cpu"
            and module.weight.dtype == torch.float32 and "forward" not in module.__dict__
            and not hasattr(module, "_hf_hook"))


def _packed_forward(weight: torch.Tensor, packed: torch.Tensor,
                    bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:  # x [..., in_features]
        rows = x.numel() // x.shape[-1]
        out = torch.ops.mkl._mkl_linear(x.reshape(rows, x.shape[-1]), packed, weight, bias,
                                        rows)  # [rows, out_features]
        return out.view(*x.shape[:-1], out.shape[-1])

    return forward


class PackedLinears:
    """Every plain float32 CPU ``nn.Linear`` under ``layers``, with its packed weight; empty
    for ``layers=None`` and where MKL's packed GEMM is missing. :meth:`use` routes a forward's
    maps through them."""

    def __init__(self, layers: nn.Module | None) -> None:
        self._forwards: list[tuple[nn.Linear, Callable]] = []
        if layers is None or not (torch.backends.mkl.is_available()
                                  and hasattr(torch.ops.mkl, "_mkl_linear")):
            return
        with torch.no_grad():
            for module in layers.modules():
                if not _packable(module):
                    continue
                bias = None if module.bias is None else module.bias.detach()
                self._forwards.append((module, _packed_forward(
                    module.weight.detach(), _packed_weight(module.weight), bias)))

    def __len__(self) -> int:
        return len(self._forwards)

    @contextmanager
    def use(self, rows: int) -> Iterator[None]:
        """Within the block, a forward of ``rows`` rows runs the packed maps when ``rows`` is
        in ``[MIN_ROWS, MAX_ROWS]`` (an instance ``forward`` on each module, removed after)."""
        if not self._forwards or not MIN_ROWS <= rows <= MAX_ROWS:
            yield
            return
        for module, forward in self._forwards:
            module.__dict__["forward"] = forward
        try:
            yield
        finally:
            for module, _ in self._forwards:
                module.__dict__.pop("forward", None)
