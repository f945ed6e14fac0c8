"""A batch-invariant linear map: a row's result never depends on how many rows share the call.

Why. cuBLAS chooses its algorithm (tile sizes, split-K, the order of the partial sums) from the
problem's shape, the number of rows ``M`` included, so ``x @ W^T`` rounds a row differently
when it is computed alone (a decode step of one sequence) and among 300 others (a batch, a
verification step, a prefill chunk). For a deterministic mode, where every token's logits must be
bitwise the same whatever else the step computes, the matrix products need a reduction order
per row that depends on nothing but that row, ``W`` and ``b``.

What. :func:`invariant_linear` computes ``y = x W^T + b`` for ``x [..., K]``, ``weight [N, K]``
(``nn.Linear``'s layout), ``bias [N] | None``, returning ``[..., N]`` in ``x``'s dtype. Rules that
make it batch-invariant:

- one tile shape for every ``M``: ``BLOCK_M`` is fixed (64); ``BLOCK_N``, ``BLOCK_K``,
  ``num_warps`` and ``num_stages`` are functions of ``(N, dtype)`` only (:func:`tile_config`),
  never of ``M``, so every row goes through the same ``[BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N]``
  products whatever the batch;
- no split-K: each output element's reduction runs over ``K`` in ascending tiles from 0, one
  ``tl.dot`` per tile accumulated into a float32 accumulator by one program; the bias is added
  in float32 after the whole reduction, then the sum is rounded once to the output dtype;
- one compiled kernel for every ``M``: ``M`` is not specialised by Triton (``do_not_specialize``:
  otherwise ``M = 1`` and ``M`` divisible by 16 compile kernels of their own), the row strides
  are ``K`` and ``N`` (``x`` is copied contiguous, and 16-byte aligned, when it is not: a view's
  stride or alignment would otherwise pick another specialisation);
- float32 products in IEEE float32 (no TF32); bf16 / fp16 tiles go to the tensor cores as they
  are, with float32 accumulation.

The price is speed where cuBLAS would have split ``K``: at a few rows the only parallelism is
over ``N`` (``cdiv(N, BLOCK_N)`` programs), which is why ``BLOCK_N`` shrinks for narrower maps.

Where else it runs. Under Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors: the tests)
a tile's product is float32 products summed over ``K`` row by row instead of ``tl.dot``: the
interpreter's ``tl.dot`` is numpy's BLAS, whose result for a row depends on where the row sits in
the tile on some CPUs (OpenBLAS's Zen kernels: a row of 17 differed from the row alone), and it
multiplies bf16 tiles as raw bits (16-bit products are exact in float32, so nothing else
changes). A bf16 result is rounded to bf16 by its bits there (the interpreter truncates a cast
to bf16; the GPU rounds to nearest).
:func:`invariant_linear_reference` is the PyTorch version, invariant on any device by
construction. :class:`InvariantLinears` routes a model's ``nn.Linear`` maps through either
inside a block.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = ["InvariantLinears", "invariant_linear", "invariant_linear_reference",
           "linear_modules", "tile_config"]

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # (Triton runs CPU tensors too)
BLOCK_M = 64  # rows per program, for every M
GROUP_M = 8  # row blocks that take turns over one band of columns (L2 reuse of W; order only)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def tile_config(n: int, dtype: torch.dtype) -> dict[str, int]:
    """``BLOCK_N``, ``BLOCK_K``, ``num_warps``, ``num_stages`` for a map of ``n`` outputs in
    ``dtype``: never a function of the number of rows. ``BLOCK_N`` is the widest of 128, 64, 32
    that still gives at least 128 column blocks (a GPU's SMs busy at a few rows, where there is
    nothing else to share out), 32 below that; ``BLOCK_K`` 64 for 16-bit tiles, 32 for float32
    (whose IEEE products run on the CUDA cores, and whose tiles are twice the bytes)."""
    block_n = 128 if n >= 128 * 128 else 64 if n >= 128 * 64 else 32
    if dtype == torch.float32:
        return {"BLOCK_N": block_n, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3}
    return {"BLOCK_N": block_n, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4}


@triton.jit
def _round_bf16(x):
    """float32 ``x`` rounded to the nearest bf16 (ties to even), still float32; NaN stays NaN
    (as ``engine.runner.fused_ops``'s rounding: the interpreter truncates a cast to bf16)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit(do_not_specialize=["M"])
def _invariant_linear_kernel(
        x_ptr, w_ptr, b_ptr, out_ptr,  # x [M, K] and out [M, N] contiguous, w [N, K], b [N]
        M, N, K, sw_n, sw_k,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PRECISION: tl.constexpr,
        ROUND_BF16: tl.constexpr, DOT_SUM: tl.constexpr):
    # which (row block, column block): GROUP_M row blocks share a band of columns in turn (the
    # order programs run in; no effect on any value)
    pid = tl.program_id(0)
    blocks_m, blocks_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * blocks_n)
    first_m = group * GROUP_M
    group_m = tl.minimum(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * blocks_n)) % group_m
    pid_n = (pid % (GROUP_M * blocks_n)) // group_m

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    row_ok, col_ok = rows < M, cols < N
    ks = tl.arange(0, BLOCK_K)
    # (64-bit offsets: M * N passes 2**31 for a vocabulary-wide head over a long prefill)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * K  # [BLOCK_M, 1]
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * sw_n  # [1, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):  # (ascending K tiles, one dot each: the row's order)
        k = start + ks
        k_ok = k < K
        a = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)  # [BLOCK_M, BLOCK_K]
        b = tl.load(w_cols + k[:, None] * sw_k, mask=k_ok[:, None] & col_ok[None, :],
                    other=0.0)  # [BLOCK_K, BLOCK_N]
        if DOT_SUM:  # (the interpreter: float32 products, exact for 16-bit tiles, summed
            # over the tile's K row by row)
            acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ROUND_BF16:
        acc = _round_bf16(acc)
    out = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x must be [..., K] and weight [N, K], got x {tuple(x.shape)} and "
                         f"weight {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [N] = [{weight.shape[0]}], got {tuple(bias.shape)}")
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if any(t.dtype != x.dtype for t in tensors) or x.dtype not in _DTYPES:
        raise ValueError(f"x, weight and bias must share one dtype of {_DTYPES}, got "
                         f"{[t.dtype for t in tensors]}")
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"x, weight and bias must be on one device, got "
                         f"{[str(t.device) for t in tensors]}")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x [..., K]`` as ``[M, K]`` with strides ``(K, 1)`` and a 16-byte aligned start (a copy
    when the view is not): one Triton specialisation for every ``M``."""
    k = x.shape[-1]
    rows = x.reshape(x.shape[:-1].numel(), k)
    if rows.stride() != (k, 1) or rows.data_ptr() % 16:
        rows = torch.empty(rows.shape, dtype=x.dtype, device=x.device).copy_(rows)
    return rows


def _on(x: torch.Tensor) -> AbstractContextManager:
    """``x``'s CUDA device made current for the launch (Triton launches on the current one)."""
    if x.device.type == "cuda" and x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return nullcontext()


