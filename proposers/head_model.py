"""The draft head's network: one decoder layer over the target's features (EAGLE-style).

EAGLE (Li et al., arXiv 2401.15077) drafts from the target's *features*, the final hidden state
that its output head reads: the pair (feature ``f_j`` at position ``j``, embedding of the token
``x_{j+1}`` sampled there) predicts ``f_{j+1}``, which the target's own output head turns into
the next draft; the prediction is fed back for the next draft. Version 2 of this head (version 1
had no attention) is one LLaMA-style decoder layer::

    x_j  = fc([norm(f_j); norm(e(x_{j+1}))])                 # [hidden]
    h_j  = x_j + o(attention(q(norm(x_j)), keys/values of x_0..x_j))
    f'_j = h_j + down(silu(gate(norm(h_j))) * up(norm(h_j)))   # predicts f_{j+1}

With one layer, the key and value of a position depend on its own pair alone (they are projected
from ``x_j``, before any attention): the engine's verified positions are written into the head's
KV cache without running the rest of the layer, and only the newest position is queried. Rotary
positions as in LLaMA (``rope_theta`` the target's).

The same three pieces (:meth:`DraftHead.inputs`, :meth:`DraftHead.keys_values`,
:meth:`DraftHead.attend`) serve the proposer's cached drafting and training's unrolled blocks
(:meth:`DraftHead.unrolled`), so training sees exactly the computation that drafts.

A *draft vocabulary* (:attr:`DraftHead.vocab`, optional, saved with the weights): the ids of the
tokens the head may draft, the most frequent in the target's own answers. The proposer then
reads a feature out through those rows of the target's output head only (EAGLE-3 and vLLM's
``draft_vocab_size`` do the same): the full output head (49,152 x 576 for the default model)
is most of a draft's work on CPU, and a third of the rows make a proposal about half as long
(docs/performance.md, "Draft head"). A draft outside it is never proposed; the target would
rarely have chosen it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from proposers.head_kernels import (
    chain_attention,
    chain_attention_applies,
    fused_norm_applies,
    fused_rms_norm,
    fused_rotate,
    fused_rotate_applies,
    fused_silu_mul,
    fused_silu_mul_applies,
)

CONFIG_NAME, WEIGHTS_NAME = "draft_head.json", "draft_head.safetensors"
VOCAB_KEY = "draft_vocab"  # the draft vocabulary's tensor in the weights file
VERSION = 2
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "rope_theta")


def rotated(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """:func:`rotate`, by the fused kernel where it applies (drafting on a GPU: one launch
    instead of about a dozen, :mod:`proposers.head_kernels`); ``positions`` broadcast to
    ``x``'s leading dimensions."""
    if tuple(positions.shape) != tuple(x.shape[:-2]):
        positions = positions.broadcast_to(x.shape[:-2])
    if fused_rotate_applies(x, positions):
        return fused_rotate(x, positions, inv_freq)
    return rotate(x, positions, inv_freq)


def norm_eps(norm: nn.RMSNorm, x: torch.Tensor) -> float:
    """``norm``'s epsilon (PyTorch's default for ``x``'s dtype where it has none)."""
    return torch.finfo(x.dtype).eps if norm.eps is None else norm.eps


