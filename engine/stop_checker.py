"""When a sample stops, checked after every appended token (also inside an accepted run).

Order of the checks for a new token (vLLM's):

1. Before ``min_tokens`` output tokens nothing stops the sample (EOS and stop token ids are also
   masked out of the logits then, see :mod:`engine.logits_adjust`).
2. EOS (unless ``ignore_eos``) -> ``stop``, ``stop_reason=None``.
3. A token of ``stop_token_ids`` -> ``stop``, ``stop_reason=<the id>``.
   For 2 and 3 the token stays in ``token_ids``; its text is dropped from ``text`` unless
   ``include_stop_str_in_output``.
4. A stop string appearing in the text -> ``stop``, ``stop_reason=<the string>``; the text is cut
   before it (after it with ``include_stop_str_in_output``).
5. ``max_tokens`` output tokens, or the context full (``max_model_len``) -> ``length``.

The caller drops every token after the one that stopped the sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.request import Request
from engine.sampling_params import SamplingParams


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


def check_stop(params: SamplingParams, token_id: int, token_text: str, text: str,
               num_output_tokens: int, num_total_tokens: int, eos_token_ids: frozenset[int],
               max_model_len: int) -> StopResult | None:
    """Check the newest token (already appended to ``text`` as ``token_text``).

    ``num_output_tokens`` and ``num_total_tokens`` count it too.
    """
    if num_output_tokens < params.min_tokens:
        return None
    include = params.include_stop_str_in_output
    if not params.ignore_eos and token_id in eos_token_ids:
        kept = text if include else text[:len(text) - len(token_text)]
        return StopResult("stop", None, kept)
    if token_id in params.stop_token_ids:
        kept = text if include else text[:len(text) - len(token_text)]
        return StopResult("stop", token_id, kept)
    if params.stop and token_text:
        found = find_stop_string(text, len(token_text), params.stop, include)
        if found is not None:
            return StopResult("stop", found[0], found[1])
    if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
        return StopResult("length", None, text)
    if num_total_tokens >= max_model_len:
        return StopResult("length", None, text)
    return None


def append_until_stop(request: Request, token_ids: list[int], eos_token_ids: frozenset[int],
                      max_model_len: int) -> int:
    """Append ``token_ids`` to a running sample one by one, checking stops after each; return how
    many were kept. The token that stops the sample is kept; the ones after it are dropped."""
    params = request.params
    for count, token_id in enumerate(token_ids, start=1):
        request.append_token(token_id)
        token_text = request.detokenizer.add_token(token_id)
        request.text += token_text
        result = check_stop(params, token_id, token_text, request.text,
                            request.num_output_tokens, request.num_tokens, eos_token_ids,
                            max_model_len)
        if result is not None:
            request.text = result.text
            request.finish(result.finish_reason, result.stop_reason)
            return count
    return len(token_ids)
