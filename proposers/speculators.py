"""Draft heads in the speculators format (vllm-project/speculators), which vLLM and SGLang load.

A head is a directory with a ``config.json`` and its weights in safetensors files:

- ``speculators_model_type``: ``"eagle3"`` (the only type loaded here), ``architectures``:
  ``["Eagle3Speculator"]``;
- ``transformer_layer_config``: a LLaMA config of the draft layer (``hidden_size``,
  ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
  ``num_hidden_layers`` = 1, ``rms_norm_eps``, rope parameters, ``vocab_size``: the target's);
- ``draft_vocab_size``; ``target_hidden_size`` (None: the layer's hidden size);
  ``eagle_aux_hidden_state_layer_ids`` (None: ``(2, L // 2, L - 3)`` of the target's ``L``
  layers, vLLM's default); ``norm_before_residual`` (absent: true, as vLLM reads it);
  ``norm_before_fc``;
- ``speculators_config``: ``algorithm``, ``proposal_methods`` (``speculative_tokens``),
  ``default_proposal_method``, ``verifier`` (``name_or_path``, ``architectures``).

Weights: ``fc.weight [H, 3 H_t]``, ``layers.0.self_attn.{q,k,v}_proj.weight [*, 2H]``,
``layers.0.self_attn.o_proj.weight``, ``layers.0.mlp.{gate,up,down}_proj.weight``,
``layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``, ``norm.weight``,
``lm_head.weight [draft_vocab, H]``, ``d2t [draft_vocab]`` int64 (target id = draft id +
``d2t[draft id]``), ``t2d [target_vocab]`` bool (the target ids in the draft vocabulary),
optionally ``embed_tokens.weight`` (absent: the target's embedding).

Every check raises ``ValueError`` naming the field (or weight) and the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from proposers.eagle3_head import Eagle3Head
from proposers.speculators_dir import (  # noqa: F401 (the format's names, read here too)
    CONFIG_FILE,
    SUPPORTED_TYPES,
    WEIGHTS_FILE,
    head_directory,
    speculators_type,
)


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's and speculators' auxiliary layers for a target of ``num_layers`` layers."""
    return (2, num_layers // 2, num_layers - 3)


def _bad(where: Path, field: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{where}: {field}={value!r} is invalid: allowed {allowed}")


def _int(where: Path, data: dict, field: str, prefix: str = "") -> int:
    value = data.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(where, prefix + field, value, "an integer >= 1")
    return value


def read_config(directory: str | Path) -> dict[str, Any]:
    """``config.json`` of a speculators EAGLE-3 directory, its type checked."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{directory}: no {CONFIG_FILE}: a speculators head is a directory (or "
                         "a hub id in the local Hugging Face cache) holding its config.json and "
                         "safetensors weights")
    config = json.loads(path.read_text())
    kind = config.get("speculators_model_type")
    if kind not in SUPPORTED_TYPES:
        raise _bad(path, "speculators_model_type", kind, " | ".join(map(repr, SUPPORTED_TYPES)))
    return config


def _rotary(where: Path, layer: dict[str, Any]) -> torch.Tensor:
    """The draft layer's rotary frequencies ``[head_dim / 2]`` (float32), by transformers' own
    rope initialisation of its LLaMA config (rope scaling included)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = LlamaRotaryEmbedding(LlamaConfig(**layer))
    if float(getattr(rope, "attention_scaling", 1.0)) != 1.0:
        raise _bad(where, "transformer_layer_config.rope_scaling", layer.get("rope_scaling"),
                   "a rope scaling without attention scaling (default, linear, dynamic, llama3)")
    return rope.inv_freq.float()


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory}: no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def load_eagle3(directory: str | Path, target_config: Any, target_vocab_size: int) -> Eagle3Head:
    """The EAGLE-3 head saved in ``directory`` (or under a hub id in the local Hugging Face
    cache) for a target of config ``target_config`` whose logits are ``target_vocab_size`` wide
    (checked against the head's fields)."""
    directory = head_directory(directory) or Path(directory)
    config = read_config(directory)
    where = directory / CONFIG_FILE
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise _bad(where, "transformer_layer_config", layer, "a LLaMA config (a JSON object)")
    tl = "transformer_layer_config."
    if layer.get("model_type", "llama") != "llama":
        raise _bad(where, tl + "model_type", layer.get("model_type"), "'llama'")
    if layer.get("num_hidden_layers", 1) != 1:
        raise _bad(where, tl + "num_hidden_layers", layer.get("num_hidden_layers"), "1")
    for flag in ("attention_bias", "mlp_bias"):
        if layer.get(flag):
            raise _bad(where, tl + flag, layer.get(flag), "false")
    hidden = _int(where, layer, "hidden_size", tl)
    heads = _int(where, layer, "num_attention_heads", tl)
    kv_heads = layer.get("num_key_value_heads") or heads
    head_dim = layer.get("head_dim") or hidden // heads
    intermediate = _int(where, layer, "intermediate_size", tl)
    vocab = _int(where, layer, "vocab_size", tl)
    if vocab != target_vocab_size:
        raise _bad(where, tl + "vocab_size", vocab, f"the target's vocabulary, {target_vocab_size}")
    draft_vocab = _int(where, config, "draft_vocab_size")
    if draft_vocab > vocab:
        raise _bad(where, "draft_vocab_size", draft_vocab, f"<= the target's {vocab} tokens")
    target_hidden = config.get("target_hidden_size") or hidden
    if target_hidden != target_config.hidden_size:
        field = "target_hidden_size" if config.get("target_hidden_size") else tl + "hidden_size"
        raise _bad(where, field, target_hidden, f"the verifier's hidden size, "
                   f"{target_config.hidden_size} (the head was trained for another model)")
    num_layers = target_config.num_hidden_layers
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    if aux is None:
        aux = default_aux_layers(num_layers)
    if (not isinstance(aux, list | tuple) or not aux
            or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers
                   for i in aux)):
        raise _bad(where, "eagle_aux_hidden_state_layer_ids", aux,
                   f"a list of the verifier's layer ids, 0 .. {num_layers - 1}")
    head = Eagle3Head(hidden, intermediate, heads, kv_heads, head_dim, draft_vocab,
                      target_hidden, vocab, tuple(aux), _rotary(where, layer),
                      float(layer.get("rms_norm_eps", 1e-6)),
                      bool(config.get("norm_before_residual", True)),
                      bool(config.get("norm_before_fc", False)))
    tensors = {k: v for k, v in _weights(directory).items() if not k.startswith("verifier_")}
    if "embed_tokens.weight" in tensors:  # (its own token embedding, loaded with the rest)
        head.embed_tokens = torch.nn.Embedding(vocab, hidden)
    elif hidden != target_config.hidden_size:
        raise ValueError(f"{directory}: embed_tokens.weight is missing; a head whose hidden size "
                         f"({hidden}) is not the verifier's needs its own embedding")
    if "d2t" not in tensors:
        if draft_vocab != vocab:
            raise ValueError(f"{directory}: weight d2t is missing: a draft vocabulary of "
                             f"{draft_vocab} tokens (draft_vocab_size) needs d2t, the offsets "
                             f"from draft to target ids")
        tensors["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
    d2t = tensors["d2t"].long()
    if tuple(d2t.shape) != (draft_vocab,):
        raise ValueError(f"{directory}: weight d2t has shape {tuple(d2t.shape)}; "
                         f"draft_vocab_size={draft_vocab} needs ({draft_vocab},)")
    ids = torch.arange(draft_vocab) + d2t  # [draft_vocab]: target ids
    if int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != draft_vocab:
        raise ValueError(f"{directory}: weight d2t must map the {draft_vocab} draft ids to "
                         f"distinct target ids below {vocab}")
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    if "t2d" in tensors and not torch.equal(tensors["t2d"].bool(), t2d):
        raise ValueError(f"{directory}: weight t2d does not mark exactly the target ids that d2t "
                         "maps the draft vocabulary to")
    tensors["d2t"], tensors["t2d"] = d2t, t2d
    dtype = tensors["fc.weight"].dtype if "fc.weight" in tensors else torch.float32
    head = head.to(dtype)
    expected = head.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected))
    if missing or unknown:
        raise ValueError(f"{directory}: weights missing {missing} and unknown {unknown} for an "
                         "EAGLE-3 head of one layer")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"{directory}: weight {name} has shape {tuple(tensor.shape)}; "
                             f"allowed {tuple(expected[name].shape)} (from config.json)")
    head.load_state_dict(tensors)
    return head


