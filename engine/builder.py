"""Builds what an engine runs on: target model + tokenizer, model runner, proposer, sampler.

The proposer and the sampler come from their registries by the names in the config
(``proposers.get_proposer``, ``samplers.build_sampler``): nothing here names one of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine.config import HEAD_METHODS, EngineConfig, default_num_threads, tree_size
from engine.draft_trees import TREE_MAX_SEQS
from engine.runner.executor import attention_devices, execution_device
from engine.runner.loader import load_model, load_tokenizer
from engine.runner.model_runner import ModelRunner
from engine.runner.tensor_parallel import (
    agreed_minimum,
    check_launch,
    lead_or_follow,
    whole_copies,
)
from proposers import Proposer, ProposerContext, get_proposer, proposer_needs_kv_cache
from samplers import MAX_SPEC_LEN, VerificationSampler, build_sampler, get_sampler

# Default KV budget on CPU when kv_cache_tokens is not given: enough for max_num_seqs full
# sequences, capped at this many tokens (the cache lives in host memory: SmolLM2 in float32 takes
# 46 KB per token, so 16384 tokens are 0.75 GB). On CUDA, gpu_memory_utilization sizes it.
CPU_KV_CAP = 16384
# GPU memory kept out of the KV cache for activations, CUDA graphs and the sampler's buffers.
GPU_RESERVE_BYTES = 2 * 2**30
GPU_RESERVE_SHARE = 0.05
# The target's share of the KV budget when a draft model (or the early-exit self-draft) needs a
# KV cache of its own, for the same tokens (its cost per token is at most the target's).
TARGET_KV_SHARE_WITH_DRAFT = 0.5


@dataclass
class EngineComponents:
    model: Any
    tokenizer: Any
    runner: ModelRunner
    proposer: Proposer | None
    sampler: VerificationSampler
    # Used instead of ``sampler`` for steps where every request is greedy, when that is the same
    # rule (a lossless sampler at temperature 0 is the argmax match); None otherwise.
    greedy_sampler: VerificationSampler | None
    device: torch.device
    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    # What sequences without a seed of their own draw from: the engine's own RNG, seeded with
    # EngineConfig.seed, so that an engine never reseeds or consumes torch's global RNG (None
    # when seed is None: the global RNG).
    generator: torch.Generator | None
    # which setting sets max_model_len, for errors ("kv_cache_tokens=64", ...)
    max_model_len_source: str


def resolve_device(device: str, max_memory: dict | None = None) -> str:
    """``auto``: accelerate's ``device_map="auto"`` over several visible GPUs (or within
    ``max_memory``), else the one GPU, else the CPU."""
    if device != "auto":
        return device
    if max_memory is not None or torch.cuda.device_count() > 1:
        return "auto"
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_target(config: EngineConfig) -> tuple[Any, Any]:
    """The target model and tokenizer: loaded by name, or the objects given."""
    if isinstance(config.model, str):
        if config.tensor_parallel_size > 1:
            check_launch(config.tensor_parallel_size)
        model, tokenizer = load_model(config.model, dtype=config.dtype,
                                      device=resolve_device(config.device, config.max_memory),
                                      trust_remote_code=config.trust_remote_code,
                                      tensor_parallel_size=config.tensor_parallel_size,
                                      max_memory=config.max_memory)
        if isinstance(config.tokenizer, str):  # vLLM's tokenizer=<name or path>
            tokenizer = load_tokenizer(config.tokenizer, config.trust_remote_code)
        elif config.tokenizer is not None:
            tokenizer = config.tokenizer
        return model, tokenizer
    if isinstance(config.tokenizer, str):
        return config.model.eval(), load_tokenizer(config.tokenizer, config.trust_remote_code)
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


def kv_budget(config: EngineConfig, model: nn.Module, max_model_len: int) -> int:
    """Tokens the KV cache holds over all sequences: ``kv_cache_tokens``; else enough for
    ``max_num_seqs`` full sequences, up to ``CPU_KV_CAP`` where a pool is in host memory and up
    to what ``gpu_memory_utilization`` leaves on each GPU that holds pools (a model-based
    proposer's KV cache gets its share)."""
    if config.kv_cache_tokens:
        return config.kv_cache_tokens
    tokens = config.max_num_seqs * max_model_len
    layers = Counter(attention_devices(model).values())  # device -> layers whose pools it holds
    per_layer = kv_bytes_per_token(model, config.tensor_parallel_size) // sum(layers.values())
    for device, count in layers.items():
        tokens = min(tokens, CPU_KV_CAP if device.type != "cuda" else
                     _gpu_kv_tokens(config, device, count * per_layer))
    return tokens


def _gpu_kv_tokens(config: EngineConfig, device: torch.device, bytes_per_token: int) -> int:
    """Tokens the pools on one GPU may hold within ``gpu_memory_utilization``."""
    free, total = torch.cuda.mem_get_info(device)
    # blocks torch's allocator holds but no tensor uses (an earlier engine's) are free for us
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    budget = total * config.gpu_memory_utilization - (total - free)
    budget -= max(GPU_RESERVE_BYTES, GPU_RESERVE_SHARE * total)  # activations, CUDA graphs
    spec = config.speculative_config
    if spec is not None and spec.num_speculative_tokens and proposer_needs_kv_cache(spec.method):
        budget *= TARGET_KV_SHARE_WITH_DRAFT
    tokens = int(budget // bytes_per_token)
    if tokens < 2:
        raise ValueError(f"EngineConfig.gpu_memory_utilization={config.gpu_memory_utilization} "
                         f"leaves no room for the KV cache on {device}: "
                         f"{(total - free) / 2**30:.1f} GiB of {total / 2**30:.1f} GiB are in use; "
                         "raise it or set kv_cache_tokens")
    return tokens


def kv_bytes_per_token(model: nn.Module, tensor_parallel_size: int = 1) -> int:
    """Bytes one cached token takes over all layers (keys and values, the model's dtype) in one
    rank's share of ``tensor_parallel_size``."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = (getattr(config, "num_key_value_heads", None) or heads) // tensor_parallel_size
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element


def proposer_context(config: EngineConfig, model: nn.Module, tokenizer: Any, vocab_size: int,
                     max_model_len: int, kv_tokens: int,
                     generator: torch.Generator | None = None,
                     input_embeddings: nn.Module | None = None,
                     output_embeddings: nn.Module | None = None) -> ProposerContext:
    """What a proposer factory gets: the target, the limits, and how the engine loads a model
    and runs one. A draft's KV cache holds the target's tokens plus every sequence's drafts.
    ``input_embeddings`` / ``output_embeddings``: whole copies of the target's (tensor
    parallelism: :func:`~engine.runner.tensor_parallel.whole_copies`)."""
    device = execution_device(model.get_input_embeddings())
    draft_kv_tokens = kv_tokens + config.max_num_seqs * (MAX_SPEC_LEN + 1)

    def make_runner(draft: nn.Module) -> ModelRunner:
        return ModelRunner(draft, config.max_num_seqs, draft_kv_tokens, max_model_len,
                           cuda_graph_max_new=graph_max_new(config),
                           fused_ops=None if config.fused_ops else False,
                           attention_backend=config.attention_backend)

    def load(name: str) -> tuple[nn.Module, Any]:
        return load_model(name, dtype=config.dtype, device=str(device))

    return ProposerContext(model, tokenizer, vocab_size, device, config.dtype,
                           config.max_num_seqs, max_model_len, load, make_runner, generator,
                           cuda_graphs=device.type == "cuda" and graph_max_new(config) > 0,
                           input_embeddings=input_embeddings,
                           output_embeddings=output_embeddings,
                           overlapped=config.tensor_parallel_size == 1 and (
                               config.async_scheduling if config.async_scheduling is not None
                               else device.type == "cuda"))


def graph_max_new(config: EngineConfig) -> int:
    """Steps of at most this many new tokens per sequence replay CUDA graphs (0: none): one
    token per decode step, k + 1 per verification (and per draft catch-up)."""
    if config.enforce_eager:
        return 0
    spec = config.speculative_config
    if spec is None:
        return 1
    if spec.draft_tree is not None:  # (a tree step verifies every node)
        return 1 + tree_size(spec.draft_tree, spec.num_speculative_tokens)
    return 1 + spec.num_speculative_tokens


def twin_width(config: EngineConfig) -> Callable[[int], int] | None:
    """The widest verification a batch of ``batch_size`` sequences runs, for the target
    runner's CUDA graphs (a decode bucket's capture also captures that width): with draft trees,
    a tree step's up to ``TREE_MAX_SEQS`` sequences and a chain's past them (a larger batch
    drafts chains); None: :func:`graph_max_new` at every batch."""
    spec = config.speculative_config
    if spec is None or spec.draft_tree is None:
        return None
    widest, chain = graph_max_new(config), spec.num_speculative_tokens + 1
    return lambda batch_size: widest if batch_size <= TREE_MAX_SEQS else chain


def build_components(config: EngineConfig) -> EngineComponents:
    torch.set_num_threads(config.num_threads or default_num_threads())  # (the whole process's)
    model, tokenizer = load_target(config)
    device = execution_device(model.get_input_embeddings())
    vocab_size = model.get_output_embeddings().weight.shape[0]
    own_len = model_max_len(model)
    max_model_len = min(config.max_model_len or own_len, own_len)
    source = (f"max_model_len={config.max_model_len}" if max_model_len != own_len
              else f"the model's context length {own_len}")
    spec = config.speculative_config
    whole: tuple[nn.Module | None, nn.Module | None] = (None, None)
    if config.tensor_parallel_size > 1 and spec is not None and spec.method in HEAD_METHODS:
        # (every rank gathers, before the KV budget is measured: rank 0 keeps the copies)
        whole = whole_copies(model)
    kv_tokens = kv_budget(config, model, max_model_len)
    if kv_tokens < max_model_len:
        max_model_len = kv_tokens
        source = (f"kv_cache_tokens={kv_tokens}" if config.kv_cache_tokens else
                  f"the default KV cache of {kv_tokens} tokens; raise kv_cache_tokens")
    tp = config.tensor_parallel_size
    if tp > 1:  # every rank holds the same tokens: the smallest rank's budget
        kv_tokens = agreed_minimum(kv_tokens)
        max_model_len = min(max_model_len, kv_tokens)
    runner = ModelRunner(model, config.max_num_seqs, kv_tokens, max_model_len,
                         cuda_graph_max_new=graph_max_new(config), tensor_parallel_size=tp,
                         fused_ops=None if config.fused_ops else False,
                         twin_width=twin_width(config),
                         prefix_caching=config.enable_prefix_caching,
                         attention_backend=config.attention_backend,
                         deterministic=config.deterministic)
    if tp > 1:
        runner = lead_or_follow(runner)  # a rank > 0 serves rank 0 here, then exits
    generator = None
    if config.seed is not None:
        generator = torch.Generator(device=device).manual_seed(config.seed)
    proposer = None
    if spec is not None and spec.num_speculative_tokens > 0:
        ctx = proposer_context(config, model, tokenizer, vocab_size, max_model_len, kv_tokens,
                               generator, *whole)
        proposer = get_proposer(spec.method, spec, ctx)
        if proposer.needs_features and proposer.feature_layers:
            runner.keep_aux_layers(proposer.feature_layers)  # (before any graph's capture)
    sampler = get_sampler("rejection") if spec is None else build_sampler(
        spec.acceptance_method, spec)
    greedy_sampler = get_sampler("greedy") if sampler.lossless else None
    return EngineComponents(model, tokenizer, runner, proposer, sampler, greedy_sampler, device,
                            vocab_size, max_model_len, eos_token_ids(model, tokenizer), generator,
                            source)
