"""Proposers built the way the engine builds them: a model runner injected, a context given."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, models
from torch import nn
from transformers import PreTrainedTokenizerFast

from engine.config import SpeculativeConfig
from engine.runner.model_runner import ModelRunner
from proposers import Proposer, ProposerContext, get_proposer
from proposers.draft_model import DraftModelProposer


def word_tokenizer(words: list[str], name: str) -> PreTrainedTokenizerFast:
    """A tokenizer whose vocabulary is ``words`` (ids in order), named ``name`` in errors."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "w0")),
        unk_token="w0")
    tok.name_or_path = name
    return tok


def draft_runner(model: nn.Module, max_num_seqs: int, max_model_len: int,
                 max_num_tokens: int | None = None) -> ModelRunner:
    """A runner over ``model`` whose KV cache holds ``max_num_tokens`` (default: all slots full)."""
    return ModelRunner(model, max_num_seqs, max_num_tokens or max_num_seqs * max_model_len,
                       max_model_len)


def draft_proposer(model: nn.Module, max_num_seqs: int, max_model_len: int,
                   max_num_tokens: int | None = None, greedy: bool = False,
                   target_vocab_size: int | None = None) -> DraftModelProposer:
    return DraftModelProposer(draft_runner(model, max_num_seqs, max_model_len, max_num_tokens),
                              greedy, target_vocab_size)


def make_context(target: nn.Module, max_num_seqs: int, max_model_len: int,
            target_tokenizer: Any = None, vocab_size: int | None = None) -> ProposerContext:
    """What the engine's builder hands a proposer factory, for a target and its limits."""

    def load_model(name: str):
        raise AssertionError(f"a test must not load {name!r}")

    width = target.get_output_embeddings().weight.shape[0]
    return ProposerContext(
        target, target_tokenizer, vocab_size or width, target.device, "auto", max_num_seqs,
        max_model_len, load_model,
        lambda draft: draft_runner(draft, max_num_seqs, max_model_len))


def build(method: str, ctx: ProposerContext, **spec: Any) -> Proposer:
    """``get_proposer(method, SpeculativeConfig(method=method, **spec), ctx)``."""
    return get_proposer(method, SpeculativeConfig(method=method, **spec), ctx)
