"""The EAGLE-3 draft head's network (Li et al., arXiv 2503.01840), as the speculators library
and vLLM / SGLang define it.

The target's states at three of its layers (low, middle, high: the *inputs* of decoder layers
``aux_layers``, vLLM's default ``(2, L // 2, L - 3)``) are concatenated per position and fused
by ``fc`` (``3 H_t -> H``) into ``g_j``. One decoder layer (LLaMA-style) reads the pair
(``g_j``, token ``x_{j+1}``)::

    a_j  = [input_layernorm(e(x_{j+1})) ; hidden_norm(g_j)]          # [2H]: q, k, v read it
    r_j  = g_j  (or hidden_norm(g_j) with norm_before_residual)      # the residual
    h_j  = r_j + o(attention(q(a_j), keys/values of a_0 .. a_j))
    g'_j = h_j + mlp(post_attention_layernorm(h_j))                   # fed back as g_{j+1}
    logits over the draft vocabulary = lm_head(norm(g'_j))            # draft token d
    target token id = d + d2t[d]

Later drafts chain on ``g'`` (not fused again: ``fc`` reads the target's states only) and
on the draft token's embedding (the target's embedding unless the head brings its own). As
with :class:`proposers.head_model.DraftHead`, a position's key and value depend on its own pair
only, so the proposer's cache of verified pairs (:mod:`proposers.head_cache`) and its chain and
tree drafting (:mod:`proposers.head_drafting`) serve both heads: a pair ``x`` here is
``[a_j ; r_j]`` (``[..., 3H]``).

Parameter names are the speculators names (``fc``, ``layers.0.self_attn.q_proj``, ...,
``norm``, ``lm_head``, ``d2t``, ``t2d``), so the state dict is that format's weights file
(:mod:`proposers.speculators`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from proposers.head_model import grouped_attention, rotated


class RMSNorm(nn.Module):
    """LLaMA's RMSNorm: normalised in float32, cast back, then scaled (transformers' order)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)  # reads [e ; g]
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)


class _MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int,
                 head_dim: int, eps: float) -> None:
        super().__init__()
        self.self_attn = _Attention(hidden, heads, kv_heads, head_dim)
        self.mlp = _MLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)  # the token embedding's
        self.hidden_norm = RMSNorm(hidden, eps)  # the fused (or fed-back) state's
        self.post_attention_layernorm = RMSNorm(hidden, eps)


