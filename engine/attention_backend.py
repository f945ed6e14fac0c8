"""Attention-backend choice for the runner's forwards.

On Hopper (sm_90) and sm_100 with a recent cuDNN, PyTorch tries its cuDNN SDPA backend first.
That backend caches one execution plan per exact set of sizes and strides (batch, heads, query
and key lengths), and every miss builds a plan on the host: tens of milliseconds. A speculative
engine's key length grows every step, so nearly every forward would miss: on an H200 the 4-layer
self-draft measured 170-280 ms per proposal step with cuDNN against 25-43 ms once the same shapes
were planned. The flash and memory-efficient kernels need no per-shape build, so the runner's
forwards run with cuDNN SDPA off (the other backends stay as the user set them).

On CPU, a grouped-query model (fewer key/value heads than query heads) with a mask would have
transformers' SDPA path copy every key and value head ``num_key_value_groups`` times per layer
(``repeat_kv``); it only passes ``enable_gqa`` to SDPA without a mask. A verification step always
has a mask, and on the default model (9 query heads, 3 key/value heads, context 305) the copies
made 5.5 of the 97 ms of a 5-token forward. PyTorch's CPU flash kernel takes masked GQA directly
and returns the same values (compared bit for bit in ``tests/engine/test_attention_backend.py``),
so the runner's CPU forwards use :func:`gqa_sdpa_attention` for that case.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

# The runner's name for transformers' "sdpa" with masked GQA on CPU (registered below).
GQA_SDPA = "specdec_gqa_sdpa"


@contextmanager
def without_cudnn_attention() -> Iterator[None]:
    """cuDNN SDPA off for the block, then restored to its previous (process-wide) setting."""
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
    """transformers' SDPA attention, except that a masked grouped-query call on CPU goes to SDPA
    with ``enable_gqa=True`` instead of repeating the key/value heads. ``query [batch, heads,
    num_new, head_dim]``, ``key``/``value [batch, kv_heads, kv_len, head_dim]``; returns
    ``[batch, num_new, heads, head_dim]`` as transformers' attention functions do."""
    if (query.device.type != "cpu" or attention_mask is None or key.shape[1] == query.shape[1]
            or query.shape[2] == 1  # (one query token: transformers folds the groups itself)
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                         dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
AttentionMaskInterface.register(GQA_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@contextmanager
def cpu_gqa_attention(config: PretrainedConfig, device: torch.device) -> Iterator[None]:
    """On CPU, a model loaded with ``attn_implementation="sdpa"`` runs the block with
    :func:`gqa_sdpa_attention`; its config is restored after (so the same model object, run by
    Hugging Face ``generate``, is left as it was). Elsewhere, nothing changes."""
    if device.type != "cpu" or config._attn_implementation != "sdpa":
        yield
        return
    config._attn_implementation = GQA_SDPA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
