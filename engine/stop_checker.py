"""When a sample stops, checked after every appended token (also inside an accepted run).

Order of the checks for a new token (vLLM's):

1. Before ``min_tokens`` output tokens nothing stops the sample (EOS and stop token ids are also
   masked out of the logits then, see :mod:`samplers.logits_adjust`).
2. EOS (unless ``ignore_eos``) -> ``stop``, ``stop_reason=None``.
3. A token of ``stop_token_ids`` -> ``stop``, ``stop_reason=<the id>``.
   For 2 and 3 the token stays in ``token_ids``; its text is dropped from ``text`` unless
   ``include_stop_str_in_output``.
4. A stop string appearing in the text -> ``stop``, ``stop_reason=<the string>``; the text is cut
   before it (after it with ``include_stop_str_in_output``).
5. ``max_tokens`` output tokens, or the context full (``max_model_len``) -> ``length``.

The caller drops every token after the one that stopped the sample.

A sample without stop strings or stop token ids that gets one token (the overlapped path's plain
steps) is checked from the facts it took from its parameters once (``Sequence.stop_facts``:
:func:`fact_stop`).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sequence import Sequence
from samplers.sampling_params import SamplingParams

EOS_STOP, LENGTH_STOP = 1, 2  # (fact_stop's answers)


@dataclass
class StopResult:
    """Why a sample stopped and the text it keeps."""

    finish_reason: str
    stop_reason: str | int | None
    text: str


def find_stop_string(text: str, new_chars: int, stops: list[str],
                     include_stop: bool) -> tuple[str, str] | None:
    """The first stop string that ends inside the last ``new_chars`` characters of ``text``.

    Returns ``(stop, kept_text)`` or None. Only matches that end in the new text are looked for
    (older ones were checked before). Among several the earliest in the text wins.

    >>> find_stop_string("Hello world. Bye", 6, [".", "Bye"], False)
    ('.', 'Hello world')
    """
    best: tuple[int, str] | None = None
    for stop in stops:
        start = max(len(text) - new_chars - len(stop) + 1, 0)
        pos = text.find(stop, start)
        if pos != -1 and (best is None or pos < best[0]):
            best = (pos, stop)
    if best is None:
        return None
    pos, stop = best
    return stop, text[:pos + len(stop)] if include_stop else text[:pos]


def check_token_stop(params: SamplingParams, token_id: int, num_output_tokens: int,
                     num_total_tokens: int, eos_token_ids: frozenset[int],
                     max_model_len: int) -> StopResult | None:
    """Every check but stop strings, on the newest token's id; ``text`` of the result is "" and
    ``stop`` results mean the token's text is dropped unless ``include_stop_str_in_output``.

    ``num_output_tokens`` and ``num_total_tokens`` count the token too.
    """
    if num_output_tokens < params.min_tokens:
        return None
    if not params.ignore_eos and token_id in eos_token_ids:
        return StopResult("stop", None, "")
    if token_id in params.stop_token_ids:
        return StopResult("stop", token_id, "")
    if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
        return StopResult("length", None, "")
    if num_total_tokens >= max_model_len:
        return StopResult("length", None, "")
    return None


def fact_stop(facts: tuple[int, int, bool], token_id: int, num_output_tokens: int,
              num_total_tokens: int, eos_token_ids: frozenset[int], max_model_len: int) -> int:
    """:func:`check_token_stop` from a sample's ``Sequence.stop_facts`` (the counts include
    the token): 0 it goes on, ``EOS_STOP`` EOS stops it (``stop``: its text dropped unless
    ``include_stop_str_in_output``), ``LENGTH_STOP`` its length does (``length``)."""
    if num_output_tokens < facts[0]:
        return 0
    if facts[2] and token_id in eos_token_ids:
        return EOS_STOP
    if num_output_tokens >= facts[1] or num_total_tokens >= max_model_len:
        return LENGTH_STOP
    return 0


def check_stop(params: SamplingParams, token_id: int, token_text: str, text: str,
               num_output_tokens: int, num_total_tokens: int, eos_token_ids: frozenset[int],
               max_model_len: int) -> StopResult | None:
    """Check the newest token (already appended to ``text`` as ``token_text``).

    ``num_output_tokens`` and ``num_total_tokens`` count it too.
    """
    if num_output_tokens < params.min_tokens:
        return None
    found = check_token_stop(params, token_id, num_output_tokens, num_total_tokens,
                             eos_token_ids, max_model_len)
    include = params.include_stop_str_in_output
    if found is not None and found.finish_reason == "stop":
        kept = text if include else text[:len(text) - len(token_text)]
        return StopResult("stop", found.stop_reason, kept)
    if params.stop and token_text:
        stop = find_stop_string(text, len(token_text), params.stop, include)
        if stop is not None:
            return StopResult("stop", stop[0], stop[1])
    return None if found is None else StopResult(found.finish_reason, None, text)


def append_until_stop(seq: Sequence, token_ids: list[int], eos_token_ids: frozenset[int],
                      max_model_len: int) -> int:
    """Append ``token_ids`` to a running sample one by one, checking stops after each; return how
    many were kept. The token that stops the sample is kept; the ones after it are dropped.

    Only stop strings need each token's text at once; without them the tokens' text is
    detokenized when :attr:`Sequence.text` is next read (two decodes per read, not per token).
    """
    params = seq.params
    if not params.stop:
        for count, token_id in enumerate(token_ids, start=1):
            result = check_token_stop(params, token_id, seq.num_output_tokens + 1,
                                      seq.num_tokens + 1, eos_token_ids, max_model_len)
            cut = (result is not None and result.finish_reason == "stop"
                   and not params.include_stop_str_in_output)
            seq.append_token(token_id, with_text=not cut)
            if result is not None:
                seq.finish(result.finish_reason, result.stop_reason)
                return count
        return len(token_ids)
    text = seq.text
    for count, token_id in enumerate(token_ids, start=1):
        seq.append_token(token_id, with_text=False)
        token_text = seq.detokenizer.add_token(token_id)
        text += token_text
        result = check_stop(params, token_id, token_text, text, seq.num_output_tokens,
                            seq.num_tokens, eos_token_ids, max_model_len)
        if result is not None:
            seq.text = result.text
            seq.finish(result.finish_reason, result.stop_reason)
            return count
    seq.text = text
    return len(token_ids)
