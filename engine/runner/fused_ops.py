"""Fused decoder kernels for the runner's CUDA forwards: RMSNorm, rotary, SiLU-and-multiply.

A decode step of a small batch is bound by its number of kernels, not by their work: past the
matrix products, a decoder layer's time is mostly launches of a few microseconds each
(docs/design.md, "Measured reasons behind the runner's choices"). Transformers' ``LlamaRMSNorm``
is 8 kernels (a copy to float32, ``pow``, ``mean``, ``+ eps``, ``rsqrt``, ``*``, the copy back,
``* weight``) and ``apply_rotary_pos_emb`` 10 (``* cos``, the negated half, the concatenation,
``* sin``, ``+``, for the queries and the keys). Here the norm is one Triton launch and the
rotary embedding one (queries and keys), each rounding where transformers rounds:

- RMSNorm: ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)``, the statistics in float32;
- rotary: ``q * cos + rotate_half(q) * sin``, each product rounded to the tensors' dtype before
  the sum, as PyTorch's three separate operations do;
- SiLU-and-multiply (:func:`silu_mul`, for :mod:`engine.runner.fused_projections`' stacked gate
  and up products): ``silu(gate)`` rounded to the dtype, then the product, as PyTorch's two
  operations.

So a fused forward differs from the unfused one only by the order of the float32 sum of
squares and the square root's approximation (its result rounded to the dtype: at most one unit
in the last place, rarely; bit for bit on CPU through Triton's interpreter).

Where they run (:func:`install_fused_ops`, when a runner takes a CUDA model in bf16 or float32;
an fp16 model keeps transformers' code, see ``_COMPILED_DTYPES``): every module of
the model whose class is named ``*RMSNorm`` and computes exactly that formula (checked on its
own weights against its own forward before it is replaced: in bf16 / fp16 at most one unit in
the last place apart, in at most 1 element in 64, so Gemma's ``1 + weight`` form, OLMo-2's
product in float32 and any other variant keep their own code), and the ``apply_rotary_pos_emb``
of each attention module's transformers module when it is the LLaMA form (checked the same way;
partial rotary, where the tables are narrower than the heads, and a call of any other signature
go to the original). Both take effect only inside the runner's own forwards
(:func:`fused_forward`, a context variable, like
``engine.runner.attention_backend.gqa_attention``): Hugging Face ``generate`` on the same model
object runs transformers' code unchanged. The PyTorch references are
:func:`rms_norm_reference` and :func:`rotary_reference`.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = ["PRECOMPUTED", "fits_rotary", "fused_active", "fused_forward", "install_fused_ops",
           "projections_active", "rms_norm", "rms_norm_reference", "rotary", "rotary_reference",
           "runs_here", "silu_mul", "silu_mul_reference"]

_ACTIVE: ContextVar[bool] = ContextVar("specdec_fused_ops", default=False)
# (engine/runner/fused_projections.py: stacked products, not batch-invariant, so a separate flag)
_PROJECTIONS: ContextVar[bool] = ContextVar("specdec_fused_projections", default=False)
_ORIGINAL = "_specdec_original_rotary"  # a patched transformers module keeps its function here
# a fused norm's result computed ahead, (input, output): engine/runner/fused_layers.py
PRECOMPUTED = "_specdec_precomputed"
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # (Triton runs CPU tensors too)
ROTARY_ROWS = 16  # rows (a head of a token) a rotary program takes at most ...
ROTARY_ELEMENTS = 512  # ... and half-rows' elements


# Compiled, the kernels take bf16 and float32 tensors only: in float16 the compiled rotary does
# not round its products where PyTorch does (docs/design.md, "Measured reasons behind the
# runner's choices"), so fp16 models keep transformers' code on a GPU. Through the interpreter
# (the CPU tests) fp16 matches bit for bit.
_COMPILED_DTYPES = (torch.bfloat16, torch.float32)


def fused_active() -> bool:
    """Inside a runner's forward with the fused kernels on (:func:`fused_forward`)."""
    return _ACTIVE.get()


