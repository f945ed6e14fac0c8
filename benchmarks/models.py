"""Targets for the suites: the default model, a path or hub id, or a LLaMA of real shape with
random weights (what a step costs does not depend on what the weights say).

Random models get a synthetic word-level tokenizer (``w0 .. w{vocab-1}``, built offline) and
token-id prompts (``benchmarks/workloads.py``). :func:`decisive` makes a random target's greedy
output stable in bf16 at the same cost, for suites that compare outputs token for token.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

# Real shapes, random weights: Llama-3.2-1B (1.24 B parameters) and Llama-3.1-8B (8.0 B).
RANDOM_LLAMAS = {
    "random-llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                            vocab_size=128256, tie_word_embeddings=True),
    "random-llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                            vocab_size=128256, tie_word_embeddings=False),
    # The default model's shape (SmolLM2-135M) on random weights: what its steps and the
    # shipped draft head's proposals cost (not what they accept) in one device call, without
    # bringing the real weights (../shared/tools/gpu-default-model.md takes two)
    "random-smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                vocab_size=49152, tie_word_embeddings=True),
    # (a forward of next to nothing: on CPU what a step costs beyond it is the host's work)
    "random-llama-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              vocab_size=512, tie_word_embeddings=False),
}
RANDOM_EOS_ID = 1


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    return "float32" if device == "cpu" else "bfloat16"


def add_model_arguments(parser: argparse.ArgumentParser, model: str) -> None:
    """``--model`` (default ``model``), ``--device`` (CUDA when present) and ``--dtype``
    (float32 on CPU, bfloat16 on CUDA); :func:`resolve` fills the dtype in."""
    parser.add_argument("--model", default=model,
                        help=f"smollm2-135m, a path or hub id, or one of {sorted(RANDOM_LLAMAS)}")
    parser.add_argument("--device", default=default_device(), help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bf16 on CUDA")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    args.dtype = args.dtype or default_dtype(args.device)
    return args


def random_config(name: str) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**RANDOM_LLAMAS[name], max_position_embeddings=4096, bos_token_id=None,
                       eos_token_id=RANDOM_EOS_ID, pad_token_id=0)


def build_model(name: str, device: str, dtype: str) -> tuple[Any, Any]:
    """(model, tokenizer): a random LLaMA of real shape (seeded), or what ``load_model`` loads."""
    if name in RANDOM_LLAMAS:
        from transformers import AutoModelForCausalLM

        config = random_config(name)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype),
                                                     attn_implementation="sdpa")
        return model.eval(), word_tokenizer(config.vocab_size)
    from engine.runner.loader import load_model

    return load_model(name, dtype=dtype, device=device)


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over ``w0 .. w{vocab_size-1}`` (built offline, no files)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": RANDOM_EOS_ID}
    vocab.update({f"w{i}": i for i in range(2, vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>",
                                   pad_token="<unk>")


def decisive(model: torch.nn.Module) -> torch.nn.Module:
    """The same shapes and costs, with greedy margins far above bf16 noise: the output head
    becomes a permutation of the token embeddings, every layer's output projections zero."""
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        perm = torch.randperm(emb.shape[0], generator=torch.Generator().manual_seed(0))
        model.get_output_embeddings().weight.copy_(emb[perm.to(emb.device)] * 8)
        for layer in model.base_model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def vocab_size(model: torch.nn.Module) -> int:
    return model.get_output_embeddings().weight.shape[0]
