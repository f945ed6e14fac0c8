"""EAGLE-3 heads written by hand in the speculators layout (config.json + model.safetensors,
the names and shapes the format documents), and a plain reference of their drafts."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_eagle3_dir(directory: Path, target_config, draft_ids: list[int], seed: int = 0,
                     aux: list[int] | None = None, intermediate: int = 96,
                     config_overrides: dict | None = None, drop: tuple[str, ...] = (),
                     edit=None) -> dict[str, torch.Tensor]:
    """A random one-layer EAGLE-3 head for ``target_config`` whose draft vocabulary is the
    target ids ``draft_ids`` (draft id i is target id draft_ids[i]); ``drop``: weights left out;
    ``edit(tensors)``: changes them before they are written. Returns the weights."""
    hidden = target_config.hidden_size
    heads, kv_heads, head_dim = 4, 2, hidden // 4
    vocab = target_config.vocab_size
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.3

    tensors = {
        "fc.weight": rand(hidden, 3 * hidden),
        "layers.0.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "layers.0.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "layers.0.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "layers.0.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "layers.0.mlp.gate_proj.weight": rand(intermediate, hidden),
        "layers.0.mlp.up_proj.weight": rand(intermediate, hidden),
        "layers.0.mlp.down_proj.weight": rand(hidden, intermediate),
        "layers.0.input_layernorm.weight": 1 + rand(hidden),
        "layers.0.hidden_norm.weight": 1 + rand(hidden),
        "layers.0.post_attention_layernorm.weight": 1 + rand(hidden),
        "norm.weight": 1 + rand(hidden),
        "lm_head.weight": rand(len(draft_ids), hidden) * 3,
        "d2t": torch.tensor(draft_ids) - torch.arange(len(draft_ids)),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, torch.tensor(draft_ids), True),
    }
    if edit is not None:
        edit(tensors)
    for name in drop:
        del tensors[name]
    num_layers = target_config.num_hidden_layers
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": hidden, "intermediate_size": intermediate,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
            "vocab_size": vocab, "rope_theta": 10000.0, "max_position_embeddings": 256},
        "draft_vocab_size": len(draft_ids),
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": aux if aux is not None else [0, num_layers // 2,
                                                                         num_layers - 1],
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}},
        **(config_overrides or {}),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(directory / "model.safetensors"))
    return tensors


def _norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _rope(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """LLaMA's rotary embedding (theta 10000) of ``x [n, heads, head_dim]`` at 0 .. n - 1."""
    inv = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.arange(x.shape[0]).float()[:, None] * inv  # [n, head_dim / 2]
    cos = torch.cat([angles.cos()] * 2, -1)[:, None]
    sin = torch.cat([angles.sin()] * 2, -1)[:, None]
    half = head_dim // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated_half * sin


@torch.no_grad()
def reference_drafts(w: dict[str, torch.Tensor], target, aux: list[int], context: list[int],
                     steps: int) -> list[int]:
    """The head's greedy drafts after ``context``, recomputed from nothing: the target's layer
    inputs from Hugging Face, every pair through full causal attention, drafts mapped by
    ``d2t`` (norm_after_residual, 4 query and 2 key/value heads, as written above; the head's
    own ``embed_tokens.weight`` when it has one, else the target's embedding)."""
    states = target(torch.tensor([context]), output_hidden_states=True).hidden_states
    feats = torch.cat([states[i][0] for i in aux], -1)  # [n, 3H]
    embed = w.get("embed_tokens.weight", target.get_input_embeddings().weight)
    hidden = embed.shape[1]
    head_dim = hidden // 4
    p = "layers.0."
    g = feats[:-1] @ w["fc.weight"].T  # [n - 1, H]: pairs (g_j, x_{j+1})
    tokens = list(context[1:])
    drafts = []
    for _ in range(steps):
        e = _norm(embed[torch.tensor(tokens)], w[p + "input_layernorm.weight"])
        a = torch.cat([e, _norm(g, w[p + "hidden_norm.weight"])], -1)  # [n, 2H]
        n = a.shape[0]
        q = _rope((a @ w[p + "self_attn.q_proj.weight"].T).view(n, 4, head_dim), head_dim)
        k = _rope((a @ w[p + "self_attn.k_proj.weight"].T).view(n, 2, head_dim), head_dim)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(n, 2, head_dim)
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # [n, 4, head_dim]
        scores = torch.einsum("qhd,khd->hqk", q, k) / head_dim ** 0.5
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, hidden)
        h = g + att @ w[p + "self_attn.o_proj.weight"].T
        m = _norm(h, w[p + "post_attention_layernorm.weight"])
        out = h + (torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T)
                   * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        d = int((_norm(out[-1], w["norm.weight"]) @ w["lm_head.weight"].T).argmax())
        token = d + int(w["d2t"][d])
        drafts.append(token)
        g = torch.cat([g, out[-1:]])  # the newest state feeds the next pair
        tokens.append(token)
    return drafts
