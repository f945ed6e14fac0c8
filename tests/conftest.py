"""Shared fixtures: tiny random Hugging Face causal LMs built from configs (no network), and
where the Triton kernels' tests run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)

TINY_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")

# Triton runs CUDA tensors compiled, or CPU tensors through its interpreter (TRITON_INTERPRET=1).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# where a kernel test puts its tensors: CPU under the interpreter (or where no GPU is), else CUDA
DEVICE = "cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda"
needs_triton = pytest.mark.skipif(
    not INTERPRETED and not torch.cuda.is_available(),
    reason="Triton runs CPU tensors only through its interpreter: TRITON_INTERPRET=1 (the "
           "README's test command sets it)")


@pytest.fixture(autouse=True)
def _interpreted_kernels_where_asked(request, monkeypatch):
    """On CPU the draft head's fused kernels run under Triton's interpreter one program (a row
    and a head) at a time: an engine test drafting with a head took minutes there
    (tests/engine/test_llm_sampling.py's ``eagle-top_k_top_p``: 5:42, against 1.5 s through
    the PyTorch reference). So a test drafts through the reference, which the kernels equal
    (tests/proposers/test_head_kernels.py), unless it is marked ``head_kernels``: those
    tests, the head's drafts against a written-out oracle and the engine's greedy output
    against Hugging Face's (tests/proposers/test_draft_head.py). Off CPU the kernels always
    run (compiled)."""
    if INTERPRETED and request.node.get_closest_marker("head_kernels") is None:
        from proposers import chain_inputs, head_kernels

        monkeypatch.setattr(head_kernels, "_INTERPRETED", False)
        monkeypatch.setattr(chain_inputs, "_INTERPRETED", False)
    # (likewise the fed chains' layout kernel, a program a sequence: an overlapped batch of
    # 500 samples took minutes a generate call; tests/engine/runner/test_chain_layout.py
    # checks the kernel against the reference)
    if INTERPRETED and request.node.get_closest_marker("layout_kernel") is None:
        from engine.runner import chain_layout

        monkeypatch.setattr(chain_layout, "_INTERPRETED", False)


def tiny_config(family: str, vocab_size: int = 128, num_layers: int = 2, **overrides):
    """A small config of ``family`` (grouped-query attention where the family has it);
    ``overrides`` go to the config's constructor."""
    rope = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                vocab_size=vocab_size, tie_word_embeddings=False)
    if family == "llama":
        return LlamaConfig(**{**rope, **overrides})
    if family == "qwen2":
        return Qwen2Config(**{**rope, **overrides})
    if family == "qwen3":
        return Qwen3Config(**{**rope, "head_dim": 16, **overrides})
    if family == "mistral":
        return MistralConfig(**{**rope, "sliding_window": None, **overrides})
    if family == "gpt2":
        return GPT2Config(**{**dict(n_embd=64, n_layer=num_layers, n_head=4, n_positions=256,
                                    vocab_size=vocab_size, bos_token_id=0, eos_token_id=0),
                             **overrides})
    raise ValueError(f"family must be one of {TINY_FAMILIES}, got {family!r}")


def tiny_model(family: str, vocab_size: int = 128, seed: int = 0, num_layers: int = 2,
               dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa",
               **config_overrides) -> PreTrainedModel:
    """A tiny random causal LM of ``family`` in eval mode, reproducible from ``seed``."""
    config = tiny_config(family, vocab_size=vocab_size, num_layers=num_layers, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.to(dtype).eval()


@pytest.fixture(scope="session")
def specdec_cache_dir() -> Path:
    """The user's model cache ($SPECDEC_CACHE_DIR or ~/.cache/specdec), shared with every other
    load of the default model, so that a test run dequantizes its GGUF file at most once."""
    from engine.runner.loader import default_cache_dir

    return default_cache_dir()


@pytest.fixture(scope="session")
def default_model(specdec_cache_dir):
    """The embedded default model (SmolLM2-135M-Instruct, float32 on CPU) and its tokenizer.

    The first load on a machine dequantizes the GGUF file (~25-40 s) and writes the safetensors
    copy into ``specdec_cache_dir``; later loads take a few seconds.
    """
    from engine.runner.loader import load_model

    return load_model("smollm2-135m", dtype="float32", device="cpu", cache_dir=specdec_cache_dir)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random LLaMA with a word-level tokenizer and a chat template, saved once (the
    benchmark suites' smoke tests run on it)."""
    from tests.engine.cli.cli_helpers import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"))