def normed(norm: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``, by the fused kernel where it applies (drafting on a GPU: one launch,
    :func:`proposers.head_kernels.fused_rms_norm`)."""
    if fused_norm_applies(x, norm.weight):
        return fused_rms_norm(x, norm.weight, norm_eps(norm, x))
    return norm(x)


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [..., heads, head_dim]`` at ``positions [...]`` (LLaMA's
    half-split layout); the reference of :func:`proposers.head_kernels.fused_rotate`."""
    angles = positions[..., None].float() * inv_freq  # [..., head_dim / 2]
    cos, sin = angles.cos()[..., None, :], angles.sin()[..., None, :]  # [..., 1, head_dim / 2]
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


@dataclass(frozen=True)
class ChainView:
    """What a chain's query rows see of a cache ``[slots, capacity, kv_heads, head_dim]``:
    row ``r`` (one query) reads slot ``slots[r]``'s keys ``0 .. upto[r]`` (``[b]`` int64
    each)."""

    slots: torch.Tensor
    upto: torch.Tensor


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor | ChainView) -> torch.Tensor:
    """Attention of queries ``q [b, n, heads, head_dim]`` over ``keys``/``values [b, k,
    kv_heads, head_dim]`` where ``mask [b or 1, n, k]`` (bool) allows: ``[b, n, heads *
    head_dim]``. Query head ``h`` reads key/value head ``h // (heads / kv_heads)``.
    ``mask`` may instead be a :class:`ChainView` of a whole cache ``keys``/``values``: one
    fused launch where it applies (:func:`proposers.head_kernels.chain_attention`), else the
    rows' keys gathered and the mask built here."""
    if isinstance(mask, ChainView):
        if chain_attention_applies(q, keys, values):
            return chain_attention(q, keys, values, mask.upto, mask.slots)
        keys, values = keys[mask.slots], values[mask.slots]  # [b, capacity, kv_heads, dim]
        key_pos = torch.arange(keys.shape[1], device=keys.device)  # [capacity]
        mask = (key_pos[None, :] <= mask.upto[:, None])[:, None]  # [b, 1, capacity]
    b, n, num_heads, d = q.shape
    kv_heads = keys.shape[2]
    groups = num_heads // kv_heads
    # The query heads of one key/value head folded into its query rows (row g * n + t):
    # the keys and values are read in place, not copied once per query head.
    folded = q.view(b, n, kv_heads, groups, d).permute(0, 2, 3, 1, 4).reshape(
        b, kv_heads, groups * n, d)  # [b, kv_heads, groups * n, head_dim]
    rows_mask = mask[:, None]  # [b or 1, 1, n, k]
    if n > 1 and groups > 1:  # (one query row: its mask broadcasts over the groups)
        rows_mask = rows_mask.repeat(1, 1, groups, 1)  # [b or 1, 1, groups * n, k]
    out = F.scaled_dot_product_attention(folded, keys.transpose(1, 2),
                                         values.transpose(1, 2), attn_mask=rows_mask)
    out = out.view(b, kv_heads, groups, n, d).permute(0, 3, 1, 2, 4)  # [b, n, kv, g, d]
    return out.reshape(b, n, num_heads * d)


