"""Attention that reads the token-granular KV pool in place: a Triton kernel and its reference.

What it computes. For queries ``q [batch, heads, num_new, head_dim]`` of one layer, that layer's
pool ``keys``/``values [kv_heads, num_rows, head_dim]``, the slot table ``[num_slots,
table_width]`` (column ``j`` of row ``s``: the pool row of slot ``s``'s token at position
``j``), the step's ``slots [batch]`` and the layout's ``limits``/``ancestors [batch, num_new]``
(:mod:`engine.runner.step_inputs`), query token ``t`` of row ``b`` and head ``h`` attends to key
column ``j`` of slot ``slots[b]`` iff ``j <= limits[b, t]``, or ``j - limits[b, t] - 1 = i`` for
some ``i`` in ``[0, 64)`` whose bit is set in ``ancestors[b, t]`` (a draft tree's nodes sit in
the columns right after the last column before the tree; a chain token has no bits and its
limit is its own position). Head ``h`` reads key/value head ``h // (heads // kv_heads)``. The
output is ``softmax(scale * q k^T) v`` over the visible columns, in float32, returned as
``[batch, num_new, heads, head_dim]`` (the layout transformers' attention functions return) in
``q``'s dtype. Every row sees column 0 at least (a limit is never negative), so no row is empty.

Why. The gather backend (:mod:`engine.runner.kv_cache`) copies every sequence's cached keys and
values out of the pool in every layer, padded to the batch's longest sequence, and SDPA then
reads the copy again with a 4-D mask: three passes over the batch's KV, the padding included.
This kernel reads each cached key and value once, where it lies, and only up to each row's own
last visible column.

How (one program per (row ``b``, kv head, block of folded query rows, split)). A kv head's
``groups = heads // kv_heads`` query heads and the ``num_new`` queries are folded into one M
block of ``groups * num_new`` rows (row ``r = g * num_new + t``: head ``kv_head * groups + g``,
token ``t``), so each key/value tile is loaded once for the whole group. The program reads its
rows' limits and ancestor bits, computes the last visible column ``max_t(limit + bit_length(
ancestors))`` on the device, and loops over key blocks up to it: no host synchronisation and no
shape that depends on the key length, so a CUDA graph captured once replays for any lengths up
to the table's width. Each block's pool rows come from the slot table; the softmax is online
(running max and sum, base 2) in float32.

Split-K (flash-decoding). A decode step of a small batch has ``batch * kv_heads`` programs, too
few to fill a GPU of ~132 SMs, and each walks its whole key range one block after another, a
chain of dependent loads even at a few hundred keys (docs/design.md, "Measured reasons behind
the runner's choices"). With ``num_splits > 1`` each program takes one of ``num_splits`` equal
shares of its key blocks and writes a normalised partial output and its log-sum-exp (base 2;
``-inf`` for a share with no visible column); a second kernel combines the shares. The count,
the key block (64 or 128 columns) and whether each block's pool rows are loaded a block ahead
(``PREFETCH``) are chosen on the host (:func:`split_plan`) from the step's sizes, which are
static per CUDA-graph bucket.

Chain order (deterministic mode). A token's result depends on where its visible keys sit among
the column blocks: the products and sums of a block run over its columns in a fixed tree, and
columns it cannot see add exact zeros there but move the others. A chain token at depth ``d``
sees columns ``0 .. limit + d``; a draft-tree node at that depth sees the context and its
ancestors' columns, which lie elsewhere (nodes are laid out breadth first). With
``chain_order`` each program takes one token, and its ``i``-th key after its limit is read from
its ``i``-th ancestor (depth order): the node's keys then sit exactly where a chain token's
would, and with one split and one tile height for every step, a token's output depends only on
its context, never on the step around it.

Compiled variants. Triton compiles a kernel per value of its constexprs (the tile height
``BLOCK_M``, the split count, the key block, loading ahead, chain order) and, unless told
otherwise, per class of its integer arguments (1, a multiple of 16, other) and of its pointers'
alignment (16 bytes or not). The sizes that change from step to step (``batch``, ``num_new``
and the strides that follow them) are not specialised, nor the alignment of the slots, limits
and ancestors (views into one index tensor, where the ancestors' row starts 16-byte aligned only
for an even number of tokens), so the variants are only the constexprs' (three tile heights,
each with the plans :func:`split_plan` can give up to the slot table's width); :func:`warm_up`
compiles them all before the first request, which would otherwise wait for them (a server's
first requests waited seconds).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from functools import cache
from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = ["SplitPlan", "paged_attention", "paged_attention_reference", "split_bucket",
           "split_plan", "visible_columns", "warm_up"]

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # (Triton runs CPU tensors too)
ANCESTOR_BITS = 64  # a token's tree-ancestor set: the bits of one int64
_LOG2E = 1.4426950408889634
MAX_SPLITS = 16
BLOCK_N = 64  # key columns a block (the launcher's default)
SPLIT_PROGRAMS_PER_SM = 4  # split_plan: programs a step may have per SM ...
SPLIT_BUSY_BLOCKS = 8  # ... and key blocks a share takes at least once they are many
LONG_COLUMNS = 16 * BLOCK_N  # split_plan: a key range long enough for 128-column blocks ...
WAVE_PROGRAMS = 1.5  # ... where the shares give at least this many programs an SM ...
WAVE_FILL = 0.9  # ... in waves of programs at least this full
SPLIT_COLUMNS = 4 * BLOCK_N  # split_bucket: the shortest graph key length ...
MAX_SPLIT_COLUMNS = MAX_SPLITS * SPLIT_BUSY_BLOCKS * BLOCK_N  # ... and past this, the table's


@triton.jit
def _bit_length(x):
    """Bits needed to write int64 ``x``: 0 for 0, 64 for a negative value (bit 63 set)."""
    y = tl.where(x < 0, 0, x)
    n = tl.zeros_like(y)
    for shift in tl.static_range(5, -1, -1):  # (a binary search: halves of 32, 16, ..., 1)
        big = (y >> (1 << shift)) != 0
        n, y = tl.where(big, n + (1 << shift), n), tl.where(big, y >> (1 << shift), y)
    n = n + (y != 0).to(n.dtype)
    return tl.where(x < 0, 64, n)


@triton.jit
def _chain_columns(cols, limit, anc):
    """Chain order (``CHAIN_ORDER``): the column a token reads as its ``cols``-th visible key
    (``[BLOCK_N]``), for a token of limit ``limit`` and tree bits ``anc`` (scalars): columns up
    to the limit are themselves; the ``i``-th after it is the token's ``i``-th tree bit's
    column, its ancestors' in depth order (a parent precedes its children)."""
    rank = cols - limit - 1  # [BLOCK_N] rank among the token's tree columns
    pos = tl.zeros_like(cols)
    seen = limit * 0  # set bits below ``bit``
    for bit in tl.static_range(62):  # (the layout's MAX_TREE_NODES bits; a literal: no global)
        on = (anc >> bit) & 1
        pos = tl.where((rank == seen) & (on == 1), bit, pos)
        seen = seen + on
    return tl.where(rank >= 0, limit + 1 + pos, cols), limit + 1 + seen


