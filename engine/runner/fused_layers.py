"""LLaMA-form decoder layers whose residual adds run inside the next RMSNorm's kernel.

Why. A decode step of a small batch is bound by its number of kernels (:mod:`engine.runner.
fused_ops`): after the fused norms, rotary and SiLU-and-multiply, a layer of the default model
still launched two residual adds of its own (``residual + hidden_states`` after attention and
after the MLP; their share of a step: docs/design.md, "Measured reasons behind the runner's
choices"). Each add is followed by an RMSNorm of its result
(the layer's post-attention norm; the next layer's input norm, or the model's final norm after
the last layer), so one kernel can do both: :func:`add_rms_norm` writes the sum and its norm.

What it computes. The sum is rounded to the dtype as PyTorch's add rounds it (float32 add, then
round to nearest even), and the norm is :func:`engine.runner.fused_ops.rms_norm`'s arithmetic on
that rounded sum, in the same launch shape: a fused layer gives the same bits as the fused norm
after a separate add.

How the add after the MLP reaches the next norm. Transformers' model loop passes each layer's
output to the next layer, which calls its input norm first; the fused layer
(:func:`_layer_forward`) computes that norm with the sum and leaves ``(sum, normed)`` on the norm
module it belongs to (``fused_ops.PRECOMPUTED``). The fused norm's forward returns the stored
result when it is called with that very tensor (an identity check), and computes it otherwise (a
caller that runs a part of the layers, a tensor changed in between): the stored pair never
stands in for another input.

Where (:func:`install_fused_layers`, after :func:`engine.runner.fused_ops.install_fused_ops`): the
layers of a model's ``layers`` list whose forward is transformers' ``LlamaDecoderLayer.forward``
(the same code: Mistral's, Qwen2's and Qwen3's are generated from it), whose two norms and
successor norm took the fused kernel, and that have no forward of their own (accelerate's hooks).
Only inside the runner's forwards (``fused_forward``); anywhere else transformers' code runs.

Attention (:func:`install_fused_attention`). A LLaMA-form attention module (transformers'
``LlamaAttention.forward``, its module's rotary in the fused kernel) hands its rotary embedding
and the cache's write to the cache in one call, ``update_rotated``
(:mod:`engine.runner.rotary_write`: one launch instead of the rotary's and the write's), where
the cache takes it (the paged runner's steps); otherwise it runs transformers' two steps.
"""

from __future__ import annotations

import inspect
import sys
import types

import torch
import triton
import triton.language as tl
from torch import nn
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer

from engine.runner.fused_ops import (
    _ORIGINAL,
    PRECOMPUTED,
    _fused_norm_forward,
    _on,
    _rounded,
    _rounding,
    fused_active,
    runs_here,
)
from engine.runner.gemv import module_product

__all__ = ["add_rms_norm", "add_rms_norm_reference", "install_fused_attention",
           "install_fused_layers"]

_NEXT_NORM = "_specdec_next_norm"  # a fused layer's successor norm (its __dict__, not a submodule)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, x_stride, r_stride, sum_stride,
                         out_stride, n_cols, eps, X_TO: tl.constexpr, OUT_TO: tl.constexpr,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    live = cols < n_cols
    a = tl.load(x_ptr + row * x_stride + cols, mask=live, other=0.0).to(tl.float32)
    b = tl.load(r_ptr + row * r_stride + cols, mask=live, other=0.0).to(tl.float32)
    x = _rounded(a + b, X_TO)  # (the add's result in its dtype, as PyTorch's add rounds it)
    tl.store(sum_ptr + row * sum_stride + cols, x.to(sum_ptr.dtype.element_ty), mask=live)
    # (from here rms_norm's kernel, on the rounded sum)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    normed = _rounded(x * tl.rsqrt(mean_square + eps), X_TO)
    w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    out = _rounded(normed * w, OUT_TO)
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=live)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x [..., n]`` as ``[m, n]`` rows with contiguous columns."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, rms_norm(s) * weight)`` for ``s = residual + x`` (``x``, ``residual [..., n]`` of
    one dtype, ``weight [n]``), in one launch: the sum in the inputs' dtype, the norm in
    ``weight * s``'s (see the module docstring)."""
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(f"x and residual must have one shape and dtype, got {tuple(x.shape)} "
                         f"{x.dtype} and {tuple(residual.shape)} {residual.dtype}")
    n = x.shape[-1]
    a, b = _rows(x), _rows(residual)  # [m, n]
    total = torch.empty(a.shape, dtype=x.dtype, device=x.device)  # [m, n]
    out = torch.empty(a.shape, dtype=torch.result_type(weight, x), device=x.device)  # [m, n]
    if a.shape[0]:
        with _on(x):
            _add_rms_norm_kernel[(a.shape[0],)](
                a, b, weight, total, out, a.stride(0), b.stride(0), total.stride(0),
                out.stride(0), n, eps, X_TO=_rounding(x.dtype), OUT_TO=_rounding(out.dtype),
                BLOCK=triton.next_power_of_2(n))
    return total.view(x.shape), out.view(x.shape)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`add_rms_norm` in PyTorch: transformers' add, then ``LlamaRMSNorm.forward``."""
    total = residual + x
    variance = total.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return total, weight * (total.to(torch.float32) * torch.rsqrt(variance + eps)).to(x.dtype)


def _add_and_norm(x: torch.Tensor, residual: torch.Tensor, norm: nn.Module
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    return add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)


