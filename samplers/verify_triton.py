"""Triton verification: the CUDA path, token for token the rules of ``verify_reference``.

Three launches per step, none of which synchronises with the host:

1. ``_row_stats_kernel`` (grid ``batch x (max_spec_len + 1) x num_chunks``) reads every target
   row once, in vocabulary chunks, and writes per-chunk partials of the softmax of
   ``logits * inv_temperature``: max, sum of exponentials, argmax, entropy term and a bad-value
   flag (NaN, +inf). This is the only full pass over the logits.
2. ``_decide_kernel`` (grid ``batch x num_chunks``) combines the partials, runs the acceptance
   test of every draft from scalar loads (target logit and draft probability of the drafted token
   only), finds the stop position, and races ``argmax(w / q)`` over its chunk of the single stop
   row, ``w = max(p - d, 0)``.
3. ``_finalize_kernel`` (grid ``batch``) reduces the race partials and writes the padded row.

Keyed requests (``keys``: a seed, :mod:`samplers.keyed_random`): the first kernel also writes
per-chunk partials of each of their rows' keyed Gumbel-max sample; the second accepts a draft iff
it equals that sample and emits the sample at the stop position (no race).

Memory traffic: the target logits once, plus one logits row, one draft-probs row and one ``q`` row
per request. A request whose rows hold NaN, +inf, only -inf, or whose draft ids fall outside the
vocabulary gets ``INVALID_TOKEN_ID`` (-2) in every slot of its output row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samplers.keyed_random import PURPOSE_TOKEN_TL, keyed_scores_tl
from samplers.metadata import (
    INVALID_TOKEN_ID,
    MAX_SPEC_LEN,
    PLACEHOLDER_TOKEN_ID,
    SpecDecodeMetadata,
    aligned,
)

_OUT_PAD = 64  # power of two >= MAX_SPEC_LEN + 1: one compiled finalize kernel for every k.


def default_chunk_size(vocab_size: int) -> int:
    """Vocabulary chunk per program: at most 32 chunks, 1024 to 8192 entries each."""
    return min(triton.next_power_of_2(vocab_size),
               max(1024, triton.next_power_of_2(triton.cdiv(vocab_size, 32))))


def verify_triton(
    logits: torch.Tensor,  # [num_tokens + batch_size, vocab_size] float
    metadata: SpecDecodeMetadata,
    inv_temperature: torch.Tensor,  # [batch_size] float32
    is_greedy: torch.Tensor | None,  # [batch_size] int32; None = every request greedy
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab_size] float
    q: torch.Tensor,  # [batch_size, vocab_size] float32 Exp(1)
    u: torch.Tensor,  # [batch_size, >= max_spec_len] float32 U[0, 1)
    typical: bool,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    chunk_size: int | None = None,
    keys: torch.Tensor | None = None,  # [batch_size, 4] int64 (SamplingTensors.keys) or None
) -> torch.Tensor:
    """Launch the three kernels; returns int64 ``[batch_size, max_spec_len + 1]``."""
    batch_size, max_len, num_rows = metadata.batch_size, metadata.max_spec_len, metadata.num_rows
    vocab_size = logits.shape[-1] if logits.dim() == 2 else -1
    _expect(logits, "logits", (num_rows, vocab_size), None, float_only=True)
    _expect(metadata.draft_token_ids, "draft_token_ids", (metadata.num_tokens,), torch.int64)
    _expect(metadata.cu_num_draft_tokens, "cu_num_draft_tokens", (batch_size,), torch.int32)
    _expect(inv_temperature, "inv_temperature", (batch_size,), torch.float32)
    if is_greedy is not None:
        _expect(is_greedy, "is_greedy", (batch_size,), torch.int32)
    if draft_probs is not None:
        _expect(draft_probs, "draft_probs", (metadata.num_tokens, vocab_size), None,
                float_only=True)
    _expect(q, "q", (batch_size, vocab_size), torch.float32)
    _expect(u, "u", (batch_size, max(max_len, 1)), torch.float32)
    if keys is not None:
        _expect(keys, "keys", (batch_size, 4), torch.int64)
    if not 0 <= max_len <= MAX_SPEC_LEN:
        raise ValueError(f"max_spec_len={max_len} is outside the supported range "
                         f"[0, {MAX_SPEC_LEN}]")
    chunk = chunk_size or default_chunk_size(vocab_size)
    num_chunks = triton.cdiv(vocab_size, chunk)
    nc_pad = triton.next_power_of_2(num_chunks)
    device = logits.device
    # Two workspaces (fewer allocations on the host): float32 and int32 partials, every part
    # starting on 16 bytes (:func:`~samplers.metadata.aligned`: another alignment would
    # compile the kernels again, mid-run; docs/history.md, "Verification samplers").
    num_stats, num_race = aligned(num_rows * num_chunks), aligned(batch_size * 2 * num_chunks)
    num_decided = aligned(batch_size)
    num_keyed = num_stats if keys is not None else 0  # keyed samples' partials
    work_f = torch.empty(3 * num_stats + num_race + num_keyed, dtype=torch.float32,
                         device=device)
    work_i = torch.empty(2 * num_stats + num_race + 2 * num_decided + num_keyed,
                         dtype=torch.int32, device=device)
    stats_f = work_f[:3 * num_stats].view(3, num_stats)  # rows: [num_rows, num_chunks] each
    race_f = work_f[3 * num_stats:3 * num_stats + num_race]  # [batch_size, 2, num_chunks] (+ pad)
    stats_i = work_i[:2 * num_stats].view(2, num_stats)
    race_i = work_i[2 * num_stats:2 * num_stats + num_race]
    decided_end = 2 * num_stats + num_race + 2 * num_decided
    decided = work_i[2 * num_stats + num_race:decided_end].view(2, num_decided)  # [2, batch]
    # [num_rows, num_chunks] best keyed score and its token (unused without keys)
    keyed_f = work_f[3 * num_stats + num_race:] if keys is not None else stats_f[0]
    keyed_i = work_i[decided_end:] if keys is not None else stats_i[0]
    out = torch.empty(batch_size, max_len + 1, dtype=torch.int64, device=device)
    if batch_size == 0:
        return out
    warps = 8 if chunk >= 4096 else 4
    cu = metadata.cu_num_draft_tokens
    keys_arg = keys if keys is not None else cu  # (a pointer never read without keys)
    _row_stats_kernel[(batch_size, max_len + 1, num_chunks)](
        logits, logits.stride(0), cu, inv_temperature,
        stats_f[0], stats_f[1], stats_f[2], stats_i[0], stats_i[1],
        keys_arg, keyed_f, keyed_i,
        vocab_size, num_chunks, CHUNK=chunk, NEED_ENTROPY=typical, KEYED=keys is not None,
        num_warps=warps)
    dp = draft_probs if draft_probs is not None else logits
    _decide_kernel[(batch_size, num_chunks)](
        logits, logits.stride(0), cu, metadata.draft_token_ids, dp, dp.stride(0),
        inv_temperature, is_greedy if is_greedy is not None else inv_temperature,
        q, q.stride(0), u, u.stride(0),
        stats_f[0], stats_f[1], stats_f[2], stats_i[0], stats_i[1],
        decided[0], decided[1], race_f, race_i, keys_arg, keyed_f, keyed_i,
        vocab_size, num_chunks, float(posterior_threshold), float(posterior_alpha),
        TYPICAL=typical, HAS_DRAFT_PROBS=draft_probs is not None,
        ALL_GREEDY=is_greedy is None, KEYED=keys is not None, CHUNK=chunk, NC_PAD=nc_pad,
        num_warps=warps)
    _finalize_kernel[(batch_size,)](
        out, out.stride(0), cu, metadata.draft_token_ids, decided[0], decided[1],
        race_f, race_i, num_chunks, max_len,
        NC_PAD=nc_pad, OUT_PAD=_OUT_PAD, INVALID=INVALID_TOKEN_ID,
        PLACEHOLDER=PLACEHOLDER_TOKEN_ID, num_warps=1)
    return out


def _expect(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype | None,
            float_only: bool = False) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}, expected {dtype}")
    if float_only and t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{name} has dtype {t.dtype}, expected float32, float16 or bfloat16")
    if t.dim() >= 1 and t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _request_range(cu_ptr, req):
    """First flat draft index and number of drafts of request ``req``."""
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0)
    end = tl.load(cu_ptr + req)
    return start, end - start


@triton.jit
def _row_stats_kernel(
    logits_ptr,  # [num_rows, vocab_size]
    logits_stride,
    cu_ptr,  # [batch_size] int32
    inv_temp_ptr,  # [batch_size] float32
    max_ptr,  # [num_rows, num_chunks] max of z = logits * inv_temperature
    sum_ptr,  # [num_rows, num_chunks] sum of exp(z - max)
    ent_ptr,  # [num_rows, num_chunks] sum of exp(z - max) * (z - max)
    arg_ptr,  # [num_rows, num_chunks] int32 argmax (first index)
    bad_ptr,  # [num_rows, num_chunks] int32 1 where NaN or +inf
    keys_ptr,  # [batch_size, 4] int64 (KEYED): keyed, seed low, seed high, first position
    keyed_val_ptr,  # [num_rows, num_chunks] float32 out (KEYED): best keyed score
    keyed_idx_ptr,  # [num_rows, num_chunks] int32 out (KEYED): its token id
    vocab_size,
    num_chunks,
    CHUNK: tl.constexpr,
    NEED_ENTROPY: tl.constexpr,
    KEYED: tl.constexpr,
):
    req = tl.program_id(0)
    pos = tl.program_id(1)
    chunk = tl.program_id(2)
    start, k = _request_range(cu_ptr, req)
    if pos > k:
        return
    row = start + req + pos
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row.to(tl.int64) * logits_stride + offs, mask=offs < vocab_size,
                other=float("-inf")).to(tl.float32)
    bad = (x != x) | (x == float("inf"))
    z = tl.where(bad, float("-inf"), x) * tl.load(inv_temp_ptr + req)
    m, a = tl.max(z, axis=0, return_indices=True, return_indices_tie_break_left=True)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp(z - m_safe)
    slot = row * num_chunks + chunk
    tl.store(max_ptr + slot, m)
    tl.store(sum_ptr + slot, tl.sum(e, axis=0))
    tl.store(arg_ptr + slot, chunk * CHUNK + a)
    tl.store(bad_ptr + slot, tl.max(bad.to(tl.int32), axis=0))
    if NEED_ENTROPY:
        tl.store(ent_ptr + slot, tl.sum(e * tl.where(e > 0, z - m_safe, 0.0), axis=0))
    if KEYED:
        if tl.load(keys_ptr + req * 4) != 0:
            scores = keyed_scores_tl(z, offs, tl.load(keys_ptr + req * 4 + 3) + pos,
                                     PURPOSE_TOKEN_TL, tl.load(keys_ptr + req * 4 + 1),
                                     tl.load(keys_ptr + req * 4 + 2))
            best, at = tl.max(scores, axis=0, return_indices=True,
                              return_indices_tie_break_left=True)
            tl.store(keyed_val_ptr + slot, best)
            tl.store(keyed_idx_ptr + slot, chunk * CHUNK + at)


@triton.jit
def _combine_row(max_ptr, sum_ptr, ent_ptr, arg_ptr, bad_ptr, row, num_chunks,
                 NC_PAD: tl.constexpr, NEED_ENTROPY: tl.constexpr):
    """Row softmax statistics from the chunk partials: (max, sum, argmax, bad, entropy)."""
    c = tl.arange(0, NC_PAD)
    cmask = c < num_chunks
    base = row * num_chunks + c
    m_c = tl.load(max_ptr + base, mask=cmask, other=float("-inf"))
    s_c = tl.load(sum_ptr + base, mask=cmask, other=0.0)
    m, best = tl.max(m_c, axis=0, return_indices=True, return_indices_tie_break_left=True)
    argmax = tl.load(arg_ptr + row * num_chunks + best)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    scale = tl.exp(m_c - m_safe)
    s = tl.sum(s_c * scale, axis=0)
    bad = tl.max(tl.load(bad_ptr + base, mask=cmask, other=0), axis=0)
    bad = bad | (m == float("-inf")).to(tl.int32)
    entropy = s * 0.0
    if NEED_ENTROPY:
        t_c = tl.load(ent_ptr + base, mask=cmask, other=0.0)
        # sum_i exp(z_i - M) (z_i - M) = sum_c scale_c (t_c + s_c (m_c - M))
        shift = tl.where(scale > 0, m_c - m_safe, 0.0)
        w = scale * (t_c + s_c * shift)
        entropy = tl.log(s) - tl.sum(w, axis=0) / s
    return m_safe, s, argmax, bad, entropy


@triton.jit
def _combine_keyed(val_ptr, idx_ptr, row, num_chunks, keyed, NC_PAD: tl.constexpr):
    """A keyed row's sample from the chunk partials (ties: the lowest id). A row that is not
    keyed has no partials written (its answer is not used): it reads none, so that no
    uninitialised value (a NaN) reaches the reduction (Triton's interpreter raises on an
    all-NaN argmax)."""
    c = tl.arange(0, NC_PAD)
    read = (c < num_chunks) & ((c * 0 + keyed.to(tl.int32)) > 0)  # [NC_PAD]
    v = tl.load(val_ptr + row * num_chunks + c, mask=read, other=float("-inf"))
    _, at = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
    return tl.load(idx_ptr + row * num_chunks + at)


@triton.jit(do_not_specialize=["u_stride"])  # (max_spec_len: 1 or more would recompile)
def _decide_kernel(
    logits_ptr,  # [num_rows, vocab_size]
    logits_stride,
    cu_ptr,  # [batch_size] int32
    draft_ids_ptr,  # [num_tokens] int64
    draft_probs_ptr,  # [num_tokens, vocab_size] (unused without HAS_DRAFT_PROBS)
    draft_stride,
    inv_temp_ptr,  # [batch_size] float32
    greedy_ptr,  # [batch_size] int32 (unused with ALL_GREEDY)
    q_ptr,  # [batch_size, vocab_size] float32
    q_stride,
    u_ptr,  # [batch_size, >= max_spec_len] float32
    u_stride,
    max_ptr, sum_ptr, ent_ptr, arg_ptr, bad_ptr,  # [num_rows, num_chunks] partials
    stop_ptr,  # [batch_size] int32 out: stop position, -1 for invalid input
    token_ptr,  # [batch_size] int32 out: token at the stop position, -1 when raced
    race_val_ptr,  # [batch_size, 2, num_chunks] float32 out: best residual / target score
    race_idx_ptr,  # [batch_size, 2, num_chunks] int32 out: their token ids
    keys_ptr,  # [batch_size, 4] int64 (KEYED)
    keyed_val_ptr,  # [num_rows, num_chunks] float32 (KEYED)
    keyed_idx_ptr,  # [num_rows, num_chunks] int32 (KEYED)
    vocab_size,
    num_chunks,
    posterior_threshold,
    posterior_alpha,
    TYPICAL: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,
    ALL_GREEDY: tl.constexpr,
    KEYED: tl.constexpr,
    CHUNK: tl.constexpr,
    NC_PAD: tl.constexpr,
):
    req = tl.program_id(0)
    chunk = tl.program_id(1)
    start, k = _request_range(cu_ptr, req)
    first_row = start + req
    inv_t = tl.load(inv_temp_ptr + req)
    if ALL_GREEDY:
        greedy = k >= 0
    else:
        greedy = tl.load(greedy_ptr + req) != 0
    keyed = k < 0  # (False)
    if KEYED:
        keyed = tl.load(keys_ptr + req * 4) != 0
    stop = k
    stop_arg = k * 0
    bad = k * 0
    for j in range(0, k):
        m, s, amax, row_bad, entropy = _combine_row(
            max_ptr, sum_ptr, ent_ptr, arg_ptr, bad_ptr, first_row + j, num_chunks,
            NC_PAD, TYPICAL)
        x = tl.load(draft_ids_ptr + start + j)
        x_ok = (x >= 0) & (x < vocab_size)
        xs = tl.where(x_ok, x, 0)
        logit_x = tl.load(logits_ptr + (first_row + j).to(tl.int64) * logits_stride + xs)
        p_x = tl.exp(logit_x.to(tl.float32) * inv_t - m) / s
        if TYPICAL:
            ok = p_x > tl.minimum(posterior_threshold, posterior_alpha * tl.exp(-entropy))
        else:
            d_x = 1.0
            if HAS_DRAFT_PROBS:
                d_x = tl.load(draft_probs_ptr + (start + j).to(tl.int64) * draft_stride + xs)
                d_x = d_x.to(tl.float32)
            ok = p_x > tl.load(u_ptr + req * u_stride + j) * d_x
        ok = tl.where(greedy, x == amax, ok)
        if KEYED:
            sample = _combine_keyed(keyed_val_ptr, keyed_idx_ptr, first_row + j, num_chunks,
                                    keyed, NC_PAD)
            ok = tl.where(keyed, x == sample, ok)
            amax = tl.where(keyed, sample, amax)  # (the token emitted if this draft fails)
        first_reject = (stop == k) & ((ok == 0) | (x_ok == 0))
        stop = tl.where(first_reject, j, stop)
        stop_arg = tl.where(first_reject, amax, stop_arg)
        bad = bad | row_bad | (x_ok == 0).to(tl.int32)
    m, s, amax, row_bad, entropy = _combine_row(
        max_ptr, sum_ptr, ent_ptr, arg_ptr, bad_ptr, first_row + k, num_chunks, NC_PAD, TYPICAL)
    bad = bad | row_bad
    if KEYED:
        sample = _combine_keyed(keyed_val_ptr, keyed_idx_ptr, first_row + k, num_chunks, keyed,
                                NC_PAD)
        amax = tl.where(keyed, sample, amax)
    stop_arg = tl.where(stop == k, amax, stop_arg)
    if TYPICAL:
        need_race = stop == k
    else:
        need_race = stop >= 0
    need_race = need_race & (greedy == 0) & (keyed == 0)
    if chunk == 0:
        tl.store(stop_ptr + req, tl.where(bad != 0, -1, stop))
        tl.store(token_ptr + req, tl.where(need_race, -1, stop_arg))
    if need_race:
        # The race over this chunk of the stop row: w = max(p - d, 0), scores w / q.
        stop_row = first_row + stop
        m, s, amax, row_bad, entropy = _combine_row(
            max_ptr, sum_ptr, ent_ptr, arg_ptr, bad_ptr, stop_row, num_chunks, NC_PAD, False)
        offs = chunk * CHUNK + tl.arange(0, CHUNK)
        vmask = offs < vocab_size
        x = tl.load(logits_ptr + stop_row.to(tl.int64) * logits_stride + offs, mask=vmask,
                    other=float("-inf")).to(tl.float32)
        x = tl.where((x != x) | (x == float("inf")), float("-inf"), x)
        p = tl.exp(x * inv_t - m) / s
        rejected = stop < k
        if TYPICAL:
            d = p * 0.0
        elif HAS_DRAFT_PROBS:
            d = tl.load(draft_probs_ptr + (start + stop).to(tl.int64) * draft_stride + offs,
                        mask=vmask & (offs * 0 + stop < k), other=0.0).to(tl.float32)
        else:
            x_stop = tl.load(draft_ids_ptr + start + stop, mask=rejected, other=-1)
            d = tl.where(offs == x_stop, 1.0, 0.0)
        w = tl.maximum(p - d, 0.0)
        qv = tl.load(q_ptr + req.to(tl.int64) * q_stride + offs, mask=vmask, other=1.0)
        best_w, idx_w = tl.max(tl.where(w > 0, w / qv, 0.0), axis=0, return_indices=True,
                               return_indices_tie_break_left=True)
        best_p, idx_p = tl.max(tl.where(p > 0, p / qv, 0.0), axis=0, return_indices=True,
                               return_indices_tie_break_left=True)
        slot = req * 2 * num_chunks + chunk
        tl.store(race_val_ptr + slot, best_w)
        tl.store(race_idx_ptr + slot, chunk * CHUNK + idx_w)
        tl.store(race_val_ptr + slot + num_chunks, best_p)
        tl.store(race_idx_ptr + slot + num_chunks, chunk * CHUNK + idx_p)


@triton.jit(do_not_specialize=["out_stride", "max_spec_len"])  # (one kernel for every k)
def _finalize_kernel(
    out_ptr,  # [batch_size, max_spec_len + 1] int64
    out_stride,
    cu_ptr,  # [batch_size] int32
    draft_ids_ptr,  # [num_tokens] int64
    stop_ptr,  # [batch_size] int32
    token_ptr,  # [batch_size] int32
    race_val_ptr,  # [batch_size, 2, num_chunks] float32
    race_idx_ptr,  # [batch_size, 2, num_chunks] int32
    num_chunks,
    max_spec_len,
    NC_PAD: tl.constexpr,
    OUT_PAD: tl.constexpr,
    INVALID: tl.constexpr,
    PLACEHOLDER: tl.constexpr,
):
    req = tl.program_id(0)
    start, k = _request_range(cu_ptr, req)
    stop = tl.load(stop_ptr + req)
    token = tl.load(token_ptr + req)
    if token < 0:
        c = tl.arange(0, NC_PAD)
        cmask = c < num_chunks
        base = req * 2 * num_chunks
        best_w, cw = tl.max(tl.load(race_val_ptr + base + c, mask=cmask, other=-1.0), axis=0,
                            return_indices=True, return_indices_tie_break_left=True)
        best_p, cp = tl.max(tl.load(race_val_ptr + base + num_chunks + c, mask=cmask,
                                    other=-1.0), axis=0,
                            return_indices=True, return_indices_tie_break_left=True)
        token = tl.where(best_w > 0, tl.load(race_idx_ptr + base + cw),
                         tl.load(race_idx_ptr + base + num_chunks + cp))
    p = tl.arange(0, OUT_PAD)
    drafts = tl.load(draft_ids_ptr + start + p, mask=p < stop, other=-1)
    val = tl.where(p < stop, drafts, tl.where(p == stop, token.to(tl.int64), PLACEHOLDER))
    val = tl.where(stop < 0, INVALID, val)
    tl.store(out_ptr + req * out_stride + p, val, mask=p <= max_spec_len)
