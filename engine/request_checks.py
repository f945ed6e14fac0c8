"""Checks of a request before it is queued: what makes it fail alone, with a message naming the
field and the value."""

from __future__ import annotations

from typing import Any

from samplers import SamplingParams
from samplers.logits_adjust import tokenize_bad_words
from samplers.structured import Grammars


def check_sampling_params(params: SamplingParams, vocab_size: int, tokenizer: Any,
                          grammars: Grammars | None = None) -> None:
    """Raise ``ValueError`` when ``params`` names token ids outside the vocabulary, a bad
    word that the tokenizer turns into no tokens (it could never be banned), or a structured
    output constraint that does not compile (``grammars`` compiles and keeps it)."""
    params.verify_vocab(vocab_size)
    if params.structured_outputs is not None and grammars is not None:
        grammars.compile(params.structured_outputs)
    for word in params.bad_words or []:
        if not tokenize_bad_words(tokenizer, [word]):
            raise ValueError(f"SamplingParams.bad_words entry {word!r} tokenizes to no "
                             "tokens: it cannot ban anything")


def request_error(prompt_token_ids: list[int], params: SamplingParams, vocab_size: int,
                  max_model_len: int, max_model_len_source: str) -> str | None:
    """Why a request cannot run (empty prompt, prompt too long for the context, ids outside
    the vocabulary), or None."""
    if len(prompt_token_ids) == 0:
        return "the prompt is empty: at least one token is needed"
    if len(prompt_token_ids) >= max_model_len:
        return (f"the prompt has {len(prompt_token_ids)} tokens; this engine holds at most "
                f"{max_model_len} tokens per sequence (set by "
                f"{max_model_len_source}), which leaves no room for output")
    bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
    if bad:
        return f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})"
    try:
        params.verify_vocab(vocab_size)
    except ValueError as exc:
        return str(exc)
    return None

