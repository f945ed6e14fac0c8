"""A fused kernel for the draft head's drafting: the rotary embedding from positions, one launch.

The head's rotary (:func:`proposers.head_model.rotate`, the PyTorch reference) is about a dozen
kernels for each of the queries and the keys: the positions to float32, their product with the
frequencies, ``cos``, ``sin``, the float32 copy of ``x``, its halves' four products, the
difference and the sum, the concatenation and the copy back. A proposal of 4 drafts runs it 8
times, inside a CUDA graph whose kernels cost a few microseconds each whatever their work: a
proposal is bound by its number of kernels (docs/design.md, "Measured reasons behind the
runner's choices"). Here it is one Triton launch: each program rotates one (row, head) of
``x``, computing its angles ``position * inv_freq`` in float32 as the reference does, and
rounds once, at the store.

Numerics: the same formula in float32; ``cos``/``sin`` are Triton's and may differ from
PyTorch's in the last float32 place, so outputs are equal to the reference after the rounding to
bf16 but for rare ties (checked in ``tests/proposers/test_head_kernels.py``). It serves drafts
only (verification decides what is kept), and only where no gradient is needed: training
(``examples/train_draft_head.py``) goes through the reference.

The same holds for the other pieces of a draft here, each one launch where PyTorch takes
several (at batch 1 the head's chain is about a quarter of a drafting step's GPU time, some 130
kernels of a few microseconds each: docs/performance.md, "The draft head's kernels"):

- :func:`fused_rms_norm`: ``torch.nn.RMSNorm`` (normalised and scaled in float32, rounded
  once), written where the caller says (the two norms of a pair into the halves of one row:
  no concatenation);
- :func:`fused_silu_mul`: ``silu(gate) * up`` of a row ``[gate ; up]``, rounded as PyTorch
  rounds the two ops;
- :func:`fused_rotate_write`: a pair's key rotated and written, with its value, into the
  cache at its slot and position (where rotate and two indexed writes took three launches);
- :func:`chain_attention`: the attention of one query row per request over its slot's keys
  ``0 .. upto``, the query heads of a key/value head together, each block of keys a program, their
  softmaxes merged in float32 (where PyTorch built a mask, converted it and ran SDPA: six
  launches, two here).

"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

from samplers.argmax_kernel import argmax_rows

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # (Triton runs CPU tensors too)
CHAIN_BLOCK = 64  # keys chain_attention multiplies at once
MAX_SPLITS = 64  # spans (programs) a row's keys are split into, at most (the merge holds all)


@triton.jit
def _to_bf16_grid(x):
    """float32 ``x`` on bf16's grid (round to nearest even, by its bits), NaN kept: the store's
    cast is then exact, compiled or interpreted (the interpreter truncates a cast to bf16)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit
