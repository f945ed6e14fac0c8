"""Log-probabilities as vLLM returns them: per position a ``dict[token_id, Logprob]`` holding the
chosen token and the ``n`` most likely ones, each with its rank and text.

What the values are (``EngineConfig.logprobs_mode``, vLLM's names):

- ``raw_logprobs`` (the default, as in vLLM): ``log_softmax`` of the model's own logits, before
  penalties, bias, temperature and the top-k / top-p / min-p filters;
- ``processed_logprobs``: ``log_softmax`` of the distribution the token is sampled from (after
  all of them); tokens a filter removed have ``-inf`` and are never listed among the top ``n``;
- ``raw_logits`` / ``processed_logits``: the same two, as logits instead of log-probabilities.

``rank`` is 1 for the most likely token (1 + the number of tokens strictly more likely).
Prompt log-probabilities (``SamplingParams.prompt_logprobs``) are always raw: the first prompt
token has none (``None``), as in vLLM.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (imported in the functions: outputs and configs read this module cheaply)
    import torch

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")


@dataclass
class Logprob:
    """One token's value at one position (vLLM's ``Logprob``)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]


def to_values(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """``logits [num_rows, vocab_size]`` as the mode's values (log-probabilities or logits)."""
    logits = logits.float()
    import torch

    return logits if mode.endswith("_logits") else torch.log_softmax(logits, dim=-1)


def position_entries(values: torch.Tensor, token_ids: list[int], top_n: int,
                     tokenizer: Any) -> list[PositionLogprobs]:
    """``values [len(token_ids), vocab_size]``: for each row, the chosen token and the ``top_n``
    best (``-inf`` never among them), with ranks and decoded text."""
    import torch

    chosen = torch.tensor(token_ids, device=values.device)
    facts = logprob_facts(values, chosen, min(top_n, values.shape[-1]))
    return entries_of(*(f.tolist() for f in facts), token_ids, tokenizer)


def logprob_facts(values: torch.Tensor, token_ids: torch.Tensor,
                  k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a position's entry is made of, on the values' device (nothing read back):
    ``values [n, vocab_size]``, ``token_ids [n]`` (the chosen tokens), ``k <= vocab_size`` best
    kept; returns the chosen tokens' values ``[n]``, their ranks ``[n]`` (1 + the tokens
    strictly better), and the ``k`` best values and ids ``[n, k]`` (best first)."""
    import torch

    chosen = values.gather(1, token_ids[:, None])[:, 0]  # [n]
    ranks = (values > chosen[:, None]).sum(dim=-1) + 1  # [n]
    top_values, top_ids = torch.topk(values, k, dim=-1)  # [n, k] each
    return chosen, ranks, top_values, top_ids


def entries_of(chosen: list[float], ranks: list[int], top_values: list[list[float]],
               top_ids: list[list[int]], token_ids: list[int],
               tokenizer: Any) -> list[PositionLogprobs]:
    """The entries of :func:`logprob_facts`' values, read back: each row's chosen token, then
    its best ones in order (``-inf`` never among them), with ranks and decoded text."""
    text = _texts(tokenizer)
    entries = []
    for row, token in enumerate(token_ids):
        entry = {token: Logprob(chosen[row], ranks[row], text(token))}
        for rank, (value, tid) in enumerate(zip(top_values[row], top_ids[row], strict=True),
                                            start=1):
            if value == float("-inf"):
                break
            if tid not in entry:
                entry[tid] = Logprob(value, rank, text(tid))
        entries.append(entry)
    return entries


# tokenizer -> token id -> its text alone: a step's entries decode every listed token, and a
# tokenizer's decode of one id costs microseconds of Python (192 decodes a step at batch 32
# with logprobs=5); the text of one id never changes
_TEXTS: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def _texts(tokenizer: Any) -> Callable[[int], str | None]:
    """A token id's text alone, by ``tokenizer`` (None: no text), decoded once."""
    if tokenizer is None:
        return lambda token_id: None
    try:
        texts = _TEXTS.get(tokenizer)
        if texts is None:
            texts = _TEXTS[tokenizer] = {}
    except TypeError:  # (a tokenizer that cannot be weakly referenced: not cached)
        return lambda token_id: tokenizer.decode([token_id])

    def text(token_id: int) -> str:
        found = texts.get(token_id)
        if found is None:
            found = texts[token_id] = tokenizer.decode([token_id])
        return found

    return text
