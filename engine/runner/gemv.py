"""Matrix products of one row (a batch-1 decode step), or a few rows of a small weight, in one
Triton launch of many small programs, instead of cuBLAS.

Why. A decode step of a small model at batch 1 is bound by its kernels, and its four matrix
products a layer (stacked q/k/v, the attention's output, stacked gate/up, down) are most of
their time. cuBLAS tiles for many rows; one row is a matrix-vector product bound by how many
weight bytes are in flight, so here each program reads two weight rows whole (up to 2,048
columns in one load, a loop past that) and every program's loads go out at once: about half
cuBLAS's time a product for the default model's weights, and a batch-1 step 1.26x as fast
(docs/design.md, "Measured reasons behind the runner's choices").

What. ``linear(x, weight, bias)`` is ``torch.nn.functional.linear`` for ``x [..., K]`` and a
contiguous ``weight [N, K]``; it takes this kernel where ``x`` holds one row of bf16 or fp16 on
CUDA (the weight's dtype too) and there is no bias, or up to ``GEMV_MAX_ROWS`` rows of a weight
of at most ``GEMV_MANY_ROWS_ELEMENTS`` elements; cuBLAS otherwise. Each row is a pass of its
own over the weight (the same bits at any row count), so the time grows with the rows: past one
row the kernel stays ahead of cuBLAS only for small weights (the same measurements). An output
is the float32 sum of the row's products rounded once to the dtype, as cuBLAS rounds (in
another order: the last bit may differ). Only inside a runner forward with stacked products
(:func:`engine.runner.fused_ops.projections_active`), which deterministic mode and tensor
parallelism leave off. :func:`gemv_reference` is the kernel's check under the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn
from torch.distributed.tensor import DTensor

from engine.runner.fused_ops import _INTERPRETED, _on, projections_active

__all__ = ["GEMV_MANY_ROWS_ELEMENTS", "GEMV_MAX_ROWS", "gemv", "gemv_reference", "linear",
           "module_product"]

GEMV_MAX_ROWS = 4  # rows the kernel takes ...
GEMV_MANY_ROWS_ELEMENTS = 1 << 20  # ... past one row only for weights of at most this many
_BLOCK_N = 2  # weight rows a program (the probe's fastest at every shape)
_MAX_BLOCK_K = 2048  # columns a load


# (the rows a compile-time constant, the strides specialised: each row count of a weight shape
# compiles once, where a step first verifies that many tokens. Made run-time values they stopped
# those compiles and batch-1 plain decoding read slower: kept as measured; docs/performance.md,
# "One-off costs inside timed runs")
@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, n_out, n_in, x_stride, y_stride, ROWS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Outputs ``[ROWS, BLOCK_N]`` of weight rows ``pid * BLOCK_N ...``: ``y[m, n] = sum_k
    x[m, k] * w[n, k]`` in float32. Each row is its own pass over the weight tile (the rows
    after the first read it from the cache), so a row's sum is the same code, and the same
    bits, at any row count."""
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    live_n = n < n_out
    for m in tl.static_range(ROWS):
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, n_in, BLOCK_K):
            live_k = k0 + k < n_in
            w = tl.load(w_ptr + n[:, None] * n_in + (k0 + k)[None, :],
                        mask=live_n[:, None] & live_k[None, :], other=0.0)
            x = tl.load(x_ptr + m * x_stride + k0 + k, mask=live_k, other=0.0)
            acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(y_ptr + m * y_stride + n, acc.to(y_ptr.dtype.element_ty), mask=live_n)


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ weight [N, K]^T`` -> ``[..., N]`` in ``x``'s dtype, in one launch (on CUDA
    or under Triton's interpreter; :func:`gemv_reference` elsewhere); at most
    ``GEMV_MAX_ROWS`` rows, ``weight`` contiguous."""
    n_out, n_in = weight.shape
    rows = x.reshape(-1, n_in)  # [m, K]
    m = rows.shape[0]
    if not (x.device.type == "cuda" or _INTERPRETED) or m > GEMV_MAX_ROWS or not m:
        return gemv_reference(x, weight)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((m, n_out), dtype=x.dtype, device=x.device)  # [m, N]
    with _on(x):
        _gemv_kernel[(triton.cdiv(n_out, _BLOCK_N),)](
            rows, weight, out, n_out, n_in, rows.stride(0), out.stride(0),
            ROWS=m, BLOCK_N=_BLOCK_N,
            BLOCK_K=min(triton.next_power_of_2(n_in), _MAX_BLOCK_K), num_warps=4)
    return out.view(*x.shape[:-1], n_out)


def gemv_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:func:`gemv` in PyTorch: the float32 product rounded once to ``x``'s dtype."""
    return (x.float() @ weight.float().t()).to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``nn.functional.linear(x, weight, bias)``, through :func:`gemv` where it pays (see the
    module docstring)."""
    if (bias is None and x.device.type == "cuda" and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.device == x.device
            and weight.is_contiguous() and 0 < x.numel()):
        rows = x.numel() // x.shape[-1]
        if rows == 1 or (rows <= GEMV_MAX_ROWS and weight.numel() <= GEMV_MANY_ROWS_ELEMENTS):
            return gemv(x, weight)
    return nn.functional.linear(x, weight, bias)


def module_product(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``; an exact ``nn.Linear`` with no forward of its own (no hooks, no tensor
    parallel weight) inside a runner forward with stacked products takes :func:`linear`."""
    if (projections_active() and type(module) is nn.Linear and "forward" not in module.__dict__
            and not module._forward_hooks and not module._forward_pre_hooks
            and not isinstance(module.weight, DTensor)):
        return linear(x, module.weight, module.bias)
    return module(x)