@triton.jit
def _pool_rows(table_ptr, row_start, cols, hi, limit_t, anc_t, CHAIN_ORDER: tl.constexpr):
    """The pool rows of key columns ``cols [BLOCK_N]`` (int64; 0 past ``hi``) from a slot's
    table row at ``row_start``; in chain order, a tree node's columns after its limit are read
    through :func:`_chain_columns`."""
    read = cols.to(tl.int64)
    if CHAIN_ORDER:
        if anc_t != 0:
            read = _chain_columns(read, limit_t, anc_t)[0]
    return tl.load(table_ptr + row_start + read, mask=cols < hi, other=0).to(tl.int64)


@triton.jit(do_not_specialize=["sq_b", "sq_h", "sq_t", "s_table", "sl_b", "sa_b", "so_b", "so_t",
                               "batch", "num_new", "table_width"],
            # (views into the step's one index tensor, read a value at a time: docstring)
            do_not_specialize_on_alignment=["slots_ptr", "limits_ptr", "anc_ptr"])
def _paged_attention_kernel(
        q_ptr, k_ptr, v_ptr, table_ptr, slots_ptr, limits_ptr, anc_ptr, out_ptr,
        part_o_ptr, part_lse_ptr,
        sq_b, sq_h, sq_t, sq_d,  # q [batch, heads, num_new, head_dim]
        sk_h, sk_r, sk_d,  # keys [kv_heads, num_rows, head_dim]
        sv_h, sv_r, sv_d,  # values [kv_heads, num_rows, head_dim]
        s_table,  # slot table row stride (columns contiguous)
        sl_b, sl_t, sa_b, sa_t,  # limits, ancestors [batch, num_new]
        so_b, so_t, so_h, so_d,  # out [batch, num_new, heads, head_dim]
        batch, kv_heads, num_new, head_dim, table_width, scale_log2,
        GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
        DOT_F32: tl.constexpr, CHAIN_ORDER: tl.constexpr, PREFETCH: tl.constexpr):
    pid_bh, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, kv_head = pid_bh // kv_heads, pid_bh % kv_heads
    num_rows = GROUPS * num_new
    if CHAIN_ORDER:  # one token a program: its GROUPS query heads
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows < GROUPS
        g, t = rows, tl.zeros_like(rows) + pid_m
    else:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] folded row g * num_new + t
        row_ok = rows < num_rows
        g, t = rows // num_new, rows % num_new
    head = kv_head * GROUPS + g
    # (a layer's pool may pass 2**31 elements: its offsets are 64-bit)
    kv_base = kv_head.to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + t[:, None] * sq_t + d[None, :] * sq_d,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if DOT_F32:
        q = q.to(tl.float32)
    limit = tl.load(limits_ptr + b * sl_b + t * sl_t, mask=row_ok, other=0).to(tl.int64)
    anc = tl.load(anc_ptr + b * sa_b + t * sa_t, mask=row_ok, other=0).to(tl.int64)
    # last visible column of each row: its limit, or its highest tree bit's column
    last = tl.where(anc != 0, limit + _bit_length(anc), limit)
    kv_end = tl.minimum(tl.max(tl.where(row_ok, last, 0), axis=0) + 1, table_width)
    limit_t = kv_end * 0  # (chain order's scalars: the token's limit and tree bits)
    anc_t = kv_end * 0
    if CHAIN_ORDER:  # (the token's limit and bits as scalars; its visible keys, counted)
        limit_t = tl.load(limits_ptr + b * sl_b + pid_m * sl_t).to(tl.int64)
        anc_t = tl.load(anc_ptr + b * sa_b + pid_m * sa_t).to(tl.int64)
        kv_end = limit_t + 1
        if anc_t != 0:  # (a tree node; a chain token skips the bit walk)
            kv_end = _chain_columns(limit_t, limit_t, anc_t)[1]
    slot = tl.load(slots_ptr + b).to(tl.int64)
    per_split = tl.cdiv(tl.cdiv(kv_end, BLOCK_N), NUM_SPLITS) * BLOCK_N  # columns per share
    lo = split * per_split
    hi = tl.minimum(lo + per_split, kv_end)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (base-2 logits)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of 2^(s - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # With few programs an SM (PREFETCH) each one's time was its chain of dependent loads
    # (table, then keys, then values): each block's pool rows are then loaded one block ahead
    # and its values with its keys. With more, the extra live registers cost more resident
    # programs than they save (docs/design.md, "Measured reasons behind the runner's choices").
    if PREFETCH:
        pool_rows = _pool_rows(table_ptr, slot * s_table, lo + tl.arange(0, BLOCK_N), hi,
                               limit_t, anc_t, CHAIN_ORDER)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] key columns (positions)
        col_ok = cols < hi
        if not PREFETCH:
            pool_rows = _pool_rows(table_ptr, slot * s_table, cols, hi, limit_t, anc_t,
                                   CHAIN_ORDER)
        k = tl.load(k_ptr + kv_base * sk_h + pool_rows[None, :] * sk_r + d[:, None] * sk_d,
                    mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
        if PREFETCH:
            v = tl.load(v_ptr + kv_base * sv_h + pool_rows[:, None] * sv_r + d[None, :] * sv_d,
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            pool_rows = _pool_rows(table_ptr, slot * s_table, cols + BLOCK_N, hi, limit_t,
                                   anc_t, CHAIN_ORDER)  # (the next block's)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * scale_log2  # [BLOCK_M, BLOCK_N]
        if CHAIN_ORDER:
            # cols are ranks among the token's visible keys (read through _chain_columns), and
            # col_ok keeps them below hi <= kv_end, its count: every real (column, row) is seen
            visible = col_ok[None, :] & row_ok[:, None]  # [BLOCK_M, BLOCK_N]
        else:  # a column up to the row's limit, or a tree column whose bit the row has
            after = cols[None, :] - limit[:, None] - 1  # [BLOCK_M, BLOCK_N] tree bit of a column
            bit = (anc[:, None] >> tl.minimum(tl.maximum(after, 0), 63)) & 1
            allowed = (after < 0) | ((after < 64) & (bit == 1))
            visible = allowed & col_ok[None, :] & row_ok[:, None]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # (a row with nothing visible yet)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if not PREFETCH:
            v = tl.load(v_ptr + kv_base * sv_h + pool_rows[:, None] * sv_r + d[None, :] * sv_d,
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        p = p.to(v.dtype)  # (P V in the values' dtype, as flash attention does)
        if DOT_F32:
            p, v = p.to(tl.float32), v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new

    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # (an empty share: 0, weight 0 below)
    if NUM_SPLITS == 1:
        out = out_ptr + b * so_b + t[:, None] * so_t + head[:, None] * so_h + d[None, :] * so_d
        tl.store(out, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:  # partials [NUM_SPLITS, batch, kv_heads, num_rows, BLOCK_D], lse [..., num_rows]
        base = (split * batch + b) * kv_heads + kv_head
        tl.store(part_o_ptr + (base * num_rows + rows[:, None]) * BLOCK_D + d[None, :], o,
                 mask=row_ok[:, None])
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        tl.store(part_lse_ptr + base * num_rows + rows, lse, mask=row_ok)


@triton.jit(do_not_specialize=["so_b", "so_t", "batch", "num_new"])
def _combine_splits_kernel(
        part_o_ptr, part_lse_ptr, out_ptr, so_b, so_t, so_h, so_d,
        batch, kv_heads, num_new, head_dim,
        GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        NUM_SPLITS: tl.constexpr):
    """out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), M = max_s lse_s (share 0 holds
    column 0, visible to every row, so M is finite)."""
    pid_bh, pid_m = tl.program_id(0), tl.program_id(1)
    b, kv_head = pid_bh // kv_heads, pid_bh % kv_heads
    num_rows = GROUPS * num_new
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    g, t = rows // num_new, rows % num_new
    head = kv_head * GROUPS + g
    d = tl.arange(0, BLOCK_D)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        base = (split * batch + b) * kv_heads + kv_head
        lse = tl.load(part_lse_ptr + base * num_rows + rows, mask=row_ok, other=float("-inf"))
        top = tl.maximum(top, lse)
    top = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        base = (split * batch + b) * kv_heads + kv_head
        lse = tl.load(part_lse_ptr + base * num_rows + rows, mask=row_ok, other=float("-inf"))
        w = tl.exp2(lse - top)  # [BLOCK_M]
        o = tl.load(part_o_ptr + (base * num_rows + rows[:, None]) * BLOCK_D + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        total += w
        acc += w[:, None] * o
    o = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    out = out_ptr + b * so_b + t[:, None] * so_t + head[:, None] * so_h + d[None, :] * so_d
    tl.store(out, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (d < head_dim)[None, :])


def _block_m(num_rows: int) -> int:
    """Folded query rows per program: all of them up to 64 (tl.dot takes 16 at least)."""
    return min(64, max(16, triton.next_power_of_2(num_rows)))


def paged_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    slot_table: torch.Tensor, slots: torch.Tensor, limits: torch.Tensor,
                    ancestors: torch.Tensor, scale: float, num_splits: int = 1,
                    block_n: int = BLOCK_N, chain_order: bool = False,
                    prefetch: bool | None = None) -> torch.Tensor:
    """The kernel's launcher (see the module docstring): ``query [batch, heads, num_new,
    head_dim]``, ``keys``/``values [kv_heads, num_rows, head_dim]``, ``slot_table [num_slots,
    table_width]``, ``slots [batch]``, ``limits``/``ancestors [batch, num_new]`` (integer
    tensors, all on one device: CUDA, or CPU under ``TRITON_INTERPRET=1``); returns ``[batch,
    num_new, heads, head_dim]`` in ``query``'s dtype. ``num_splits``: shares of each row's key
    range run by programs of their own, then combined (split-K); ``block_n``: key columns per
    block (a power of two >= 16). ``chain_order`` (deterministic mode; one split): one program
    per token, and a draft-tree node reads its ancestors' keys as the columns right after its
    limit, in depth order, where a chain token at that depth reads its own: every token's sums
    then run over the same values in the same places, whatever the step (module docstring).
    ``prefetch``: load each block's pool rows a block ahead (None: with one split only; the
    same result either way, :func:`split_plan` says when it pays)."""
    batch, heads, num_new, head_dim = query.shape
    kv_heads = keys.shape[0]
    if keys.dim() != 3 or values.shape != keys.shape or keys.shape[2] != head_dim:
        raise ValueError(f"keys and values must be [kv_heads, num_rows, {head_dim}], got "
                         f"{tuple(keys.shape)} and {tuple(values.shape)}")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    if (slots.shape != (batch,) or limits.shape != (batch, num_new)
            or ancestors.shape != (batch, num_new) or slot_table.dim() != 2):
        raise ValueError(f"slots [{batch}], limits and ancestors [{batch}, {num_new}] and a 2-D "
                         f"slot table expected, got {tuple(slots.shape)}, {tuple(limits.shape)}, "
                         f"{tuple(ancestors.shape)}, {tuple(slot_table.shape)}")
    index = (slot_table, slots, limits, ancestors)
    if any(x.dtype.is_floating_point for x in index) or slot_table.stride(1) != 1:
        raise ValueError("slot_table, slots, limits and ancestors must be integer tensors, the "
                         "slot table's columns contiguous")
    if len({x.device for x in (query, keys, values, *index)}) != 1:
        raise ValueError("every tensor must be on one device")
    if not 1 <= num_splits <= MAX_SPLITS or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}] and block_n a power of two "
                         f">= 16, got {num_splits} and {block_n}")
    if query.device.type != "cuda" and not _INTERPRETED:
        raise ValueError("the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1); "
                         "paged_attention_reference runs anywhere")
    groups = heads // kv_heads
    num_rows = groups * num_new
    if chain_order and num_splits != 1:
        raise ValueError(f"chain_order reads each token in one split, got num_splits={num_splits}")
    block_m = max(16, triton.next_power_of_2(groups)) if chain_order else _block_m(num_rows)
    block_d = max(16, triton.next_power_of_2(head_dim))
    out = torch.empty(batch, num_new, heads, head_dim, dtype=query.dtype, device=query.device)
    part_o = part_lse = out  # (unused without splits)
    if num_splits > 1:
        part_o = torch.empty(num_splits, batch, kv_heads, num_rows, block_d, dtype=torch.float32,
                             device=query.device)
        part_lse = torch.empty(num_splits, batch, kv_heads, num_rows, dtype=torch.float32,
                               device=query.device)
    grid = (batch * kv_heads, num_new if chain_order else triton.cdiv(num_rows, block_m),
            num_splits)
    precision = "ieee" if query.dtype == torch.float32 else "tf32"  # (tf32: ignored for bf16)
    # Triton's interpreter multiplies bf16 tiles as raw bits (triton 3.9): the CPU tests
    # upcast them first (bf16 products are exact in float32, so nothing else changes)
    dot_f32 = _INTERPRETED and query.dtype == torch.bfloat16
    with _on(query):
        _paged_attention_kernel[grid](
            query, keys, values, slot_table, slots, limits, ancestors, out, part_o, part_lse,
            *query.stride(), *keys.stride(), *values.stride(), slot_table.stride(0),
            *limits.stride(), *ancestors.stride(), *out.stride(),
            batch, kv_heads, num_new, head_dim, slot_table.shape[1], scale * _LOG2E,
            GROUPS=groups, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
            NUM_SPLITS=num_splits, PRECISION=precision, DOT_F32=dot_f32,
            CHAIN_ORDER=chain_order,
            PREFETCH=num_splits == 1 if prefetch is None else prefetch, num_warps=4)
        if num_splits > 1:
            _combine_splits_kernel[grid[:2]](
                part_o, part_lse, out, *out.stride(), batch, kv_heads, num_new, head_dim,
                GROUPS=groups, BLOCK_M=block_m, BLOCK_D=block_d, NUM_SPLITS=num_splits,
                num_warps=4)
    return out


def _on(x: torch.Tensor):
    """``x``'s CUDA device made current for the launch (Triton launches on the current one)."""
    if x.device.type == "cuda" and x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return nullcontext()


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


class SplitPlan(NamedTuple):
    """How a step's paged attention launches: ``num_splits`` shares of each row's key range,
    ``block_n`` key columns a block, and whether the loop loads each block's pool rows a block
    ahead (``prefetch``)."""

    num_splits: int
    block_n: int = BLOCK_N
    prefetch: bool = True


def split_plan(batch: int, heads: int, kv_heads: int, num_new: int, kv_len: int,
               device: torch.device) -> SplitPlan:
    """The launch for a step of these sizes (``kv_len``: the longest row's key columns, static
    per CUDA-graph bucket); one split of 64-column blocks off CUDA. The rules are the measured
    best launches of docs/design.md ("Measured reasons behind the runner's choices"):

    - programs (rows x kv heads x tiles) fewer than the SMs, or key ranges shorter than
      ``LONG_COLUMNS``: 64-column blocks in as many shares as keep ``SPLIT_PROGRAMS_PER_SM``
      programs per SM, at most ``MAX_SPLITS``, each share at least one block while the programs
      are fewer than half the SMs and ``SPLIT_BUSY_BLOCKS`` once they are more (then a split
      only shortens each program's walk and pays the combining launch); loaded a block ahead
      only with one share;
    - at least a program per SM and longer ranges: 128-column blocks, and the fewest shares
      (within that programs-per-SM cap and shares of ``SPLIT_BUSY_BLOCKS // 2`` such blocks)
      that give at least ``WAVE_PROGRAMS`` programs per SM in waves at least ``WAVE_FILL``
      full (a last wave a third full kept most SMs waiting on the rest), else the fullest
      waves; loaded ahead while at most two programs share an SM (with more, the ahead load's
      registers cost resident programs).

    Counts are powers of two (each launch is a kernel variant, compiled by :func:`warm_up`)."""
    if device.type != "cuda":
        return SplitPlan(1)
    rows = heads // kv_heads * num_new
    return _plan(batch * kv_heads * triton.cdiv(rows, _block_m(rows)), kv_len, _sm_count(device))


def _plan(programs: int, kv_len: int, sms: int) -> SplitPlan:
    """:func:`split_plan` for a step of ``programs`` programs before splitting, on ``sms``
    SMs."""
    per_sm_cap = SPLIT_PROGRAMS_PER_SM * sms // programs
    if programs < sms or kv_len < LONG_COLUMNS:  # 64-column blocks
        share = 1 if 2 * programs < sms else SPLIT_BUSY_BLOCKS  # key blocks a share at least
        wanted = max(1, min(MAX_SPLITS, kv_len // BLOCK_N // share, per_sm_cap))
        splits = 1 << (wanted.bit_length() - 1)
        return SplitPlan(splits, BLOCK_N, splits == 1)
    cap = max(1, min(MAX_SPLITS, kv_len // (2 * BLOCK_N * (SPLIT_BUSY_BLOCKS // 2)), per_sm_cap))
    counts = _powers_of_two(cap)

    def fill(splits: int) -> float:  # how full the waves of programs are, 1 at best
        total = programs * splits
        return total / (triton.cdiv(total, sms) * sms)

    good = [s for s in counts if programs * s >= WAVE_PROGRAMS * sms and fill(s) >= WAVE_FILL]
    splits = good[0] if good else max(counts, key=lambda s: (fill(s), -s))
    return SplitPlan(splits, 2 * BLOCK_N, programs * splits <= 2 * sms)


def split_bucket(kv_len: int, limit: int) -> int:
    """The key length of the CUDA graph that serves a paged step of ``kv_len`` key columns (at
    most ``limit``, the slot table's width). The kernel finds each row's last visible column on
    the device, so a graph replays for any length up to the table's width, and the key length
    picks only the launch (:func:`split_plan`), which moves where ``kv_len // BLOCK_N`` passes
    a power of two: ``kv_len`` rounds up to ``SPLIT_COLUMNS`` times a power of two (at
    least ``SPLIT_COLUMNS``), or to ``limit`` past ``MAX_SPLIT_COLUMNS``, where every count has
    reached its most. Seven graphs per batch and width then serve every context, where rounding
    for the gather path's copies (:func:`engine.runner.cuda_graphs.kv_bucket`) captures about
    four per doubling of the context, each one an eager step and a capture in the middle of a
    request."""
    if kv_len > MAX_SPLIT_COLUMNS:
        return limit
    return min(limit, SPLIT_COLUMNS << ((kv_len - 1) // SPLIT_COLUMNS).bit_length())


# ---- the PyTorch reference ----------------------------------------------------------------------

def visible_columns(limits: torch.Tensor, ancestors: torch.Tensor, width: int) -> torch.Tensor:
    """``[batch, num_new, width]`` bool: which key columns each token sees (module docstring)."""
    columns = torch.arange(width, device=limits.device)  # [width]
    after = columns - limits[..., None] - 1  # [batch, num_new, width]
    bit = (ancestors[..., None] >> after.clamp(0, ANCESTOR_BITS - 1)) & 1
    return (after < 0) | ((after < ANCESTOR_BITS) & (bit == 1))


def paged_attention_reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                              slot_table: torch.Tensor, slots: torch.Tensor,
                              limits: torch.Tensor, ancestors: torch.Tensor, scale: float,
                              kv_len: int | None = None) -> torch.Tensor:
    """What :func:`paged_attention` computes, in PyTorch (same arguments; the result ``[batch,
    num_new, heads, head_dim]``): each row's keys and values gathered through the slot table,
    the key heads repeated per group, a float32 softmax over the visible columns. ``kv_len``:
    only the first ``kv_len`` table columns are read (every visible column must be among them;
    None: the whole table)."""
    batch, heads, num_new, head_dim = query.shape
    width = slot_table.shape[1] if kv_len is None else kv_len
    rows = slot_table.index_select(0, slots)[:, :width]  # [batch, width] pool rows
    groups = heads // keys.shape[0]
    # [batch, heads, width, head_dim]
    k = keys[:, rows].transpose(0, 1).repeat_interleave(groups, dim=1).float()
    v = values[:, rows].transpose(0, 1).repeat_interleave(groups, dim=1).float()
    scores = query.float() @ k.transpose(2, 3) * scale  # [batch, heads, num_new, width]
    visible = visible_columns(limits, ancestors, width)[:, None]  # [batch, 1, num_new, width]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return (probs @ v).to(query.dtype).transpose(1, 2).contiguous()


def warm_up(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int,
            chain_order: bool = False, max_kv_len: int = 2 * MAX_SPLIT_COLUMNS) -> int:
    """Compile, before any request, every variant of the kernel a step can launch (each tile
    height with every :class:`SplitPlan` that :func:`split_plan` gives for some step of at most
    ``max_kv_len`` key columns, the slot table's width; chain order: its one tile and one
    split) by running it on a few rows. Returns how many variants ran. No-op (0) off CUDA."""
    if device.type != "cuda":
        return 0
    groups = heads // kv_heads
    if chain_order:
        shapes = [(1, SplitPlan(1))]
    else:  # (a width for each tile height: 16, 32 or 64 rows, as the groups allow)
        # (a plan is a function of the programs and the key length: past 4 programs an SM it
        # stops changing, and its thresholds are powers of two of key blocks)
        sms = _sm_count(device)
        lengths = [BLOCK_N << i for i in range((max_kv_len // BLOCK_N).bit_length())]
        lengths.append(max_kv_len)
        plans = sorted({_plan(programs, kv_len, sms) for kv_len in lengths
                        for programs in range(1, SPLIT_PROGRAMS_PER_SM * sms + 2)})
        shapes = [(n, plan) for n in {_block_m(groups * n): n for n in range(64, 0, -1)}.values()
                  for plan in plans]
    keys = torch.zeros(kv_heads, 4, head_dim, dtype=dtype, device=device)
    table = torch.zeros(1, 4, dtype=torch.int64, device=device)
    for num_new, plan in shapes:
        query = torch.zeros(1, heads, num_new, head_dim, dtype=dtype, device=device)
        slots = torch.zeros(1, dtype=torch.int64, device=device)
        limits = torch.zeros(1, num_new, dtype=torch.int64, device=device)
        paged_attention(query, keys, keys, table, slots, limits, limits, 1.0, plan.num_splits,
                        plan.block_n, chain_order, plan.prefetch)
    torch.cuda.synchronize(device)
    return len(shapes)


def _powers_of_two(most: int) -> list[int]:
    return [1 << i for i in range(most.bit_length()) if 1 << i <= most]
