"""Per-sample state: one ``Sequence`` per sample the engine decodes (a request with ``n`` samples
becomes ``n`` of them, sharing ``request_id`` and told apart by ``index``)."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.logprobs import PositionLogprobs, position_entries
from engine.outputs import CompletionOutput, RequestMetrics, StreamDelta
from samplers.logits_adjust import LogitsAdjuster
from samplers.sampling_params import SamplingParams
from samplers.structured import GrammarState
from scheduler import RequestSpeculation, SequenceStatus


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed derived deterministically from ``parts`` (stable across runs and machines)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


NO_LIMIT = 1 << 62  # (stop_facts: no max_tokens)


def stop_facts(params: SamplingParams) -> tuple[int, int, bool] | None:
    """``(min_tokens, max_tokens or NO_LIMIT, EOS stops it)``: all that decides whether one new
    token stops a sample when it has no stop strings or stop token ids
    (``engine.stop_checker.fact_stop``); None when it has (those are checked a token at a time,
    ``engine.stop_checker.append_until_stop``)."""
    if params.stop or params.stop_token_ids:
        return None
    return (params.min_tokens, NO_LIMIT if params.max_tokens is None else params.max_tokens,
            not params.ignore_eos)


class Sequence:
    """One sample of a request: prompt, output so far, its cache slot, stop state and metrics.

    ``num_computed_tokens`` counts the tokens whose keys and values sit in the target's KV cache
    (``slot``). The newest output token is never cached yet: it is fed at the next step.
    ``seed``: the sample's own seed (``SamplingParams.seed`` for sample 0, a seed derived from it
    for the others), None to draw from the engine's RNG. Its random numbers are keyed by the seed
    and the output position (``samplers.keyed_random``).
    """

    def __init__(self, request_id: str, index: int, prompt: str | None,
                 prompt_token_ids: list[int], params: SamplingParams, tokenizer: Any,
                 eos_token_ids: frozenset[int], arrival_time: float) -> None:
        self.request_id = request_id
        self.index = index
        self.seq_id = f"{request_id}#{index}"
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.stop_facts = stop_facts(params)
        self.seed = None if params.seed is None else (
            params.seed if index == 0 else derive_seed(params.seed, index))
        self.status = SequenceStatus.WAITING
        self.output_token_ids: list[int] = []
        # prompt + output, kept in step with output_token_ids by append_token (no copy per step)
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens: int | None = None  # served by the prefix cache at admission
        self.slot: int | None = None
        self.detokenizer = IncrementalDetokenizer(tokenizer, self.prompt_token_ids,
                                                  params.skip_special_tokens,
                                                  params.spaces_between_special_tokens)
        self._text = ""
        self._untexted: list[int] = []  # output tokens whose text is not in _text yet
        self.num_streamed_chars = 0
        self.num_streamed_tokens = 0
        self.final_streamed = False  # the delta with the finish reason went out
        self.tokenizer = tokenizer
        self.logprobs: list[PositionLogprobs] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0 if params.logprobs is not None else None
        # [None] then one entry per prompt token after the first, filled as the prompt prefills
        self.prompt_logprobs: list[PositionLogprobs | None] | None = (
            [None] if params.prompt_logprobs is not None else None)
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.adjuster = LogitsAdjuster(params, self.prompt_token_ids, eos_token_ids, tokenizer)
        self.speculation: RequestSpeculation | None = None  # set by the engine's policy
        # the matcher of params.structured_outputs' grammar (set by the engine), else None
        self.grammar: GrammarState | None = None

    # ------------------------------------------------------------------ derived values
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)  # (prompt + output: a hot read, one len)

    @property
    def num_uncached_tokens(self) -> int:
        """Context tokens not in the KV cache yet (all before prefill, 1 when decoding)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def text(self) -> str:
        """The output's text so far (detokenized when read: see :meth:`append_token`)."""
        if self._untexted:
            self._text += self.detokenizer.add_tokens(self._untexted)
            self._untexted = []
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        self._untexted = []
        self._text = value

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    # ------------------------------------------------------------------ transitions
    def append_token(self, token_id: int, with_text: bool = True) -> None:
        """Append an output token. Its text joins :attr:`text` when that is next read, in one
        detokenization with the other tokens appended meanwhile; ``with_text=False`` leaves it
        out of the text (a stop token whose text is dropped)."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if with_text and self.params.detokenize:
            self._untexted.append(token_id)

    def extend_tokens(self, token_ids: list[int]) -> None:
        """:meth:`append_token` of each of ``token_ids``, with its text (a commit whose tokens
        cannot stop the sample appends them at once)."""
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)
        if self.params.detokenize:
            self._untexted.extend(token_ids)

    def add_logprobs(self, values: torch.Tensor, token_ids: list[int]) -> None:
        """``values [len(token_ids), vocab_size]`` (see :mod:`engine.logprobs`) at the positions
        of the appended ``token_ids``: keeps each one's and the top ``logprobs`` ones."""
        self.append_logprobs(position_entries(values, token_ids, self.params.logprobs,
                                              self.tokenizer), token_ids)

    def append_logprobs(self, entries: list[PositionLogprobs], token_ids: list[int]) -> None:
        """The entries of the appended ``token_ids``' positions (:mod:`engine.logprobs`)."""
        for entry, token in zip(entries, token_ids, strict=True):
            self.logprobs.append(entry)
            self.cumulative_logprob += entry[token].logprob

    @property
    def next_prompt_logprob_position(self) -> int | None:
        """The prompt position whose logits give the next missing prompt logprob (None: all
        there, or none asked for)."""
        if self.prompt_logprobs is None or len(self.prompt_logprobs) >= len(self.prompt_token_ids):
            return None
        return len(self.prompt_logprobs) - 1

    def add_prompt_logprobs(self, values: torch.Tensor) -> None:
        """``values [n, vocab_size]``: the next ``n`` prompt positions' raw values."""
        start = len(self.prompt_logprobs)
        tokens = self.prompt_token_ids[start:start + values.shape[0]]
        self.prompt_logprobs += position_entries(values, tokens, self.params.prompt_logprobs,
                                                 self.tokenizer)

    def reset_for_recompute(self) -> None:
        """Preempted: the cache is gone; prompt + output are prefilled again later."""
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.slot = None
        self.metrics.num_preemptions += 1

    def finish(self, reason: str, stop_reason: str | int | None = None,
               error: str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.error = error

    def take_delta(self) -> StreamDelta | None:
        """What is new since the last delta (None: nothing yet). Text that could still be the
        start of a stop string is held back until it is not; the finished sample's last delta
        carries ``finish_reason`` (and ``error``) exactly once."""
        if self.final_streamed:
            return None
        text = self.text
        if not self.is_finished and self.params.stop:
            hold = max(len(s) for s in self.params.stop) - 1
            text = text[:max(len(text) - hold, self.num_streamed_chars)]
        new_text = text[self.num_streamed_chars:]
        new_tokens = self.output_token_ids[self.num_streamed_tokens:]
        if not new_text and not new_tokens and not self.is_finished:
            return None
        self.num_streamed_chars = len(text)
        self.num_streamed_tokens = self.num_output_tokens
        self.final_streamed = self.is_finished
        return StreamDelta(self.request_id, self.index, new_text, new_tokens, self.finish_reason,
                           self.stop_reason, self.error)

    def completion(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index, text=self.text, token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason, stop_reason=self.stop_reason,
            logprobs=None if self.logprobs is None else list(self.logprobs),
            cumulative_logprob=self.cumulative_logprob)