def _rotate_kernel(x_ptr, out_ptr, pos_ptr, freq_ptr, heads, xs_row, xs_head, os_row, os_head,
                   HALF: tl.constexpr, BLOCK: tl.constexpr, BF16: tl.constexpr):
    pid = tl.program_id(0)  # one (row, head)
    row, head = (pid // heads).to(tl.int64), pid % heads
    i = tl.arange(0, BLOCK)
    live = i < HALF
    angle = tl.load(pos_ptr + row).to(tl.float32) * tl.load(freq_ptr + i, mask=live, other=0.0)
    c, s = tl.cos(angle), tl.sin(angle)
    x_row = x_ptr + row * xs_row + head * xs_head
    a = tl.load(x_row + i, mask=live, other=0.0).to(tl.float32)
    b = tl.load(x_row + HALF + i, mask=live, other=0.0).to(tl.float32)
    o_row = out_ptr + row * os_row + head * os_head
    ty = out_ptr.dtype.element_ty
    first, second = a * c - b * s, b * c + a * s
    if BF16:
        first, second = _to_bf16_grid(first), _to_bf16_grid(second)
    tl.store(o_row + i, first.to(ty), mask=live)
    tl.store(o_row + HALF + i, second.to(ty), mask=live)


def fused_rotate_applies(x: torch.Tensor, positions: torch.Tensor) -> bool:
    """Whether :func:`fused_rotate` serves this call: on a GPU (or under Triton's interpreter),
    no gradient wanted, the head dimension contiguous, positions one per row of ``x``."""
    return ((x.is_cuda or _INTERPRETED) and not torch.is_grad_enabled() and x.dim() >= 2
            and x.stride(-1) == 1 and x.shape[-1] % 2 == 0
            and tuple(positions.shape) == tuple(x.shape[:-2])
            and positions.device == x.device)


def fused_rotate(x: torch.Tensor, positions: torch.Tensor,
                 inv_freq: torch.Tensor) -> torch.Tensor:
    """:func:`proposers.head_model.rotate` in one launch: ``x [..., heads, head_dim]`` rotated
    at ``positions [...]`` by ``inv_freq [head_dim / 2]`` (float32), LLaMA's half-split layout;
    returns a new tensor of ``x``'s shape and dtype."""
    heads, dim = x.shape[-2], x.shape[-1]
    rows = x.reshape(-1, heads, dim)  # [rows, heads, head_dim] (a view where x allows)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)  # [rows, heads, head_dim]
    if rows.numel():
        pos = positions.reshape(-1)  # [rows]
        with torch.cuda.device(x.device) if x.is_cuda else nullcontext():
            _rotate_kernel[(rows.shape[0] * heads,)](
                rows, out, pos, inv_freq, heads, rows.stride(0), rows.stride(1),
                out.stride(0), out.stride(1), HALF=dim // 2,
                BLOCK=triton.next_power_of_2(dim // 2), BF16=x.dtype == torch.bfloat16)
    return out.view(x.shape)



@triton.jit
def _rotate_write_kernel(k_ptr, v_ptr, pos_ptr, dest_ptr, freq_ptr, keys_ptr, values_ptr, heads,
                         ks_row, ks_head, vs_row, vs_head, cs_slot, cs_pos, cs_head, ds_slot,
                         ds_pos, ds_head, HALF: tl.constexpr, BLOCK: tl.constexpr,
                         BF16: tl.constexpr):
    pid = tl.program_id(0)  # one (pair, key/value head)
    row, head = (pid // heads).to(tl.int64), pid % heads
    i = tl.arange(0, BLOCK)
    live = i < HALF
    position = tl.load(pos_ptr + row)
    slot = tl.load(dest_ptr + row)
    angle = position.to(tl.float32) * tl.load(freq_ptr + i, mask=live, other=0.0)
    c, s = tl.cos(angle), tl.sin(angle)
    k_row = k_ptr + row * ks_row + head * ks_head
    a = tl.load(k_row + i, mask=live, other=0.0).to(tl.float32)
    b = tl.load(k_row + HALF + i, mask=live, other=0.0).to(tl.float32)
    first, second = a * c - b * s, b * c + a * s
    if BF16:
        first, second = _to_bf16_grid(first), _to_bf16_grid(second)
    ty = keys_ptr.dtype.element_ty
    key = keys_ptr + slot * cs_slot + position * cs_pos + head * cs_head
    tl.store(key + i, first.to(ty), mask=live)
    tl.store(key + HALF + i, second.to(ty), mask=live)
    v_row = v_ptr + row * vs_row + head * vs_head
    value = values_ptr + slot * ds_slot + position * ds_pos + head * ds_head
    tl.store(value + i, tl.load(v_row + i, mask=live), mask=live)
    tl.store(value + HALF + i, tl.load(v_row + HALF + i, mask=live), mask=live)


def rotate_write_applies(k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor, positions: torch.Tensor,
                         slots: torch.Tensor) -> bool:
    """Whether :func:`fused_rotate_write` serves keys ``k`` and values ``v [..., kv_heads,
    head_dim]`` into ``keys``/``values [slots, capacity, kv_heads, head_dim]`` at ``slots``,
    ``positions [...]``: :func:`_fused`, one dtype and device, one position and slot a pair,
    the head dimensions contiguous and even."""
    return (_fused(k) and k.dim() >= 2 and k.shape == v.shape and keys.dim() == 4
            and keys.shape == values.shape and tuple(k.shape[-2:]) == tuple(keys.shape[-2:])
            and k.dtype == v.dtype == keys.dtype == values.dtype
            and k.device == v.device == keys.device == values.device == positions.device
            == slots.device
            and positions.numel() == slots.numel() == k[..., 0, 0].numel()
            and k.stride(-1) == 1 and v.stride(-1) == 1 and keys.stride(-1) == 1
            and values.stride(-1) == 1 and k.shape[-1] % 2 == 0)


def fused_rotate_write(k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                       inv_freq: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       slots: torch.Tensor) -> None:
    """``keys[slots, positions] = rotate(k, positions)`` and ``values[slots, positions] = v``
    in one launch: ``k``/``v [..., kv_heads, head_dim]`` (unrotated keys, values),
    ``positions``/``slots [...]`` (long), ``keys``/``values [slots, capacity, kv_heads,
    head_dim]``; the rotation is :func:`fused_rotate`'s."""
    heads, dim = k.shape[-2], k.shape[-1]
    k_rows, v_rows = k.reshape(-1, heads, dim), v.reshape(-1, heads, dim)  # [n, heads, dim]
    if not k_rows.shape[0]:
        return
    with torch.cuda.device(k.device) if k.is_cuda else nullcontext():
        _rotate_write_kernel[(k_rows.shape[0] * heads,)](
            k_rows, v_rows, positions.reshape(-1).contiguous(), slots.reshape(-1).contiguous(),
            inv_freq, keys, values,
            heads, k_rows.stride(0), k_rows.stride(1), v_rows.stride(0), v_rows.stride(1),
            keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1),
            values.stride(2), HALF=dim // 2, BLOCK=triton.next_power_of_2(dim // 2),
            BF16=k.dtype == torch.bfloat16)


def _fused(x: torch.Tensor) -> bool:
    """A call the fused kernels may serve: on a GPU (or under the interpreter), no gradient."""
    return (x.is_cuda or _INTERPRETED) and not torch.is_grad_enabled()


@triton.jit
def _round_to(x, ty: tl.constexpr, BF16: tl.constexpr):
    """float32 ``x`` rounded to the grid of dtype ``ty`` (kept float32)."""
    if BF16:
        return _to_bf16_grid(x)
    return x.to(ty).to(tl.float32)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, size, xs_row, os_row, eps,
                     BLOCK: tl.constexpr, BF16: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one row (64-bit: rows * stride may pass 2 ** 31)
    i = tl.arange(0, BLOCK)
    live = i < size
    x = tl.load(x_ptr + row * xs_row + i, mask=live, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / size + eps)
    ty = out_ptr.dtype.element_ty
    w = tl.load(w_ptr + i, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * os_row + i, _round_to(x * rstd * w, ty, BF16).to(ty), mask=live)


def fused_norm_applies(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether :func:`fused_rms_norm` serves a norm of ``x [..., size]`` by ``weight [size]``:
    :func:`_fused`, the last dimension contiguous, the weight of ``x``'s dtype (else PyTorch
    promotes the product)."""
    return (_fused(x) and weight is not None and x.dim() >= 1 and x.stride(-1) == 1
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and weight.dtype == x.dtype and weight.device == x.device
            and tuple(weight.shape) == (x.shape[-1],))


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """``x * rsqrt(mean(x ** 2) + eps) * weight`` over ``x [..., size]``'s last dimension in
    float32, rounded once to ``x``'s dtype (``torch.nn.RMSNorm``'s numerics), one launch;
    into ``out [rows, size]`` (its last dimension contiguous, any row stride: half of a wider
    row) when given, else a new tensor of ``x``'s shape."""
    size = x.shape[-1]
    rows = x.reshape(-1, size)  # [rows, size] (a view where x allows)
    dest = torch.empty(rows.shape, dtype=x.dtype, device=x.device) if out is None else out
    if tuple(dest.shape) != tuple(rows.shape) or dest.stride(-1) != 1:
        raise ValueError(f"out must be [{rows.shape[0]}, {size}] with contiguous rows, got "
                         f"{tuple(dest.shape)} strides {dest.stride()}")
    if rows.numel():
        with torch.cuda.device(x.device) if x.is_cuda else nullcontext():
            _rms_norm_kernel[(rows.shape[0],)](
                rows, weight, dest, size, rows.stride(0), dest.stride(0), float(eps),
                BLOCK=triton.next_power_of_2(size), BF16=x.dtype == torch.bfloat16)
    return dest.view(x.shape) if out is None else dest


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, size, xs_row, os_row, BLOCK: tl.constexpr,
                     BF16: tl.constexpr):
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i = block * BLOCK + tl.arange(0, BLOCK)
    live = i < size
    gate = tl.load(x_ptr + row * xs_row + i, mask=live, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * xs_row + size + i, mask=live, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    silu = _round_to(gate / (1.0 + tl.exp(-gate)), ty, BF16)  # (F.silu's result, rounded)
    tl.store(out_ptr + row * os_row + i, _round_to(silu * up, ty, BF16).to(ty), mask=live)


def draft_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax ``[rows]`` of ``logits [rows, vocab]``: two launches where the fused
    kernels apply (:func:`samplers.argmax_kernel.argmax_rows`: PyTorch reduces a row in one
    program, slower than the two together), else ``argmax``. A row without a
    finite maximum drafts token 0 there (a draft is only a guess)."""
    if _fused(logits) and logits.dim() == 2 and logits.stride(-1) == 1:
        return argmax_rows(logits, 0)
    return logits.argmax(dim=-1)


def fused_silu_mul_applies(gate_up: torch.Tensor) -> bool:
    """Whether :func:`fused_silu_mul` serves ``gate_up [..., 2 * size]``: :func:`_fused`, its
    last dimension contiguous and even."""
    return (_fused(gate_up) and gate_up.dim() >= 1 and gate_up.stride(-1) == 1
            and gate_up.shape[-1] % 2 == 0)


def fused_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` of ``gate_up [..., 2 * size]`` = ``[gate ; up]`` (its last
    dimension contiguous), one launch: ``[..., size]``."""
    size = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * size)  # [rows, 2 * size]
    out = torch.empty((rows.shape[0], size), dtype=gate_up.dtype, device=gate_up.device)
    if rows.numel():
        block = min(1024, triton.next_power_of_2(size))
        with torch.cuda.device(gate_up.device) if gate_up.is_cuda else nullcontext():
            _silu_mul_kernel[(rows.shape[0], triton.cdiv(size, block))](
                rows, out, size, rows.stride(0), out.stride(0), BLOCK=block,
                BF16=gate_up.dtype == torch.bfloat16)
    return out.view(*gate_up.shape[:-1], size)


@triton.jit
def _chain_attention_kernel(q_ptr, k_ptr, v_ptr, upto_ptr, slot_ptr, best_ptr, total_ptr, acc_ptr,
                            kv_heads, groups, dim, splits, span, qs_row, qs_head, ks_row, ks_key,
                            ks_head, vs_row, vs_key, vs_head, scale, BLOCK_D: tl.constexpr,
                            G: tl.constexpr, G_OUT: tl.constexpr, BLOCK_N: tl.constexpr,
                            PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    pid, split = tl.program_id(0), tl.program_id(1)  # (request, key/value head), key span
    row, kv_head = (pid // kv_heads).to(tl.int64), pid % kv_heads
    g = tl.arange(0, G)
    d = tl.arange(0, BLOCK_D)
    live_g, live_d = g < groups, d < dim
    heads = kv_head * groups + g  # [G] the query heads reading this key/value head
    q = tl.load(q_ptr + row * qs_row + heads[:, None] * qs_head + d[None, :],
                mask=live_g[:, None] & live_d[None, :], other=0.0)  # [G, BLOCK_D] (padding: 0)
    if DOT_F32:  # (the interpreter multiplies bf16 tiles as raw bits; their products are
        q = q.to(tl.float32)  # exact in float32)
    slot = tl.load(slot_ptr + row)  # (the cache's row of keys it reads)
    k_base = k_ptr + slot * ks_row + kv_head * ks_head
    v_base = v_ptr + slot * vs_row + kv_head * vs_head
    first = split * span
    stop = tl.minimum(first + span, tl.load(upto_ptr + row) + 1)  # (past the row's last key)
    best = tl.full([G], float("-inf"), tl.float32)
    total = tl.zeros([G], tl.float32)
    acc = tl.zeros([G, BLOCK_D], tl.float32)
    for start in range(first, stop, BLOCK_N):  # (none for a span past the row's keys)
        n = start + tl.arange(0, BLOCK_N)
        live = (n < stop)[:, None] & live_d[None, :]  # [BLOCK_N, BLOCK_D]
        k = tl.load(k_base + n[:, None] * ks_key + d[None, :], mask=live, other=0.0)
        v = tl.load(v_base + n[:, None] * vs_key + d[None, :], mask=live, other=0.0)
        if DOT_F32:
            k, v = k.to(tl.float32), v.to(tl.float32)
        # (as flash attention: products of the inputs' dtype, float32 sums)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [G, BLOCK_N]
        s = tl.where((n < stop)[None, :], s, float("-inf"))
        new_best = tl.maximum(best, tl.max(s, axis=1))
        safe = tl.where(new_best == float("-inf"), 0.0, new_best)  # (padded query rows)
        p = tl.exp(s - safe[:, None])  # [G, BLOCK_N]
        shrink = tl.exp(best - safe)
        total = total * shrink + tl.sum(p, axis=1)
        p = p.to(v_ptr.dtype.element_ty)  # (P V in the values' dtype, as flash attention)
        if DOT_F32:
            p = p.to(tl.float32)
        acc = acc * shrink[:, None] + tl.dot(p, v, input_precision=PRECISION)
        best = new_best
    kept = g < G_OUT  # (the group's rows, to a power of two: what the merge reads)
    at = (pid.to(tl.int64) * splits + split) * G_OUT + g  # [G] this span's partial of a head
    tl.store(best_ptr + at, best, mask=kept)
    tl.store(total_ptr + at, total, mask=kept)
    tl.store(acc_ptr + at[:, None] * BLOCK_D + d[None, :], acc, mask=kept[:, None])


@triton.jit
def _chain_combine_kernel(best_ptr, total_ptr, acc_ptr, out_ptr, kv_heads, groups, dim, splits,
                          os_row, BLOCK_D: tl.constexpr, G: tl.constexpr, S: tl.constexpr):
    pid = tl.program_id(0)  # (request, key/value head): its key spans' partials merged
    row, kv_head = (pid // kv_heads).to(tl.int64), pid % kv_heads
    b = tl.arange(0, S)
    g = tl.arange(0, G)
    d = tl.arange(0, BLOCK_D)
    live = b[:, None] < splits  # [S, 1]
    at = (pid.to(tl.int64) * splits + b[:, None]) * G + g[None, :]  # [S, G]
    best = tl.load(best_ptr + at, mask=live, other=float("-inf"))  # [S, G]
    top = tl.max(best, axis=0)  # [G] (finite: every row sees key 0, in the first span)
    weight = tl.exp(best - top[None, :])  # [S, G] (0 for spans past the row's keys)
    total = tl.sum(tl.load(total_ptr + at, mask=live, other=0.0) * weight, axis=0)  # [G]
    acc = tl.load(acc_ptr + at[:, :, None] * BLOCK_D + d[None, None, :], mask=live[:, :, None],
                  other=0.0)  # [S, G, BLOCK_D]
    out = tl.sum(acc * weight[:, :, None], axis=0) / total[:, None]  # [G, BLOCK_D]
    heads = kv_head * groups + g
    tl.store(out_ptr + row * os_row + heads[:, None] * dim + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(g < groups)[:, None] & (d < dim)[None, :])


def chain_attention_applies(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether :func:`chain_attention` serves queries ``q [b, 1, heads, head_dim]`` over
    ``keys``/``values [s, n, kv_heads, head_dim]``: :func:`_fused`, one query row per request,
    one dtype and device, the query heads a multiple of the key/value heads, contiguous head
    dimensions."""
    return (_fused(q) and q.dim() == 4 and q.shape[1] == 1 and keys.dim() == 4
            and keys.shape == values.shape and q.shape[-1] == keys.shape[-1]
            and q.shape[2] % keys.shape[2] == 0
            and q.dtype == keys.dtype == values.dtype
            and q.device == keys.device == values.device
            and q.stride(-1) == 1 and keys.stride(-1) == 1 and values.stride(-1) == 1)


def chain_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    upto: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention of ``q [b, 1, heads, head_dim]`` over ``keys``/``values
    [s, n, kv_heads, head_dim]`` (query head ``h`` reads key/value head ``h // (heads /
    kv_heads)``), row ``r`` seeing keys ``0 .. upto[r]`` of ``slots[r]`` (``upto``, ``slots
    [b]`` long; ``upto`` at least 0, below ``n``; ``slots`` None: row ``r`` reads ``r``):
    ``[b, 1, heads * head_dim]`` in ``q``'s dtype. Two launches: the keys of each (request,
    key/value head) split into at most ``MAX_SPLITS`` spans, a program each, blocks of
    ``CHAIN_BLOCK`` keys in turn (a span past the row's keys reads nothing), then the spans'
    softmaxes merged (one program a request and head reading every key in turn was several
    times slower than SDPA at batch 1: too few programs)."""
    b, _, num_heads, dim = q.shape
    num_keys, kv_heads = keys.shape[1], keys.shape[2]
    groups = num_heads // kv_heads
    out = torch.empty((b, 1, num_heads * dim), dtype=q.dtype, device=q.device)
    if not b:
        return out
    blocks = triton.cdiv(num_keys, CHAIN_BLOCK)
    span = CHAIN_BLOCK * triton.cdiv(blocks, MAX_SPLITS)  # keys a program reads, at most
    splits = triton.cdiv(num_keys, span)
    # (a group's query heads padded to 16 rows, the smallest product tl.dot takes; the
    # partials keep the group's rows to a power of two)
    rows, kept = max(16, triton.next_power_of_2(groups)), triton.next_power_of_2(groups)
    block_d = max(16, triton.next_power_of_2(dim))
    best = torch.empty((b * kv_heads, splits, kept), dtype=torch.float32, device=q.device)
    total = torch.empty_like(best)  # [b * kv_heads, splits, kept]
    acc = torch.empty((b * kv_heads, splits, kept, block_d), dtype=torch.float32,
                      device=q.device)  # [b * kv_heads, splits, kept, block_d]
    if slots is None:
        slots = torch.arange(b, device=q.device)
    with torch.cuda.device(q.device) if q.is_cuda else nullcontext():
        _chain_attention_kernel[(b * kv_heads, splits)](
            q, keys, values, upto, slots, best, total, acc, kv_heads, groups, dim, splits, span,
            q.stride(0), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
            values.stride(0), values.stride(1), values.stride(2), dim ** -0.5, BLOCK_D=block_d,
            G=rows, G_OUT=kept, BLOCK_N=CHAIN_BLOCK,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # (tf32: bf16 ignores it)
            DOT_F32=_INTERPRETED and q.dtype != torch.float32)
        _chain_combine_kernel[(b * kv_heads,)](
            best, total, acc, out, kv_heads, groups, dim, splits, out.stride(0),
            BLOCK_D=block_d, G=kept, S=triton.next_power_of_2(splits))
    return out