class DraftHead(nn.Module):
    """One decoder layer over (feature, next token embedding) pairs; see the module docstring."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int,
                 num_kv_heads: int, rope_theta: float = 10000.0, eps: float = 1e-5) -> None:
        super().__init__()
        if hidden_size % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"draft head shape is invalid: hidden_size={hidden_size} must be "
                             f"a multiple of num_heads={num_heads}, and that of "
                             f"num_kv_heads={num_kv_heads}")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.rope_theta = float(rope_theta)
        self.feature_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.token_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.attn_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(hidden_size, 2 * num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)
        self.mlp_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.gate_up = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.register_buffer("inv_freq", self._frequencies(None),
                             persistent=False)  # [head_dim / 2] float32
        self.vocab: torch.Tensor | None = None  # [draft_vocab_size] long: see the module doc

    def _frequencies(self, device: torch.device | None) -> torch.Tensor:
        return 1.0 / self.rope_theta ** (torch.arange(
            0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim)

    def _apply(self, fn, recurse=True):  # (what .to(), .cuda(), .half() run)
        super()._apply(fn, recurse)
        # the rotary frequencies stay float32 whatever the weights' dtype: bfloat16 rounds them
        # by up to 0.4%, an angle off by a radian 300 positions away
        self.inv_freq = self._frequencies(self.inv_freq.device)
        return self

    def set_vocab(self, token_ids: torch.Tensor | list[int] | None) -> None:
        """The draft vocabulary (distinct token ids, most frequent first), or None: all."""
        if token_ids is None:
            self.vocab = None
            return
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        if ids.numel() == 0 or ids.unique().numel() != ids.numel() or int(ids.min()) < 0:
            raise ValueError(f"a draft vocabulary must be distinct non-negative token ids; got "
                             f"{ids.numel()} ids ({ids.unique().numel()} distinct)")
        self.vocab = ids

    def inputs(self, features: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        """``x [..., hidden]`` of pairs (``features [..., hidden]``, ``token_embeddings``)."""
        embeds = token_embeddings.to(features.dtype)
        if (fused_norm_applies(features, self.feature_norm.weight)
                and fused_norm_applies(embeds, self.token_norm.weight)):
            # (each norm into its half of the row: one launch each, no concatenation)
            size = self.hidden_size
            both = features.new_empty((*features.shape[:-1], 2 * size))
            rows = both.view(-1, 2 * size)  # [rows, 2 * hidden]
            fused_rms_norm(features, self.feature_norm.weight,
                           norm_eps(self.feature_norm, features), rows[:, :size])
            fused_rms_norm(embeds, self.token_norm.weight, norm_eps(self.token_norm, embeds),
                           rows[:, size:])
        else:
            both = torch.cat([self.feature_norm(features), self.token_norm(embeds)], dim=-1)
        return self.fc(both)

    def chained(self, feature: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        """:meth:`inputs` of a pair whose feature is the head's own prediction (the same map:
        this head predicts the target's features)."""
        return self.inputs(feature, token_embeddings)

    def keys_values(self, x: torch.Tensor,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's (rotated) key and its value, ``[..., num_kv_heads, head_dim]`` each."""
        k, v = self.unrotated_keys_values(x)
        return rotated(k, positions, self.inv_freq), v

    def unrotated_keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`keys_values` before the keys' rotary (views of one projection)."""
        kv = self.kv_proj(normed(self.attn_norm, x)).unflatten(
            -1, (2, self.num_kv_heads, self.head_dim))
        return kv[..., 0, :, :], kv[..., 1, :, :]

    def attend(self, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The predicted next features ``[b, q, hidden]`` of the pairs ``x [b, q, hidden]`` at
        ``positions [b, q]``, attending to ``keys``/``values [b, k, num_kv_heads, head_dim]``
        where ``mask [b or 1, q, k]`` (bool) allows (or a :class:`ChainView` of the whole cache:
        :func:`grouped_attention`); every query must allow one key."""
        q = rotated(self.q_proj(normed(self.attn_norm, x)).unflatten(
            -1, (self.num_heads, self.head_dim)), positions, self.inv_freq)  # [b, q, heads, d]
        h = x + self.o_proj(grouped_attention(q, keys, values, mask))  # [b, q, hidden]
        gate_up = self.gate_up(normed(self.mlp_norm, h))  # [b, q, 2 * intermediate]
        if fused_silu_mul_applies(gate_up):
            return h + self.down(fused_silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def unrolled(self, features: torch.Tensor, tokens: torch.Tensor, embed: nn.Module,
                 lm_head: nn.Module | None, steps: int) -> list[torch.Tensor]:
        """Training's and evaluation's view of drafting: from every position ``j`` of
        ``features [b, T, hidden]`` / ``tokens [b, T]`` (``f_j``, ``x_j``), ``steps`` chained
        predictions, as the proposer makes them. Block 0 reads the true pairs
        (``f_j``, ``x_{j+1}``) with causal attention; block ``u`` reads block ``u - 1``'s
        prediction with the token ``x_{j+u+1}`` (teacher forcing, ``lm_head`` None) or the argmax
        of that prediction through ``lm_head`` (the drafts), at position ``j + u``, attending to
        the true pairs up to ``j`` and to its own chain's earlier blocks, as a proposal sees
        them (its cache's verified pairs, and its own drafts' pairs in its copy). Returns
        ``steps`` tensors ``[b, T - 1, hidden]``: block ``u`` at ``j`` predicts ``f_{j+u+1}``
        (rows past a sequence's end are garbage; mask them)."""
        b, t = tokens.shape
        n = t - 1
        pos = torch.arange(n, device=features.device).expand(b, n)  # [b, n]
        x = self.inputs(features[:, :-1], embed(tokens[:, 1:]))  # [b, n, hidden]
        k, v = self.keys_values(x, pos)
        keys, values = [k], [v]
        j = torch.arange(n, device=features.device)
        causal = j[None, :] <= j[:, None]  # [n, n]
        diagonal = torch.eye(n, dtype=torch.bool, device=features.device)
        out = []
        for u in range(steps):
            mask = torch.cat([causal] + [diagonal] * u, dim=1)[None]  # [1, n, (u + 1) n]
            pred = self.attend(x, pos + u, torch.cat(keys, 1), torch.cat(values, 1), mask)
            out.append(pred)
            if u + 1 == steps:
                break
            if lm_head is None:  # the true next tokens (clamped past the end: masked anyway)
                nxt = tokens[:, torch.clamp(j + u + 2, max=t - 1)]
            else:
                nxt = lm_head(pred).argmax(-1)
            x = self.chained(pred, embed(nxt))
            k, v = self.keys_values(x, pos + u + 1)
            keys.append(k)
            values.append(v)
        return out

    def shape(self) -> dict[str, Any]:
        return {"version": VERSION, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads, "rope_theta": self.rope_theta}

    def save(self, directory: str | Path, card: dict[str, Any] | None = None) -> None:
        """The weights and shape, in ``directory`` (plus ``card``: how it was trained)."""
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        if self.vocab is not None:  # (int32: half the bytes; token ids fit)
            tensors[VOCAB_KEY] = self.vocab.to(torch.int32).cpu()
        save_file(tensors, str(out / WEIGHTS_NAME))
        shape = {**self.shape(), "draft_vocab_size": None if self.vocab is None
                 else self.vocab.numel()}
        (out / CONFIG_NAME).write_text(json.dumps({**shape, **(card or {})}, indent=1))

    @classmethod
    def load(cls, directory: str | Path) -> DraftHead:
        from safetensors.torch import load_file

        path = Path(directory)
        config_file, weights_file = path / CONFIG_NAME, path / WEIGHTS_NAME
        for f in (config_file, weights_file):
            if not f.is_file():
                raise ValueError(f"draft head directory {str(path)!r} lacks {f.name}: a head is "
                                 f"saved by DraftHead.save (examples/train_draft_head.py)")
        shape = json.loads(config_file.read_text())
        if shape.get("version") != VERSION:
            raise ValueError(f"{config_file} has version={shape.get('version')!r}: this engine "
                             f"loads draft heads of version {VERSION} (one decoder layer); "
                             "retrain it with examples/train_draft_head.py")
        tensors = load_file(str(weights_file))
        vocab = tensors.pop(VOCAB_KEY, None)
        head = cls(*(shape[k] for k in SHAPE_KEYS)).to(tensors["fc.weight"].dtype)  # (as stored)
        head.load_state_dict(tensors)
        head.set_vocab(vocab)
        return head


def head_for(target_config: Any, intermediate_size: int | None = None) -> DraftHead:
    """A fresh head shaped after the target's own layers (its heads, KV heads, rope theta)."""
    hidden = target_config.hidden_size
    heads = target_config.num_attention_heads
    kv_heads = getattr(target_config, "num_key_value_heads", None) or heads
    theta = getattr(target_config, "rope_theta", None) or (
        (getattr(target_config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
    return DraftHead(hidden, intermediate_size or target_config.intermediate_size, heads,
                     kv_heads, theta)
