"""A layer's rotary embedding and its key/value write into the pool, in one launch.

Why. A decode step of a small batch is bound by its number of kernels (docs/design.md,
"Measured reasons behind the runner's choices"). After the fused rotary
(:func:`engine.runner.fused_ops.rotary`, one launch for the queries and keys) the paged cache's
``update`` wrote the rotated keys and the values in a second launch
(:func:`engine.runner.kv_write.write_kv`). Here one launch does both: its first programs rotate
the queries into a new tensor, the others rotate the keys and write them, with the values, to
their pool rows. The rotated keys exist only in the pool, which is what paged attention reads.

What. ``q_out`` is :func:`~engine.runner.fused_ops.rotary`'s query output, and the pool's rows
``rows`` hold its key output and the values as :func:`~engine.runner.kv_write.write_kv` writes
them: the same arithmetic, so the same bits (:func:`rotary_write_reference` composes the two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runner.fused_ops import (
    RotaryLaunch,
    _on,
    _rotate_rows,
    _rotated,
    _rounding,
    rotary_reference,
)
from engine.runner.kv_write import write_kv_reference

__all__ = ["rotary_write", "rotary_write_reference"]


@triton.jit
def _rotate_write_rows(k_ptr, v_ptr, rows_ptr, pool_ptr, block, count, heads, seq,
                       ks_b, ks_h, ks_s, vs_b, vs_h, vs_s, pool_kv, pool_h, cos_ptr, sin_ptr,
                       cs_b, cs_s, TO: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
                       ROWS: tl.constexpr):
    """Key rows ``block * ROWS ...`` (of ``count``; a row is a (batch, kv head, position))
    rotated into the pool, and the same rows of the values copied there: row ``(b, h, s)`` goes
    to pool row ``rows[b * seq + s]`` of head ``h``."""
    b, h, s, i, live, first, second = _rotated(k_ptr, ks_b, ks_h, ks_s, cos_ptr, sin_ptr, cs_b,
                                               cs_s, block, count, heads, seq, TO, HALF, BLOCK,
                                               ROWS)
    v_row = (v_ptr + b * vs_b + h * vs_h + s * vs_s)[:, None] + i[None, :]
    # (the pool rows; a row past count, r = (b * heads + h) * seq + s, reads none)
    row = tl.load(rows_ptr + b * seq + s, mask=(b * heads + h) * seq + s < count, other=0)
    # (int64: a layer's pool may pass 2**31 elements)
    out = (pool_ptr + h.to(tl.int64) * pool_h + row * (2 * HALF))[:, None] + i[None, :]
    ty = pool_ptr.dtype.element_ty
    tl.store(out, first.to(ty), mask=live)
    tl.store(out + HALF, second.to(ty), mask=live)
    tl.store(out + pool_kv, tl.load(v_row, mask=live, other=0.0), mask=live)
    tl.store(out + pool_kv + HALF, tl.load(v_row + HALF, mask=live, other=0.0), mask=live)


@triton.jit
def _rotary_write_kernel(q_ptr, k_ptr, v_ptr, qo_ptr, rows_ptr, pool_ptr, cos_ptr, sin_ptr,
                         q_rows, k_rows, q_heads, k_heads, seq, qs_b, qs_h, qs_s, ks_b, ks_h,
                         ks_s, vs_b, vs_h, vs_s, qos_b, qos_h, qos_s, pool_kv, pool_h, cs_b,
                         cs_s, TO: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
                         ROWS: tl.constexpr):
    pid = tl.program_id(0)  # the queries' row blocks, then the keys'
    q_blocks = tl.cdiv(q_rows, ROWS)
    if pid < q_blocks:
        _rotate_rows(q_ptr, qo_ptr, pid, q_rows, q_heads, seq, qs_b, qs_h, qs_s, qos_b, qos_h,
                     qos_s, cos_ptr, sin_ptr, cs_b, cs_s, TO, HALF, BLOCK, ROWS)
    else:
        _rotate_write_rows(k_ptr, v_ptr, rows_ptr, pool_ptr, pid - q_blocks, k_rows, k_heads,
                           seq, ks_b, ks_h, ks_s, vs_b, vs_h, vs_s, pool_kv, pool_h, cos_ptr,
                           sin_ptr, cs_b, cs_s, TO, HALF, BLOCK, ROWS)


def rotary_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rotate ``q [batch, heads, seq, head_dim]`` and ``k [batch, kv_heads, seq, head_dim]`` by
    ``cos``/``sin [batch or 1, seq, head_dim]`` (transformers' LLaMA ``apply_rotary_pos_emb``,
    every last dimension contiguous, one dtype), write the rotated keys and ``v`` (``k``'s
    shape) into ``pool [2, 1, kv_heads, num_rows, head_dim]`` (contiguous, that dtype) at pool
    rows ``rows [batch * seq]`` (int64, batch then position order), in one launch; returns the
    rotated queries (``q``'s memory layout, as :func:`~engine.runner.fused_ops.rotary`)."""
    q_out = torch.empty_like(q)
    launch = RotaryLaunch.of(q, k, cos)
    if launch.grid[0]:
        with _on(q):
            _rotary_write_kernel[launch.grid](
                q, k, v, q_out, rows, pool, cos, sin, launch.q_rows, launch.k_rows, q.shape[1],
                k.shape[1], q.shape[2], *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                *q_out.stride()[:3], pool.stride(0), pool.stride(2), launch.cos_b,
                cos.stride(1), TO=_rounding(q.dtype), HALF=q.shape[3] // 2, BLOCK=launch.block,
                ROWS=launch.rows)
    return q_out


def rotary_write_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor, pool: torch.Tensor,
                           rows: torch.Tensor) -> torch.Tensor:
    """:func:`rotary_write` in PyTorch: transformers' rotary, then the pool write (its
    ``index_copy_`` form)."""
    q_out, k_out = rotary_reference(q, k, cos, sin)
    write_kv_reference(pool, k_out, v, rows)
    return q_out
