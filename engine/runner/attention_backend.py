"""Attention-backend choice for the runner's forwards.

On Hopper (sm_90) and sm_100 with a recent cuDNN, PyTorch tries its cuDNN SDPA backend first. That
backend caches one execution plan per exact set of sizes and strides (batch, heads, query and key
lengths), and every miss builds a plan on the host: tens of milliseconds. A speculative engine's
key length grows every step, so nearly every forward would miss (docs/design.md, "Measured reasons
behind the runner's choices"). The flash and memory-efficient kernels need no per-shape build, so
the runner's forwards on CUDA run with cuDNN SDPA off (the other backends stay as the user set
them).

Grouped-query models (fewer key/value heads than query heads) with a mask: transformers' SDPA
path copies every key and value head ``num_key_value_groups`` times per layer (``repeat_kv``)
whenever it is given a mask, and the runner gives one to every verification step and to every
step of sequences of different lengths. A runner points an ``sdpa`` model at
:func:`gqa_sdpa_attention` once (:func:`install_gqa_attention`); inside the runner's own forwards
(:func:`gqa_attention`, a context variable: no other thread, task or caller sees it) it reads the
shared heads in place, and everywhere else it is transformers' ``sdpa`` unchanged:

- on CPU, SDPA with ``enable_gqa=True``: PyTorch's CPU flash kernel takes masked GQA directly
  and returns the same values bit for bit;
- on CUDA, where the kernels that take a mask (memory-efficient, math) do not all take
  ``enable_gqa``, the query heads of one group are folded into the query rows: ``[batch,
  heads, n, d]`` becomes ``[batch, kv_heads, groups * n, d]`` against the unrepeated keys, with
  the mask's rows repeated per group.

What the copies and the cuDNN plans cost: docs/design.md, "Measured reasons behind the runner's
choices".

Paged reads (the runner's ``attention_backend="paged"``). Inside :func:`paged_attention_step`
(a context variable again) the same registered function reads the KV pool in place: the cache's
``update`` has returned the layer's whole pool ``[1, kv_heads, num_rows, head_dim]``, and the
step's slot table, slots, mask limits and tree ancestors (:class:`PagedStep`) say which rows each
query sees (:mod:`engine.runner.paged_attention`: the Triton kernel on CUDA, its PyTorch
reference on CPU). The 4-D mask is neither built by the runner nor by transformers (the mask
function answers None inside such a step).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from engine.runner import paged_attention as paged

# The runner's name for transformers' "sdpa" without repeat_kv (registered below).
GQA_SDPA = "specdec_gqa_sdpa"


# True inside a runner forward that wants the shared heads read in place (this thread or task
# only: a ContextVar, never a process-wide switch).
_GQA_ACTIVE: ContextVar[bool] = ContextVar("specdec_gqa_active", default=False)


@dataclass(frozen=True)
class PagedStep:
    """What a forward's paged attention reads besides the queries and the pool: ``slot_table
    [num_slots, table_width]``, ``slots [batch]``, ``limits``/``ancestors [batch, num_new]``
    (device tensors: a CUDA graph's static inputs), ``kv_len`` (the longest row's key columns;
    the CPU reference reads that many), ``plan`` (the kernel's launch: split-K shares, key
    block, loading ahead) and ``chain_order`` (deterministic mode: the kernel's chain order,
    one split)."""

    slot_table: torch.Tensor
    slots: torch.Tensor
    limits: torch.Tensor
    ancestors: torch.Tensor
    kv_len: int
    plan: paged.SplitPlan
    chain_order: bool = False


# The paged step of the runner forward under way in this thread or task (None: gather reads).
_PAGED_STEP: ContextVar[PagedStep | None] = ContextVar("specdec_paged_step", default=None)


@contextmanager
def without_cudnn_attention(device: torch.device) -> Iterator[None]:
    """cuDNN SDPA off for a forward on ``device``, then restored to the caller's setting.

    PyTorch exposes its SDPA backend choice only as a process-wide flag, so on CUDA this is the
    one setting a runner forward changes for its duration; off CUDA the flag is never read and
    nothing is touched."""
    if device.type != "cuda":
        yield
        return
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(enabled)


def gqa_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, attention_mask: torch.Tensor | None,
                       dropout: float = 0.0, scaling: float | None = None,
                       **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except that a masked grouped-query call does not repeat the
    key/value heads (see the module docstring). ``query [batch, heads, num_new, head_dim]``,
    ``key``/``value [batch, kv_heads, kv_len, head_dim]``, ``attention_mask [batch or 1, 1,
    num_new, kv_len]``; returns ``[batch, num_new, heads, head_dim]`` as transformers' attention
    functions do."""
    step = _PAGED_STEP.get()
    if step is not None:  # (key/value: the layer's whole pool, [1, kv_heads, num_rows, head_dim])
        return paged_sdpa(query, key[0], value[0], step, scaling), None
    batch, heads, num_new, head_dim = query.shape
    kv_heads = key.shape[1]
    on_cpu = query.device.type == "cpu"
    # (one CPU query token: transformers folds it itself)
    if (not _GQA_ACTIVE.get() or attention_mask is None or kv_heads == heads
            or attention_mask.shape[1] != 1 or (on_cpu and num_new == 1)
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if on_cpu:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                             dropout_p=dropout, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return folded_gqa_sdpa(query, key, value, attention_mask, dropout, scaling), None


def folded_gqa_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor, dropout: float = 0.0,
                    scaling: float | None = None) -> torch.Tensor:
    """Masked GQA through SDPA with each group's query heads folded into the query rows (shapes
    as :func:`gqa_sdpa_attention`'s); returns ``[batch, num_new, heads, head_dim]``."""
    batch, heads, num_new, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads  # head h reads key/value head h // groups, as repeat_kv does
    folded = query.reshape(batch, kv_heads, groups * num_new, head_dim)  # row g * num_new + t
    mask = attention_mask.repeat(1, 1, groups, 1)  # [batch or 1, 1, groups * num_new, kv_len]
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=dropout,
                                         scale=scaling)  # [batch, kv_heads, groups * num_new, d]
    # (splitting a dimension is always a view, whatever the kernel's output strides)
    out = out.view(batch, kv_heads, groups, num_new, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(batch, num_new, heads, head_dim).contiguous()


def paged_sdpa(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, step: PagedStep,
               scaling: float | None) -> torch.Tensor:
    """``query [batch, heads, num_new, head_dim]`` against the pool ``keys``/``values
    [kv_heads, num_rows, head_dim]`` as ``step`` says; ``[batch, num_new, heads, head_dim]``.
    The Triton kernel where it runs (CUDA, or Triton's interpreter), else the reference."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    args = (query, keys, values, step.slot_table, step.slots, step.limits, step.ancestors, scale)
    if query.device.type == "cuda" or paged._INTERPRETED:
        plan = step.plan
        return paged.paged_attention(*args, num_splits=plan.num_splits, block_n=plan.block_n,
                                     chain_order=step.chain_order, prefetch=plan.prefetch)
    return paged.paged_attention_reference(*args, kv_len=step.kv_len)


def gqa_sdpa_mask(*args, **kwargs) -> torch.Tensor | None:
    """transformers' ``sdpa`` mask, except inside a paged step, which needs none."""
    if _PAGED_STEP.get() is not None:
        return None
    return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)


AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
AttentionMaskInterface.register(GQA_SDPA, gqa_sdpa_mask)


@contextmanager
def paged_attention_step(step: PagedStep | None) -> Iterator[None]:
    """Read the pool in place as ``step`` says for the attention calls of this block, in this
    thread or task only (None: the gather backend's reads)."""
    token = _PAGED_STEP.set(step)
    try:
        yield
    finally:
        _PAGED_STEP.reset(token)


def install_gqa_attention(config: PretrainedConfig) -> None:
    """Point an ``sdpa`` model at :func:`gqa_sdpa_attention` once, when a runner takes it. Outside
    a runner forward (:func:`gqa_attention`) that function *is* transformers' ``sdpa`` (the same
    call, the same mask function), so the model behaves as before everywhere else, Hugging Face
    ``generate`` included; other implementations are left alone."""
    if config._attn_implementation == "sdpa":
        config._attn_implementation = GQA_SDPA


@contextmanager
def gqa_attention(enabled: bool = True) -> Iterator[None]:
    """Read the shared key/value heads in place for the attention calls of this block, in this
    thread or task only. ``enabled=False`` (a step without a mask and with one new token, which
    transformers serves without copies) leaves transformers' own path."""
    token = _GQA_ACTIVE.set(enabled)
    try:
        yield
    finally:
        _GQA_ACTIVE.reset(token)