def runs_here(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these tensors: all on one CUDA device (or anywhere under
    Triton's interpreter), bf16 or float32 when compiled. A layer that accelerate runs on CPU
    keeps transformers' code."""
    device = tensors[0].device
    return (device.type == "cuda" or _INTERPRETED) and all(
        t.device == device and not isinstance(t, DTensor)
        and (_INTERPRETED or t.dtype in _COMPILED_DTYPES) for t in tensors)


def projections_active() -> bool:
    """Whether this thread or task is inside :func:`fused_forward` with ``projections``."""
    return _PROJECTIONS.get()


@contextmanager
def fused_forward(enabled: bool = True, projections: bool = False) -> Iterator[None]:
    """The fused kernels for the forwards in this block (this thread or task only);
    ``projections``: the stacked products too (:mod:`engine.runner.fused_projections`)."""
    token, stacked = _ACTIVE.set(enabled), _PROJECTIONS.set(enabled and projections)
    try:
        yield
    finally:
        _PROJECTIONS.reset(stacked)
        _ACTIVE.reset(token)


def _on(x: torch.Tensor) -> AbstractContextManager:
    """``x``'s CUDA device made current for a launch: Triton launches on the current device,
    and a layer that accelerate placed on another GPU (a pipeline) would have its kernel run on
    the wrong one (docs/history.md, "Across GPUs")."""
    if x.device.type == "cuda" and x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return nullcontext()


# ---- rounding -----------------------------------------------------------------------------------

_FLOAT32, _BFLOAT16, _FLOAT16 = 0, 1, 2  # what a float32 value is rounded to (a constexpr)


def _rounding(dtype: torch.dtype) -> int:
    return {torch.bfloat16: _BFLOAT16, torch.float16: _FLOAT16}.get(dtype, _FLOAT32)


@triton.jit
def _rounded(x, TO: tl.constexpr):
    """float32 ``x`` rounded to the nearest ``TO`` value (ties to even), still float32. bf16 by
    its bits: Triton's interpreter (the CPU tests) truncates a cast to bf16, the GPU rounds. A
    NaN stays NaN (the carry of the rounding would turn some NaN patterns into 0 or inf)."""
    if TO == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif TO == 2:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


# ---- RMSNorm ------------------------------------------------------------------------------------

@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, x_stride, out_stride, n_cols, eps,
                     X_TO: tl.constexpr, OUT_TO: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    live = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=live, other=0.0).to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    normed = _rounded(x * tl.rsqrt(mean_square + eps), X_TO)  # (back to x's dtype)
    w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    out = _rounded(normed * w, OUT_TO)
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=live)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [..., n]`` normalised over its last dimension times ``weight [n]``, in one launch
    (the dtype of ``weight * x``, as transformers' result)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)  # [m, n] (a view when x's rows are contiguous)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.result_type(weight, x), device=x.device)  # [m, n]
    if rows.shape[0]:
        with _on(x):
            _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, rows.stride(0), out.stride(0), n,
                                               eps, X_TO=_rounding(x.dtype),
                                               OUT_TO=_rounding(out.dtype),
                                               BLOCK=triton.next_power_of_2(n))
    return out.view(x.shape)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`rms_norm` in PyTorch: transformers' ``LlamaRMSNorm.forward``."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return weight * (x.to(torch.float32) * torch.rsqrt(variance + eps)).to(x.dtype)


def _fused_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    # (a fused layer before it computed this norm with its residual add: that very input only)
    ahead = self.__dict__.pop(PRECOMPUTED, None)
    if ahead is not None and ahead[0] is hidden_states:
        return ahead[1]
    if _ACTIVE.get() and runs_here(hidden_states, self.weight):
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)
    return type(self).forward(self, hidden_states)


# ---- rotary embedding ---------------------------------------------------------------------------