def rope_fields(target_config: Any) -> dict[str, Any]:
    """The draft layer's rope and length fields copied from the target's config, in the
    legacy names vLLM and speculators read (``rope_theta``, ``rope_scaling``,
    ``max_position_embeddings``)."""
    rope = dict(getattr(target_config, "rope_parameters", None) or {})
    theta = rope.pop("rope_theta", None) or getattr(target_config, "rope_theta", 10000.0)
    fields = {"rope_theta": float(theta),
              "max_position_embeddings": target_config.max_position_embeddings}
    if rope.get("rope_type", "default") != "default":
        fields["rope_scaling"] = rope
    return fields


def new_eagle3(target_config: Any, target_vocab_size: int, draft_ids: list[int] | None,
               aux_layers: tuple[int, ...] | None = None,
               intermediate_size: int | None = None) -> Eagle3Head:
    """A fresh EAGLE-3 head shaped after the target's layers (hidden size, heads, rope),
    drafting over the target ids ``draft_ids`` (None: all of them), reading ``aux_layers``
    (None: vLLM's default)."""
    hidden = target_config.hidden_size
    heads = target_config.num_attention_heads
    kv_heads = getattr(target_config, "num_key_value_heads", None) or heads
    head_dim = getattr(target_config, "head_dim", None) or hidden // heads
    layer = {"hidden_size": hidden, "num_attention_heads": heads, "head_dim": head_dim,
             **rope_fields(target_config)}
    ids = torch.arange(target_vocab_size) if draft_ids is None else torch.as_tensor(draft_ids)
    head = Eagle3Head(hidden, intermediate_size or target_config.intermediate_size, heads,
                      kv_heads, head_dim, ids.numel(), hidden, target_vocab_size,
                      aux_layers or default_aux_layers(target_config.num_hidden_layers),
                      _rotary(Path("(new head)"), layer),
                      float(getattr(target_config, "rms_norm_eps", 1e-6)))
    with torch.no_grad():
        head.d2t.copy_(ids - torch.arange(ids.numel()))
        head.t2d.zero_()
        head.t2d[ids] = True
    return head


