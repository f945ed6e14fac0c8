"""Proposers by name: ``get_proposer("ngram" | "draft_model" | "early_exit", **kwargs)``.

- ``ngram``: ``prompt_lookup_min``, ``prompt_lookup_max`` (:class:`proposers.ngram.NgramProposer`).
- ``draft_model``: ``model`` (alias, hub id, path or a loaded model), ``tokenizer`` (needed with a
  loaded model when ``target_tokenizer`` is given), ``target_tokenizer``, ``target_vocab_size``,
  ``greedy``, ``device``, ``dtype``, ``max_num_seqs``, ``max_model_len``, ``max_num_tokens``.
- ``early_exit``: ``target_model``, ``num_layers``, ``greedy``, ``max_num_seqs``,
  ``max_model_len``, ``max_num_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proposers.base import Proposer

_FACTORIES: dict[str, Callable[..., Proposer]] = {}


def register_proposer(name: str) -> Callable[[Callable[..., Proposer]], Callable[..., Proposer]]:
    """Decorator: make ``factory(**kwargs) -> Proposer`` available as ``get_proposer(name)``."""

    def wrap(factory: Callable[..., Proposer]) -> Callable[..., Proposer]:
        _FACTORIES[name] = factory
        return factory

    return wrap


def get_proposer(method: str, **kwargs: Any) -> Proposer:
    """Build the proposer ``method`` with its own keyword arguments."""
    if method not in _FACTORIES:
        raise ValueError(f"method={method!r} is invalid: allowed {' | '.join(sorted(_FACTORIES))}")
    return _FACTORIES[method](**kwargs)


@register_proposer("ngram")
def _ngram(prompt_lookup_min: int = 1, prompt_lookup_max: int = 4) -> Proposer:
    from proposers.ngram import NgramProposer

    return NgramProposer(prompt_lookup_min, prompt_lookup_max)


@register_proposer("draft_model")
def _draft_model(model: Any, max_num_seqs: int, max_model_len: int, tokenizer: Any = None,
                 target_tokenizer: Any = None, target_vocab_size: int | None = None,
                 greedy: bool = False, device: str = "cpu", dtype: str = "auto",
                 max_num_tokens: int | None = None, cuda_graph_max_new: int = 0) -> Proposer:
    from proposers.draft_model import DraftModelProposer
    from proposers.vocab import check_shared_vocab

    if isinstance(model, str):
        from engine.model_loader import load_model

        model, tokenizer = load_model(model, dtype=dtype, device=device)
    if target_tokenizer is not None:
        if tokenizer is None:
            raise ValueError("tokenizer=None: the draft model's tokenizer is needed to check that "
                             "it shares the target's vocabulary")
        width = model.get_output_embeddings().weight.shape[0]
        check_shared_vocab(tokenizer, target_tokenizer, width)
    return DraftModelProposer(model, max_num_seqs, max_model_len, max_num_tokens, greedy,
                              target_vocab_size, cuda_graph_max_new)


@register_proposer("early_exit")
def _early_exit(target_model: Any, max_num_seqs: int, max_model_len: int,
                num_layers: int | None = None, greedy: bool = False,
                max_num_tokens: int | None = None, cuda_graph_max_new: int = 0) -> Proposer:
    from proposers.early_exit import make_early_exit_proposer

    return make_early_exit_proposer(target_model, max_num_seqs, max_model_len, num_layers, greedy,
                                    max_num_tokens, cuda_graph_max_new)