@triton.jit
def _rotated(x_ptr, xs_b, xs_h, xs_s, cos_ptr, sin_ptr, cs_b, cs_s, block, count, heads, seq,
             TO: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """Rows ``block * ROWS ...`` of ``count`` of ``x`` (a row is a (batch, head, position), the
    position fastest) rotated: their batch, head and position ``[ROWS]``, the column offsets
    ``[BLOCK]``, the live elements ``[ROWS, BLOCK]`` of a half row, and the rotated first and
    second halves ``[ROWS, BLOCK]`` (float32, each rounded to the dtype)."""
    r = block * ROWS + tl.arange(0, ROWS)
    b, h, s = r // (seq * heads), (r // seq) % heads, r % seq
    i = tl.arange(0, BLOCK)
    live = (r < count)[:, None] & (i < HALF)[None, :]
    x_row = (x_ptr + b * xs_b + h * xs_h + s * xs_s)[:, None] + i[None, :]
    c_row = (cos_ptr + b * cs_b + s * cs_s)[:, None] + i[None, :]
    s_row = (sin_ptr + b * cs_b + s * cs_s)[:, None] + i[None, :]
    x1 = tl.load(x_row, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + HALF, mask=live, other=0.0).to(tl.float32)
    c1 = tl.load(c_row, mask=live, other=0.0).to(tl.float32)
    c2 = tl.load(c_row + HALF, mask=live, other=0.0).to(tl.float32)
    s1 = tl.load(s_row, mask=live, other=0.0).to(tl.float32)
    s2 = tl.load(s_row + HALF, mask=live, other=0.0).to(tl.float32)
    # (each product rounded to the dtype, then the sum: PyTorch's x * cos + rotate_half(x) * sin)
    first = _rounded(_rounded(x1 * c1, TO) + _rounded(-x2 * s1, TO), TO)
    second = _rounded(_rounded(x2 * c2, TO) + _rounded(x1 * s2, TO), TO)
    return b, h, s, i, live, first, second


@triton.jit
def _rotate_rows(x_ptr, out_ptr, block, count, heads, seq, xs_b, xs_h, xs_s, os_b, os_h, os_s,
                 cos_ptr, sin_ptr, cs_b, cs_s, TO: tl.constexpr, HALF: tl.constexpr,
                 BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """Rows ``block * ROWS ...`` (of ``count``; a row is a (batch, head, position)) of ``x``
    rotated into ``out``."""
    b, h, s, i, live, first, second = _rotated(x_ptr, xs_b, xs_h, xs_s, cos_ptr, sin_ptr, cs_b,
                                               cs_s, block, count, heads, seq, TO, HALF, BLOCK,
                                               ROWS)
    o_row = (out_ptr + b * os_b + h * os_h + s * os_s)[:, None] + i[None, :]
    ty = out_ptr.dtype.element_ty
    tl.store(o_row, first.to(ty), mask=live)
    tl.store(o_row + HALF, second.to(ty), mask=live)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, q_rows, k_rows, q_heads,
                   k_heads, seq, qs_b, qs_h, qs_s, ks_b, ks_h, ks_s, qos_b, qos_h, qos_s, kos_b,
                   kos_h, kos_s, cs_b, cs_s, TO: tl.constexpr, HALF: tl.constexpr,
                   BLOCK: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)  # the queries' row blocks, then the keys'
    q_blocks = tl.cdiv(q_rows, ROWS)
    if pid < q_blocks:
        _rotate_rows(q_ptr, qo_ptr, pid, q_rows, q_heads, seq, qs_b, qs_h, qs_s, qos_b, qos_h,
                     qos_s, cos_ptr, sin_ptr, cs_b, cs_s, TO, HALF, BLOCK, ROWS)
    else:
        _rotate_rows(k_ptr, ko_ptr, pid - q_blocks, k_rows, k_heads, seq, ks_b, ks_h, ks_s,
                     kos_b, kos_h, kos_s, cos_ptr, sin_ptr, cs_b, cs_s, TO, HALF, BLOCK, ROWS)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The LLaMA rotary embedding of ``q [batch, heads, seq, head_dim]`` and ``k [batch,
    kv_heads, seq, head_dim]`` by ``cos``/``sin [batch or 1, seq, head_dim]`` (transformers'
    ``apply_rotary_pos_emb`` with ``unsqueeze_dim=1``); every last dimension contiguous. One
    launch for both (each output in its input's memory layout, as PyTorch's elementwise
    results)."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    launch = RotaryLaunch.of(q, k, cos)
    if launch.grid[0]:
        with _on(q):
            _rotary_kernel[launch.grid](
                q, k, q_out, k_out, cos, sin, launch.q_rows, launch.k_rows, q.shape[1],
                k.shape[1], q.shape[2], *q.stride()[:3], *k.stride()[:3], *q_out.stride()[:3],
                *k_out.stride()[:3], launch.cos_b, cos.stride(1), TO=_rounding(q.dtype),
                HALF=q.shape[3] // 2, BLOCK=launch.block, ROWS=launch.rows)
    return q_out, k_out


class RotaryLaunch(NamedTuple):
    """The sizes of a rotary launch (:func:`rotary`, ``rotary_write.rotary_write``): the
    queries' and keys' rows, rows a program (a program a row left most of its threads idle,
    and a batch-32 step of the 1B launched 1,280 of them), the half-row tile, the tables' batch
    stride (0: shared) and the grid."""

    q_rows: int
    k_rows: int
    rows: int
    block: int
    cos_b: int
    grid: tuple[int]

    @staticmethod
    def of(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> RotaryLaunch:
        batch, q_heads, seq, dim = q.shape
        q_rows, k_rows = batch * q_heads * seq, batch * k.shape[1] * seq
        block = triton.next_power_of_2(dim // 2)
        rows = max(1, min(ROTARY_ROWS, ROTARY_ELEMENTS // block))
        return RotaryLaunch(q_rows, k_rows, rows, block,
                            cos.stride(0) if cos.shape[0] > 1 else 0,
                            (triton.cdiv(q_rows, rows) + triton.cdiv(k_rows, rows),))


def rotary_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rotary` in PyTorch: transformers' LLaMA ``apply_rotary_pos_emb``."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def fits_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`rotary` computes this call: full rotary, LLaMA's layout."""
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    dim = q.shape[-1]
    return (k.shape[-1] == dim and dim % 2 == 0 and cos.shape[-1] == dim
            and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2] == cos.shape[1]
            and cos.shape[0] in (1, q.shape[0]) and q.dtype == k.dtype == cos.dtype == sin.dtype
            and q.stride(-1) == k.stride(-1) == cos.stride(-1) == sin.stride(-1) == 1
            and sin.stride() == cos.stride())


def _fused_rotary(original: Callable) -> Callable:
    def apply_rotary_pos_emb(*args, **kwargs):
        # (only the call transformers' LLaMA attention makes: q, k, cos, sin by position, no
        # position_ids, unsqueeze_dim=1; any other call, whatever its signature, is the
        # original's, in or out of a runner forward)
        plain = len(args) == 4 and kwargs.keys() <= {"unsqueeze_dim"} and kwargs.get(
            "unsqueeze_dim", 1) == 1
        if (_ACTIVE.get() and plain and all(isinstance(a, torch.Tensor) for a in args)
                and fits_rotary(*args) and runs_here(*args)):
            return rotary(*args)
        return original(*args, **kwargs)

    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


# ---- SiLU and multiply ---------------------------------------------------------------------------

@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, gu_stride, out_stride, n_cols,
                     TO: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < n_cols
    gate = tl.load(gu_ptr + row * gu_stride + cols, mask=live, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * gu_stride + n_cols + cols, mask=live, other=0.0).to(tl.float32)
    # (each rounded where PyTorch's two operations round: silu(gate), then the product)
    activated = _rounded(gate / (1.0 + tl.exp(-gate)), TO)
    out = _rounded(activated * up, TO)
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=live)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up [..., 2 * n]`` (the gate's columns first), in one launch:
    ``[..., n]`` of ``gate_up``'s dtype, as ``act_fn(gate_proj(x)) * up_proj(x)`` in transformers'
    gated MLPs."""
    n = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * n)  # [m, 2n]
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], n), dtype=gate_up.dtype, device=gate_up.device)  # [m, n]
    if rows.shape[0]:
        block = min(1024, triton.next_power_of_2(n))
        with _on(gate_up):
            _silu_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](
                rows, out, rows.stride(0), out.stride(0), n, TO=_rounding(gate_up.dtype),
                BLOCK=block)
    return out.view(*gate_up.shape[:-1], n)


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """:func:`silu_mul` in PyTorch."""
    gate, up = gate_up.chunk(2, dim=-1)
    return nn.functional.silu(gate) * up


# ---- installation -------------------------------------------------------------------------------

def _same(fused: torch.Tensor, reference: torch.Tensor) -> bool:
    """The fused result is the reference's: in bf16 / fp16 at most one unit in the last place
    apart, in at most 1 element in 64 (the order of the float32 sum of squares; a variant that
    rounds elsewhere, e.g. OLMo-2's norm multiplying by the weight in float32, differs in a
    quarter of them); in float32 within a few units of rounding."""
    if fused.shape != reference.shape or fused.dtype != reference.dtype:
        return False
    if reference.dtype in (torch.bfloat16, torch.float16):
        a, b = fused.view(torch.int16).int(), reference.view(torch.int16).int()
        apart = (a - b).abs()
        return bool(apart.max() <= 1) and int((apart > 0).sum()) * 64 <= apart.numel()
    tolerance = 8 * torch.finfo(reference.dtype).eps
    return torch.allclose(fused.float(), reference.float(), rtol=tolerance, atol=tolerance)


@torch.no_grad()
def _norm_is_llama(module: nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(eps, float):
        return False
    gen = torch.Generator(device="cpu").manual_seed(0)  # (the global RNGs are not advanced)
    x = (torch.randn(8, weight.shape[0], generator=gen) * 3).to(weight.device, dtype)
    try:
        with fused_forward(False):
            reference = module(x)
        return _same(rms_norm(x, weight, eps), reference)
    except Exception:  # (a module that cannot take this input keeps its own forward)
        return False


@torch.no_grad()
def _rotary_is_llama(function: Callable, device: torch.device, dtype: torch.dtype) -> bool:
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k = (torch.randn(2, h, 5, 16, generator=gen).to(device, dtype) for h in (4, 2))
    angles = torch.randn(2, 5, 16, generator=gen).to(device)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    try:
        with fused_forward(False):
            want = function(q, k, cos, sin)
        got = rotary(q, k, cos, sin)
        return all(_same(g, w) for g, w in zip(got, want, strict=True))
    except Exception:  # (another signature or layout: left alone)
        return False


def install_fused_ops(model: nn.Module, device: torch.device) -> dict[str, int]:
    """Replace the model's LLaMA-form RMSNorms and rotary embedding by the fused kernels inside
    the runner's forwards (see the module docstring); returns how many norms and rotary modules
    were taken. Nothing is replaced where a check fails."""
    dtype = next(model.parameters()).dtype
    if not (_INTERPRETED or dtype in _COMPILED_DTYPES):  # (fp16 on a GPU: see _COMPILED_DTYPES)
        return {"norms": 0, "rotary_modules": 0}
    verdicts: dict[type, bool] = {}
    norms = 0
    for module in model.modules():
        cls = type(module)
        own = module.__dict__.get("forward")
        if getattr(own, "__func__", None) is _fused_norm_forward:  # (an earlier runner's)
            norms += 1
            continue
        # (a forward of the instance's own is someone else's: accelerate's hooks)
        if (not cls.__name__.endswith("RMSNorm") or own is not None
                or isinstance(getattr(module, "weight", None), DTensor)):
            continue
        if cls not in verdicts:
            verdicts[cls] = _norm_is_llama(module, device, dtype)
        if verdicts[cls]:
            module.forward = types.MethodType(_fused_norm_forward, module)
            norms += 1
    rotaries = 0
    seen: set[str] = set()
    for module in model.modules():
        name = type(module).__module__
        source = sys.modules.get(name)
        function = getattr(source, "apply_rotary_pos_emb", None)
        if (name in seen or source is None or not callable(function)
                or not type(module).__name__.endswith("Attention")):
            continue
        seen.add(name)
        if getattr(source, _ORIGINAL, None) is not None:  # (patched by an earlier runner)
            rotaries += 1
            continue
        if _rotary_is_llama(function, device, dtype):
            setattr(source, _ORIGINAL, function)
            source.apply_rotary_pos_emb = _fused_rotary(function)
            rotaries += 1
    return {"norms": norms, "rotary_modules": rotaries}