def invariant_linear(x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] W^T + b`` through the batch-invariant kernel (module docstring): ``weight
    [N, K]``, ``bias [N] | None``, one dtype (float32, bf16 or fp16), one device (CUDA, or CPU
    under ``TRITON_INTERPRET=1``); returns ``[..., N]`` in ``x``'s dtype, accumulated in float32.
    """
    _check(x, weight, bias)
    if x.device.type != "cuda" and not _INTERPRETED:
        raise ValueError("invariant_linear needs CUDA tensors (or TRITON_INTERPRET=1); "
                         "invariant_linear_reference runs anywhere")
    n, k = weight.shape
    rows = _rows(x)  # [M, K]
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)  # [M, N]
    if m and n:
        bias = None if bias is None else bias.contiguous()
        config = tile_config(n, x.dtype)
        block_n = config.pop("BLOCK_N")
        grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, block_n),)
        bf16 = x.dtype == torch.bfloat16
        with _on(x):
            _invariant_linear_kernel[grid](
                rows, weight, weight if bias is None else bias, out, m, n, k, *weight.stride(),
                HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=block_n, GROUP_M=GROUP_M,
                # (tf32 is ignored for 16-bit tiles; float32 tiles stay IEEE)
                PRECISION="ieee" if x.dtype == torch.float32 or _INTERPRETED else "tf32",
                ROUND_BF16=_INTERPRETED and bf16, DOT_SUM=_INTERPRETED, **config)
    return out.view(*x.shape[:-1], n)


def invariant_linear_reference(x: torch.Tensor, weight: torch.Tensor,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`invariant_linear` in PyTorch, on any device: each row of ``x [..., K]`` by an
    ``F.linear`` call of its own on a fresh ``[1, K]`` copy of it, so every row goes through the
    same call (same shape, same alignment: the same BLAS algorithm and reduction order) whatever
    the batch. Slow for many rows (one call per row, each reading the whole weight), and its
    rounding is the library's, not the kernel's (close, not bitwise equal)."""
    _check(x, weight, bias)
    n, k = weight.shape
    rows = x.reshape(x.shape[:-1].numel(), k)  # [M, K]
    out = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)  # [M, N]
    for i in range(rows.shape[0]):
        out[i] = F.linear(rows[i:i + 1].clone(), weight, bias)[0]
    return out.view(*x.shape[:-1], n)