class Eagle3Head(nn.Module):
    """One EAGLE-3 decoder layer over (fused target state, next token) pairs; see the module
    docstring. ``target_hidden_size``: the target's hidden size (``fc`` reads ``len(aux_layers)``
    of its states); ``target_vocab_size``: its logits' width (``t2d``'s length);
    ``inv_freq [head_dim / 2]``: the rotary frequencies (the draft layer's rope parameters)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int,
                 num_kv_heads: int, head_dim: int, draft_vocab_size: int,
                 target_hidden_size: int, target_vocab_size: int, aux_layers: tuple[int, ...],
                 inv_freq: torch.Tensor, eps: float = 1e-6, norm_before_residual: bool = False,
                 norm_before_fc: bool = False) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"EAGLE-3 head shape is invalid: num_attention_heads={num_heads} "
                             f"must be a multiple of num_key_value_heads={num_kv_heads}")
        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_kv_heads
        self.head_dim, self.draft_vocab_size = head_dim, draft_vocab_size
        self.target_hidden_size, self.target_vocab_size = target_hidden_size, target_vocab_size
        self.aux_layers = tuple(aux_layers)
        self.norm_before_residual = norm_before_residual
        width = len(self.aux_layers) * target_hidden_size
        self.input_norm = RMSNorm(width, eps) if norm_before_fc else None
        self.fc = nn.Linear(width, hidden_size, bias=False)
        self.layers = nn.ModuleList([_Layer(hidden_size, intermediate_size, num_heads,
                                            num_kv_heads, head_dim, eps)])
        self.norm = RMSNorm(hidden_size, eps)
        self.lm_head = nn.Linear(hidden_size, draft_vocab_size, bias=False)
        self.embed_tokens: nn.Embedding | None = None  # the head's own (None: the target's)
        # d2t [draft_vocab] int64: target id = draft id + d2t[draft id]; t2d [target_vocab] bool
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(target_vocab_size, dtype=torch.bool)
                             if draft_vocab_size == target_vocab_size
                             else torch.zeros(target_vocab_size, dtype=torch.bool))
        self._inv_freq = inv_freq.float().clone()
        self.register_buffer("inv_freq", self._inv_freq.clone(), persistent=False)

    def _apply(self, fn, recurse=True):  # (what .to(), .cuda(), .half() run)
        super()._apply(fn, recurse)
        # rotary frequencies stay float32 whatever the weights' dtype (see DraftHead._apply)
        self.inv_freq = self._inv_freq.to(self.inv_freq.device)
        return self

    @property
    def target_ids(self) -> torch.Tensor:
        """``[draft_vocab_size]`` int64: each draft token's id in the target's vocabulary."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    # ---- the pieces the proposer's drafting and training's unrolled blocks share -----------

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """``g [..., hidden]`` of the target's concatenated layer states ``[..., len(aux_layers)
        * target_hidden_size]``."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        return self.fc(features.to(self.fc.weight.dtype))

    def inputs(self, features: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        """Pairs ``x [..., 3 * hidden]`` of the target's states (fused here) and tokens."""
        return self.chained(self.fuse(features), token_embeddings)

    def chained(self, state: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        """Pairs ``x [..., 3 * hidden]`` = ``[a ; r]`` of a state ``g [..., hidden]`` (fused, or
        the head's own :meth:`attend` output) and the next token's embedding."""
        layer = self.layers[0]
        normed = layer.hidden_norm(state)
        residual = normed if self.norm_before_residual else state
        embeds = layer.input_layernorm(token_embeddings.to(state.dtype))
        return torch.cat([embeds, normed, residual], dim=-1)

    def keys_values(self, x: torch.Tensor,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's rotated key and its value, ``[..., num_kv_heads, head_dim]`` each."""
        k, v = self.unrotated_keys_values(x)
        return rotated(k, positions, self.inv_freq), v

    def unrotated_keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`keys_values` before the keys' rotary."""
        attn = self.layers[0].self_attn
        a = x[..., :2 * self.hidden_size]
        k = attn.k_proj(a).unflatten(-1, (self.num_kv_heads, self.head_dim))
        return k, attn.v_proj(a).unflatten(-1, (self.num_kv_heads, self.head_dim))

    def attend(self, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The next states ``g' [b, q, hidden]`` (before ``norm``) of the pairs ``x [b, q, 3 *
        hidden]`` at ``positions [b, q]``, attending to ``keys``/``values [b, k, num_kv_heads,
        head_dim]`` where ``mask [b or 1, q, k]`` (bool) allows (or a chain's view of the whole
        cache: :func:`~proposers.head_model.grouped_attention`)."""
        layer = self.layers[0]
        attn = layer.self_attn
        a, residual = x[..., :2 * self.hidden_size], x[..., 2 * self.hidden_size:]
        q = rotated(attn.q_proj(a).unflatten(-1, (self.num_heads, self.head_dim)), positions,
                    self.inv_freq)  # [b, q, heads, head_dim]
        h = residual + attn.o_proj(grouped_attention(q, keys, values, mask))  # [b, q, hidden]
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def draft_logits(self, state: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., draft_vocab_size]`` of a state ``g' [..., hidden]``."""
        return self.lm_head(self.norm(state))

    def unrolled(self, features: torch.Tensor, tokens: torch.Tensor, embed: nn.Module,
                 steps: int, teacher: bool = False) -> list[torch.Tensor]:
        """Training's and evaluation's view of drafting (training-time test): from every
        position ``j`` of ``features [b, T, 3 * target_hidden]`` / ``tokens [b, T]``, ``steps``
        chained predictions as the proposer makes them. Block 0 reads the true pairs
        (``g_j``, ``x_{j+1}``) with causal attention; block ``u`` reads block ``u - 1``'s state
        with its own greedy draft (mapped to a target id; ``teacher``: the true token
        ``x_{j+u+1}`` instead) at position ``j + u``, attending to the true pairs up to ``j``
        and its own chain's earlier blocks. Returns ``steps`` draft-vocabulary logits ``[b,
        T - 1, draft_vocab_size]``: block ``u`` at ``j`` predicts ``x_{j+u+2}`` (rows past a
        sequence's end are garbage; mask them)."""
        b, t = tokens.shape
        n = t - 1
        pos = torch.arange(n, device=features.device).expand(b, n)  # [b, n]
        x = self.inputs(features[:, :-1], embed(tokens[:, 1:]))  # [b, n, 3 * hidden]
        k, v = self.keys_values(x, pos)
        keys, values = [k], [v]
        j = torch.arange(n, device=features.device)
        causal = j[None, :] <= j[:, None]  # [n, n]
        diagonal = torch.eye(n, dtype=torch.bool, device=features.device)
        ids = self.target_ids
        out = []
        for u in range(steps):
            mask = torch.cat([causal] + [diagonal] * u, dim=1)[None]  # [1, n, (u + 1) n]
            state = self.attend(x, pos + u, torch.cat(keys, 1), torch.cat(values, 1), mask)
            logits = self.draft_logits(state)  # [b, n, draft_vocab]
            out.append(logits)
            if u + 1 == steps:
                break
            if teacher:  # the true next tokens (clamped past the end: masked anyway)
                nxt = tokens[:, torch.clamp(j + u + 2, max=t - 1)]
            else:
                nxt = ids[logits.argmax(-1)]
            x = self.chained(state, embed(nxt))
            k, v = self.keys_values(x, pos + u + 1)
            keys.append(k)
            values.append(v)
        return out
