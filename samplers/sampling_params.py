"""Per-request sampling parameters, with vLLM's names and defaults.

Every field checks itself in ``__post_init__``; an out-of-range value raises ``ValueError`` naming
the field, the value and the allowed range. Checks that need the model's vocabulary (token ids)
run in :meth:`SamplingParams.verify_vocab`, which the engine calls when a request is added.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from samplers.structured.params import StructuredOutputsParams

# Below this a temperature is treated as 0 (greedy), as in vLLM.
SAMPLING_EPS = 1e-5


def _fail(name: str, value: object, allowed: str) -> None:
    raise ValueError(f"SamplingParams.{name}={value!r} is invalid: allowed {allowed}")


def _check_range(name: str, value: float, lo: float | None, hi: float | None,
                 lo_open: bool = False, allowed: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        _fail(name, value, allowed or "a number")
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and value > hi
    if too_low or too_high:
        lo_s = "-inf" if lo is None else f"{lo}"
        hi_s = "inf" if hi is None else f"{hi}"
        _fail(name, value, allowed or f"{'(' if lo_open else '['}{lo_s}, {hi_s}]")


def _check_int(name: str, value: object, lo: int, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        _fail(name, value, allowed)


def _type_fail(name: str, value: object, allowed: str) -> None:
    raise TypeError(f"SamplingParams.{name}={value!r} has type {type(value).__name__}: "
                    f"allowed {allowed}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        _type_fail(name, value, "True or False")


def _as_list(name: str, value: object, allowed: str) -> list:
    """``value`` as a list; a string, a mapping or a scalar is a TypeError naming the field."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)):
        _type_fail(name, value, allowed)
    return list(value)


def _check_token_ids(name: str, ids: list[int]) -> None:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            _fail(name, ids, "a list of non-negative integer token ids")


@dataclass
class SamplingParams:
    """How one request is sampled and when it stops (vLLM's ``SamplingParams``).

    ``temperature=0`` means greedy decoding (top-k, top-p and min-p are then ignored).
    ``top_k`` of 0 or -1 turns top-k off. ``max_tokens=None`` runs to the context length.
    ``num_speculative_tokens`` (not in vLLM): this request verifies at most this many drafts per
    step, within the engine's own setting; 0 turns speculation off for it; None: the engine's.
    ``structured_outputs``: the output must match a JSON Schema, regex, choice or grammar
    (:class:`~samplers.structured.StructuredOutputsParams`, or a dict of its fields);
    ``guided_decoding`` is its older name (vLLM's), moved into it.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    best_of: int | None = None
    detokenize: bool = True
    truncate_prompt_tokens: int | None = None
    spaces_between_special_tokens: bool = True
    num_speculative_tokens: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1, "an integer >= 1")
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_range("repetition_penalty", self.repetition_penalty, 0.0, None, lo_open=True,
                     allowed="(0, inf)")
        _check_range("temperature", self.temperature, 0.0, None, allowed="[0, inf) (0 = greedy)")
        if self.temperature == float("inf"):
            _fail("temperature", self.temperature, "a finite number >= 0")
        _check_range("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            _fail("top_k", self.top_k, "-1 or 0 (off), or an integer >= 1")
        _check_range("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, "None or an integer >= 0")
        self.stop = self._normalize_stop(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        else:
            self.stop_token_ids = _as_list("stop_token_ids", self.stop_token_ids,
                                           "None or a list of token ids")
            _check_token_ids("stop_token_ids", self.stop_token_ids)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                     "detokenize", "spaces_between_special_tokens"):
            _check_bool(name, getattr(self, name))
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, 0, "None or an integer >= 0")
        if self.best_of is not None:
            _check_int("best_of", self.best_of, 1, "None or an integer >= 1")
            if self.best_of != self.n:
                _fail("best_of", self.best_of, f"None or n={self.n}: returning the best of more "
                      "samples than n is not supported (nor in vLLM's V1 engine)")
        if self.num_speculative_tokens is not None:
            _check_int("num_speculative_tokens", self.num_speculative_tokens, 0,
                       "None (the engine's) or an integer >= 0 (0: this request does not "
                       "speculate)")
        if self.truncate_prompt_tokens is not None:
            _check_int("truncate_prompt_tokens", self.truncate_prompt_tokens, 1,
                       "None or an integer >= 1 (keep the prompt's last tokens)")
        if self.stop and not self.detokenize:
            _fail("detokenize", False, "True when stop strings are given (they match the text)")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1, "None or an integer >= 1")
        _check_int("min_tokens", self.min_tokens, 0, "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            _fail("min_tokens", self.min_tokens, f"[0, max_tokens={self.max_tokens}]")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, "None or an integer >= 0")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                _type_fail("logit_bias", self.logit_bias, "None or a dict of token id -> bias")
            bias = {}
            for tok, val in dict(self.logit_bias).items():
                tok = int(tok) if isinstance(tok, str) and tok.lstrip("-").isdigit() else tok
                _check_token_ids("logit_bias", [tok])
                _check_range("logit_bias", val, -100.0, 100.0,
                             allowed="token id -> bias in [-100, 100]")
                bias[tok] = float(val)
            self.logit_bias = bias
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _as_list("allowed_token_ids", self.allowed_token_ids,
                                              "None or a list of token ids")
            if not self.allowed_token_ids:
                _fail("allowed_token_ids", [], "None or a non-empty list of token ids")
            _check_token_ids("allowed_token_ids", self.allowed_token_ids)
        if self.bad_words is not None:
            self.bad_words = _as_list("bad_words", self.bad_words,
                                      "None or a list of strings (one per word)")
            if any(not isinstance(w, str) or not w for w in self.bad_words):
                _fail("bad_words", self.bad_words, "a list of non-empty strings")
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                _fail("guided_decoding", self.guided_decoding, "None when structured_outputs "
                      "is given (guided_decoding is its older name)")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.coerce(self.structured_outputs,
                                                                     "structured_outputs")
        if self.temperature < SAMPLING_EPS:
            # Greedy: the filters cannot change the argmax, so switch them off (as vLLM does).
            self.temperature = 0.0
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    @staticmethod
    def _normalize_stop(stop: str | list[str] | None) -> list[str]:
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        stop = _as_list("stop", stop, "None, a string or a list of strings")
        if any(not isinstance(s, str) or not s for s in stop):
            _fail("stop", stop, "a string or a list of non-empty strings")
        return stop

    def clone(self) -> SamplingParams:
        """A deep copy (vLLM's ``SamplingParams.clone``)."""
        return copy.deepcopy(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    def verify_vocab(self, vocab_size: int) -> None:
        """Check every token id against the model's vocabulary (``[0, vocab_size)``)."""
        allowed = f"token ids in [0, {vocab_size})"
        for name in ("stop_token_ids", "allowed_token_ids"):
            ids = getattr(self, name) or []
            if any(t >= vocab_size for t in ids):
                _fail(name, ids, allowed)
        if self.logit_bias and any(t >= vocab_size for t in self.logit_bias):
            _fail("logit_bias", self.logit_bias, allowed)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value > vocab_size:
                _fail(name, value, f"[0, {vocab_size}]")
