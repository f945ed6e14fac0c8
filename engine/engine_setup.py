"""Builds what an engine runs on: target model + tokenizer, model runner, proposer, sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.config import EngineConfig, SpeculativeConfig
from engine.model_runner import ModelRunner
from samplers import get_sampler

# Default KV budget when kv_cache_tokens is not given: enough for max_num_seqs full sequences,
# capped at this many tokens over all sequences (on CPU the cache lives in host memory: SmolLM2
# in float32 takes 46 KB per token, so 16384 tokens are 0.75 GB).
DEFAULT_KV_CAP = {"cuda": 65536, "cpu": 16384}


@dataclass
class EngineComponents:
    model: Any
    tokenizer: Any
    runner: ModelRunner
    proposer: Any
    sampler: Any
    # Used instead of ``sampler`` for steps where every request is greedy, when that is the same
    # rule (rejection sampling at temperature 0 is the argmax match); None otherwise.
    greedy_sampler: Any
    device: torch.device
    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_target(config: EngineConfig) -> tuple[Any, Any]:
    """The target model and tokenizer: loaded by name, or the objects given."""
    if isinstance(config.model, str):
        from engine.model_loader import load_model

        return load_model(config.model, dtype=config.dtype, device=resolve_device(config.device))
    if config.tokenizer is None:
        raise ValueError("EngineConfig.tokenizer=None is invalid: a tokenizer is required when "
                         "model is an already-loaded model")
    return config.model.eval(), config.tokenizer


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """EOS ids of the tokenizer and of the model's generation config (HF ``generate`` stops at
    the latter)."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for value in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    return frozenset(ids)


def model_max_len(model: Any) -> int:
    config = model.config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"cannot tell the context length of {type(model).__name__}: "
                     "pass max_model_len")


def build_proposer(spec: SpeculativeConfig, model: Any, tokenizer: Any, config: EngineConfig,
                   device: torch.device, vocab_size: int, max_model_len: int) -> Any:
    """The configured proposer (``proposers.get_proposer``)."""
    from proposers import get_proposer

    greedy = spec.draft_sample_method == "greedy"
    common = dict(max_num_seqs=config.max_num_seqs, max_model_len=max_model_len, greedy=greedy,
                  cuda_graph_max_new=graph_max_new(config))
    if spec.method == "ngram":
        return get_proposer("ngram", prompt_lookup_min=spec.prompt_lookup_min,
                            prompt_lookup_max=spec.prompt_lookup_max)
    if spec.method == "early_exit":
        return get_proposer("early_exit", target_model=model,
                            num_layers=spec.num_early_exit_layers, **common)
    if not isinstance(spec.model, str) and spec.tokenizer is None:
        raise ValueError("SpeculativeConfig.tokenizer=None is invalid: the draft model's "
                         "tokenizer is required with an already-loaded draft model")
    return get_proposer("draft_model", model=spec.model, tokenizer=spec.tokenizer,
                        target_tokenizer=tokenizer, target_vocab_size=vocab_size,
                        device=str(device), dtype=config.dtype, **common)


def graph_max_new(config: EngineConfig) -> int:
    """Steps of at most this many new tokens per sequence replay CUDA graphs (0: none): one
    token per decode step, k + 1 per verification (and per draft catch-up)."""
    if config.enforce_eager:
        return 0
    spec = config.speculative_config
    return 1 + (spec.num_speculative_tokens if spec is not None else 0)


def build_components(config: EngineConfig) -> EngineComponents:
    model, tokenizer = load_target(config)
    device = model.get_input_embeddings().weight.device
    vocab_size = model.get_output_embeddings().weight.shape[0]
    own_len = model_max_len(model)
    max_model_len = min(config.max_model_len or own_len, own_len)
    cap = DEFAULT_KV_CAP["cuda" if device.type == "cuda" else "cpu"]
    kv_tokens = config.kv_cache_tokens or min(config.max_num_seqs * max_model_len, cap)
    max_model_len = min(max_model_len, kv_tokens)
    runner = ModelRunner(model, config.max_num_seqs, kv_tokens, max_model_len,
                         cuda_graph_max_new=graph_max_new(config))
    spec = config.speculative_config
    proposer = None
    if spec is not None and spec.num_speculative_tokens > 0:
        proposer = build_proposer(spec, model, tokenizer, config, device, vocab_size,
                                  max_model_len)
    if spec is None:
        sampler = get_sampler("rejection")
    elif spec.sampler_name == "typical":
        sampler = get_sampler("typical", posterior_threshold=spec.posterior_threshold,
                              posterior_alpha=spec.posterior_alpha)
    else:
        sampler = get_sampler(spec.sampler_name)
    lossless = spec is None or spec.sampler_name in ("rejection", "greedy")
    greedy_sampler = get_sampler("greedy") if lossless else None
    return EngineComponents(model, tokenizer, runner, proposer, sampler, greedy_sampler, device,
                            vocab_size, max_model_len, eos_token_ids(model, tokenizer))