# ---- routing a model's maps ---------------------------------------------------------------------

def linear_modules(model: nn.Module) -> list[nn.Linear]:
    """Every plain ``nn.Linear`` of ``model`` (its decoder layers' maps and an ``nn.Linear``
    output head), each once; subclasses (quantised maps) and tensor-parallel shards (DTensor
    weights) are left out."""
    seen: set[int] = set()
    found = []
    for module in model.modules():
        if (type(module) is nn.Linear and id(module) not in seen
                and not isinstance(module.weight, DTensor)):
            seen.add(id(module))
            found.append(module)
    return found


def _runs_kernel(x: torch.Tensor, module: nn.Linear) -> bool:
    """Whether :func:`invariant_linear` takes this call: one device, CUDA (or the
    interpreter), one supported dtype."""
    tensors = [x, module.weight] + ([] if module.bias is None else [module.bias])
    return ((x.device.type == "cuda" or _INTERPRETED) and x.dtype in _DTYPES
            and all(t.device == x.device and t.dtype == x.dtype for t in tensors))


def _invariant_forward(module: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:  # x [..., in_features]
        run = invariant_linear if _runs_kernel(x, module) else invariant_linear_reference
        return run(x, module.weight, module.bias)

    return forward


class InvariantLinears:
    """``modules`` (plain ``nn.Linear``s whose ``forward`` nobody has replaced, e.g. from
    :func:`linear_modules`); :meth:`use` makes their forwards batch-invariant in a block."""

    def __init__(self, modules: list[nn.Linear]) -> None:
        for module in modules:
            if type(module) is not nn.Linear or "forward" in module.__dict__:
                raise ValueError(f"InvariantLinears takes plain nn.Linear modules with their "
                                 f"own forward, got {module!r}")
        self.modules = list(modules)

    def __len__(self) -> int:
        return len(self.modules)

    @contextmanager
    def use(self) -> Iterator[None]:
        """Within the block, each module's forward is :func:`invariant_linear` where the tensors
        can run it (CUDA, or the interpreter), :func:`invariant_linear_reference` elsewhere (an
        instance ``forward``; whatever instance forward was there before is put back after)."""
        before = [module.__dict__.get("forward") for module in self.modules]
        for module in self.modules:
            module.__dict__["forward"] = _invariant_forward(module)
        try:
            yield
        finally:
            for module, forward in zip(self.modules, before, strict=True):
                if forward is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.__dict__["forward"] = forward
