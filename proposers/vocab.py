"""A draft model must speak the target's vocabulary: same token ids for the same tokens."""

from __future__ import annotations

from typing import Any


def check_shared_vocab(draft_tokenizer: Any, target_tokenizer: Any, draft_vocab_size: int) -> None:
    """Raise ValueError, naming both tokenizers, unless draft and target share one vocabulary.

    Both tokenizers must map every token string to the same id (``get_vocab()``, added tokens
    included). The models' logit widths may differ (embedding matrices are often padded), as long
    as the draft's covers every token of its tokenizer: a draft narrower than the target has its
    probabilities zero-padded to the target's width, a wider one loses its padding columns.
    """
    draft_name = _name(draft_tokenizer)
    target_name = _name(target_tokenizer)
    draft_vocab = draft_tokenizer.get_vocab()
    target_vocab = target_tokenizer.get_vocab()
    if draft_vocab != target_vocab:
        differ = sorted(set(draft_vocab.items()) ^ set(target_vocab.items()), key=str)[:3]
        raise ValueError(
            f"draft tokenizer {draft_name!r} ({len(draft_vocab)} tokens) and target tokenizer "
            f"{target_name!r} ({len(target_vocab)} tokens) do not share one vocabulary "
            f"(token -> id pairs in only one of them, e.g. {differ}); speculative decoding "
            "needs a draft model with the target's tokenizer")
    if draft_vocab_size < len(draft_vocab):
        raise ValueError(f"the draft model ({draft_name!r}) has {draft_vocab_size} logits, fewer "
                         f"than the {len(draft_vocab)} tokens of its tokenizer")


def _name(tokenizer: Any) -> str:
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
