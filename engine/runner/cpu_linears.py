"""The decoder layers' linear maps on CPU in float32 through oneDNN's reordered weights, for steps
of a few rows.

A verification step at batch 1 runs every linear map of the model on k + 1 rows, a small batch
on one row per sequence. MKL's float32 GEMM (what ``nn.Linear`` runs) reads the weight well for
one row but not for a few: on this 2-core CPU (torch 2.13) a forward of the default model's
decoder cost 46 ms for 1 row, 74 ms for 2, 88 ms for 3 and 80 ms for 5. With each weight
reordered once into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, the
kernel of ``torch.ops.mkldnn._linear_pointwise``), the same forwards cost 45, 48 and 50 ms for 2,
3 and 5 rows: verifying drafts costs next to nothing more than decoding. A forward of ``MIN_ROWS``
to ``MAX_ROWS`` rows (batch size x new tokens) runs every decoder ``nn.Linear`` on its reordered
weight; any other forward runs the model unchanged (one row: no faster; 128 rows and more, a
prefill: no faster either). An earlier version packed the weights for MKL's packed GEMM
(``cblas_sgemm_pack``); under torch 2.13 that ran no faster than ``nn.Linear`` (docs/design.md,
"Measured reasons behind the runner's choices").

The reordered copy is oneDNN's, for the weight as it was when reordered (weights changed
afterwards are not seen), and costs memory: +815 MB resident for the default model's 425 MB of
decoder weights. The results differ from
``nn.Linear``'s by float32 rounding only (the order of the sums), as those of one row and of
several already do. Runners over the same weights (the early-exit draft shares the target's
layers) share the copies. Elsewhere (GPU, other dtypes, a PyTorch without oneDNN) nothing is
reordered.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

MIN_ROWS = 2
MAX_ROWS = 64

# id(weight) -> (weight, its reordered copy), shared by every runner over that weight; an entry
# leaves with its weight (tensors compare elementwise, so they cannot be WeakKeyDictionary keys)
_PACKED: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def reordered_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` reordered for :func:`reordered_linear`, one copy per weight (shared
    by every runner over it: the early-exit draft's layers and head are the target's)."""
    key = id(weight)
    entry = _PACKED.get(key)
    if entry is None or entry[0]() is not weight:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())  # blocked layout
        entry = _PACKED[key] = (weakref.ref(weight, lambda _: _PACKED.pop(key, None)), packed)
    return entry[1]


def available() -> bool:
    """This PyTorch has oneDNN's reordered-weight linear."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _packable(module: nn.Module) -> bool:
    """A plain float32 ``nn.Linear`` on CPU whose ``forward`` nobody has replaced (accelerate's
    offloading hooks set an instance ``forward``: that one must stay)."""
    return (type(module) is nn.Linear and module.weight.device.type == "cpu"
            and module.weight.dtype == torch.float32 and "forward" not in module.__dict__
            and not hasattr(module, "_hf_hook"))


def reordered_linear(x: torch.Tensor, packed: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """``x [rows, in] -> [rows, out]`` through a :func:`reordered_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def _packed_forward(packed: torch.Tensor,
                    bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:  # x [..., in_features]
        rows = x.numel() // x.shape[-1]
        out = reordered_linear(x.reshape(rows, x.shape[-1]), packed, bias)  # [rows, out]
        return out.view(*x.shape[:-1], out.shape[-1])

    return forward


class PackedLinears:
    """Every plain float32 CPU ``nn.Linear`` under ``layers``, with its reordered weight;
    empty for ``layers=None`` and where oneDNN is missing. :meth:`use` routes a forward's maps
    through them."""

    def __init__(self, layers: nn.Module | None) -> None:
        self._forwards: list[tuple[nn.Linear, Callable]] = []
        if layers is None or not available():
            return
        with torch.no_grad():
            for module in layers.modules():
                if not _packable(module):
                    continue
                bias = None if module.bias is None else module.bias.detach()
                self._forwards.append((module, _packed_forward(reordered_weight(module.weight),
                                                               bias)))

    def __len__(self) -> int:
        return len(self._forwards)

    @contextmanager
    def use(self, rows: int) -> Iterator[None]:
        """Within the block, a forward of ``rows`` rows runs the reordered maps when ``rows``
        is in ``[MIN_ROWS, MAX_ROWS]`` (an instance ``forward`` on each module, removed after)."""
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
