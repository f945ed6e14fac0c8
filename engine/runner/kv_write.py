"""A layer's new keys and values written into its pool in one launch.

Why. ``PagedKVCache.update`` wrote keys and values as two ``index_copy_`` calls, each after a
reshaping copy of the layer's ``[batch_size, heads, num_new, head_dim]`` states into the pool's
heads-first order: four kernels a layer at every batch larger than one, two on the one-sequence
path. A decode step of a small batch is bound by its number of kernels (docs/design.md, "Measured
reasons behind the runner's choices"); this kernel reads the states where they are (any strides:
the stacked projections' values are strided views, :mod:`engine.runner.fused_projections`) and
writes both into their pool rows, one launch a layer.

What. Row ``r = b * num_new + t`` of the step goes to pool row ``rows[r]``: ``pool[0, 0, h,
rows[r]] = keys[b, h, t]`` and ``pool[1, 0, h, rows[r]] = values[b, h, t]`` for every head ``h``.
A copy: the pool holds exactly the states (:func:`write_kv_reference` is the ``index_copy_``
form it replaces). Padding rows all write the scratch row, which is never read unmasked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["can_write", "write_kv", "write_kv_reference"]


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, rows_ptr, pool_ptr, num_new, heads,
                     ks_b, ks_h, ks_t, vs_b, vs_h, vs_t, pool_kv, pool_h,
                     HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)  # one new token's row of the step
    h = tl.program_id(1)
    b = r // num_new
    t = r % num_new
    d = tl.arange(0, BLOCK)
    live = d < HEAD_DIM
    row = tl.load(rows_ptr + r)
    out = pool_ptr + h.to(tl.int64) * pool_h + row * HEAD_DIM + d  # (int64: large pools)
    key = tl.load(k_ptr + b * ks_b + h * ks_h + t * ks_t + d, mask=live)
    value = tl.load(v_ptr + b * vs_b + h * vs_h + t * vs_t + d, mask=live)
    tl.store(out, key, mask=live)
    tl.store(out + pool_kv, value, mask=live)


def write_kv(pool: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
             rows: torch.Tensor) -> None:
    """Write ``keys``/``values [batch_size, heads, num_new, head_dim]`` (last dimension
    contiguous) into ``pool [2, 1, heads, num_rows, head_dim]`` (contiguous) at pool rows ``rows
    [batch_size * num_new]`` (int64, batch then token order), in one launch."""
    batch_size, heads, num_new, head_dim = keys.shape
    if keys.numel() == 0:
        return
    _write_kv_kernel[(batch_size * num_new, heads)](
        keys, values, rows, pool, num_new, heads,
        keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        pool.stride(0), pool.stride(2), HEAD_DIM=head_dim,
        BLOCK=triton.next_power_of_2(head_dim))


def write_kv_reference(pool: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       rows: torch.Tensor) -> None:
    """:func:`write_kv` in PyTorch: two ``index_copy_`` calls after heads-first reshapes."""
    batch_size, heads, num_new, head_dim = keys.shape
    n = batch_size * num_new
    pool[0, 0].index_copy_(1, rows, keys.transpose(0, 1).reshape(heads, n, head_dim))
    pool[1, 0].index_copy_(1, rows, values.transpose(0, 1).reshape(heads, n, head_dim))


def can_write(pool: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether :func:`write_kv` takes these: the current CUDA device (Triton launches there), one
    dtype, a contiguous pool, each state's last dimension contiguous."""
    return (pool.device.type == "cuda" and keys.device == values.device == pool.device
            and pool.device.index == torch.cuda.current_device()
            and keys.dtype == values.dtype == pool.dtype and pool.is_contiguous()
            and keys.stride(-1) == values.stride(-1) == 1 and keys.shape == values.shape)