def save_eagle3(head: Eagle3Head, directory: str | Path, layer_config: dict[str, Any],
                verifier: str | None, verifier_architectures: list[str],
                speculative_tokens: int, card: dict[str, Any] | None = None) -> None:
    """Write ``head`` as a speculators EAGLE-3 directory: ``config.json`` and
    ``model.safetensors``. ``layer_config``: the draft layer's rope and length fields
    (``rope_theta``, ``rope_scaling``, ``max_position_embeddings``: the target's, as trained);
    ``verifier``: the target's name or path for vLLM / SGLang (``speculators_config.verifier
    .name_or_path``); ``card``: how it was trained (kept under ``specdec``)."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    # (with the head's own embedding, embed_tokens.weight among them)
    tensors = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    if head.draft_vocab_size == head.target_vocab_size:  # (no reduced vocabulary: no maps,
        del tensors["d2t"], tensors["t2d"]  # as the speculators library writes such a head)
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    layer = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
             "hidden_size": head.hidden_size,
             "intermediate_size": head.layers[0].mlp.gate_proj.out_features,
             "num_attention_heads": head.num_heads, "num_key_value_heads": head.num_kv_heads,
             "head_dim": head.head_dim, "num_hidden_layers": 1,
             "rms_norm_eps": head.norm.eps, "vocab_size": head.target_vocab_size,
             "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
             "tie_word_embeddings": False, **layer_config}
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": head.draft_vocab_size,
        "target_hidden_size": head.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(head.aux_layers),
        "norm_before_residual": head.norm_before_residual,
        "norm_before_fc": head.input_norm is not None,
        "embed_requires_grad": False,
        "torch_dtype": str(head.fc.weight.dtype).removeprefix("torch."),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
        },
    }
    if card:
        config["specdec"] = card
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=1))