def _layer_forward(self: nn.Module, hidden_states: torch.Tensor, *args,
                   **kwargs) -> torch.Tensor:
    """``LlamaDecoderLayer.forward`` with each residual add inside the norm after it (the next
    norm's result left on that norm: module docstring); transformers' own forward outside the
    runner's forwards, off Triton's devices, or for a call with more positional arguments."""
    after = self.__dict__[_NEXT_NORM]
    post = self.post_attention_layernorm
    if args or not (fused_active() and runs_here(hidden_states, post.weight, after.weight)):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    attended, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
    residual, normed = _add_and_norm(attended, hidden_states, post)
    total, normed = _add_and_norm(self.mlp(normed), residual, after)
    after.__dict__[PRECOMPUTED] = (total, normed)  # (taken by after's forward: this tensor only)
    return total


def _code(function) -> tuple[bytes, tuple[str, ...]]:
    code = inspect.unwrap(function).__code__
    return code.co_code, code.co_names


def _is_llama_layer(layer: nn.Module) -> bool:
    """Transformers' LLaMA decoder layer code, with its norms in the fused kernel and no forward
    of the instance's own (another's hooks)."""
    norms = [getattr(layer, name, None) for name in ("input_layernorm", "post_attention_layernorm")]
    return ("forward" not in layer.__dict__ and all(map(_takes_fused_norm, norms))
            and isinstance(getattr(layer, "self_attn", None), nn.Module)
            and isinstance(getattr(layer, "mlp", None), nn.Module)
            and _code(type(layer).forward) == _code(LlamaDecoderLayer.forward))


def _takes_fused_norm(module: object) -> bool:
    forward = getattr(module, "__dict__", {}).get("forward")
    return getattr(forward, "__func__", None) is _fused_norm_forward


def install_fused_layers(model: nn.Module) -> int:
    """Fuse the residual adds of ``model``'s LLaMA-form decoder layers into the norms after them
    (module docstring); returns how many layers take it (0: none, e.g. norms left unfused)."""
    base = getattr(model, "base_model", model)
    layers, final = getattr(base, "layers", None), getattr(base, "norm", None)
    if not isinstance(layers, nn.ModuleList) or not _takes_fused_norm(final):
        return 0
    taken = 0
    for i, layer in enumerate(layers):
        own = layer.__dict__.get("forward")
        if getattr(own, "__func__", None) is _layer_forward:  # (an earlier runner's)
            taken += 1
            continue
        after = getattr(layers[i + 1], "input_layernorm", None) if i + 1 < len(layers) else final
        if _is_llama_layer(layer) and _takes_fused_norm(after):
            layer.__dict__[_NEXT_NORM] = after  # (not a submodule: the state dict stays)
            layer.forward = types.MethodType(_layer_forward, layer)
            taken += 1
    return taken


def _attention_forward(self: nn.Module, hidden_states: torch.Tensor, *args,
                       **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``LlamaAttention.forward`` with the rotary embedding and the cache's write in one launch
    where the cache takes them (``PagedKVCache.update_rotated``: the paged runner's steps);
    transformers' own forward outside the runner's forwards, for a cache without that method or
    a call with more positional arguments."""
    # (newer transformers name the cache argument "cache", older ones "past_key_values")
    name = "cache" if "cache" in kwargs else "past_key_values"
    cache = kwargs.get(name)
    rotated_update = getattr(cache, "update_rotated", None)
    if args or rotated_update is None or not fused_active() or "position_embeddings" not in kwargs:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    source = sys.modules[type(self).__module__]  # (its rotary, attention functions)
    position_embeddings = kwargs.pop("position_embeddings")
    attention_mask = kwargs.pop("attention_mask", None)
    del kwargs[name]
    kwargs.pop("cache_position", None)  # (a cache argument, not the attention function's)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    # each [batch_size, heads, num_new, head_dim] (stacked products: views of one)
    query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    done = rotated_update(query, key, value, cos, sin, self.layer_idx)
    if done is None:  # (transformers' two steps: the fused rotary, then the cache's write)
        query, key = source.apply_rotary_pos_emb(query, key, cos, sin)
        key, value = cache.update(key, value, self.layer_idx)
    else:
        query, key, value = done
    interface = source.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                             source.eager_attention_forward)
    attended, weights = interface(self, query, key, value, attention_mask,
                                  dropout=0.0 if not self.training else self.attention_dropout,
                                  scaling=self.scaling, **kwargs)
    attended = attended.reshape(*input_shape, -1).contiguous()
    return module_product(self.o_proj, attended), weights  # (engine/runner/gemv.py)


def _is_llama_attention(module: nn.Module) -> bool:
    """Transformers' LLaMA attention code, whose module's rotary took the fused kernel, with no
    forward of the instance's own."""
    return ("forward" not in module.__dict__
            and getattr(sys.modules.get(type(module).__module__), _ORIGINAL, None) is not None
            and _code(type(module).forward) == _code(LlamaAttention.forward))


def install_fused_attention(model: nn.Module) -> int:
    """Run the rotary embedding and the KV cache's write of ``model``'s LLaMA-form attention
    modules in one launch where the cache takes it (:func:`_attention_forward`); returns how
    many modules take it (after :func:`engine.runner.fused_ops.install_fused_ops`, whose
    rotary they need)."""
    taken = 0
    for module in model.modules():
        own = module.__dict__.get("forward")
        if getattr(own, "__func__", None) is _attention_forward:  # (an earlier runner's)
            taken += 1
        elif isinstance(module, nn.Module) and _is_llama_attention(module):
            module.forward = types.MethodType(_attention_forward, module)
            taken += 1
    return taken
