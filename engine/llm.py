"""``LLM``: the user-facing API, shaped like vLLM's so that code written for it ports.

>>> from engine import LLM, SamplingParams                                    # doctest: +SKIP
>>> llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
>>> out = llm.generate(["Repeat: the cat sat on the mat."], SamplingParams(temperature=0))
>>> out[0].outputs[0].text
"""

from __future__ import annotations

import itertools
from collections import abc
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from engine.config import EngineConfig, SpeculativeConfig
from engine.llm_engine import LLMEngine
from engine.outputs import EngineMetrics, RequestMetrics, RequestOutput, StreamDelta
from engine.sequence import Sequence
from samplers.sampling_params import SamplingParams

Prompt = str | abc.Sequence[int] | dict[str, Any]  # text, token ids, or vLLM's dict forms
Messages = list[dict[str, str]]


class LLM:
    """A target model with optional speculative decoding, serving batches of prompts.

    ``model``: hub id, local path, ``.gguf`` file, ``"smollm2-135m"`` (the embedded default), or an
    already-loaded HF causal LM together with ``tokenizer``. ``speculative_config``: None (plain
    decoding), a dict or a :class:`SpeculativeConfig`. Other keyword arguments are
    :class:`EngineConfig` fields (``max_num_batched_tokens``, ``max_model_len``,
    ``kv_cache_tokens``).
    """

    def __init__(self, model: Any = "smollm2-135m",
                 speculative_config: SpeculativeConfig | dict[str, Any] | None = None,
                 tokenizer: Any = None, dtype: str = "auto", device: str = "auto",
                 max_num_seqs: int = 32, seed: int | None = 0, **engine_kwargs: Any) -> None:
        self.config = EngineConfig(model=model, tokenizer=tokenizer, dtype=dtype, device=device,
                                   max_num_seqs=max_num_seqs, seed=seed,
                                   speculative_config=speculative_config, **engine_kwargs)
        self.engine = LLMEngine(self.config)
        self.default_sampling_params = SamplingParams()
        self._ids = itertools.count()

    @classmethod
    def from_config_file(cls, path: str | Path, **overrides: Any) -> LLM:
        """Build from a YAML preset of ``configs/`` (name or path); keyword arguments override
        its engine keys. The preset's ``sampling`` section becomes the default SamplingParams."""
        from engine.presets import load_config_file

        preset = load_config_file(path)
        llm = cls(**{**preset.engine, **overrides})
        llm.default_sampling_params = SamplingParams(**preset.sampling)
        return llm

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Prompt | abc.Sequence[Prompt],
                 sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in prompt order.

        ``prompts``: a string, a list of strings, or token id lists (or vLLM's dicts
        ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``). ``sampling_params``: one for
        all prompts or one per prompt. Invalid parameters raise ``ValueError`` before any work; a
        request that cannot run (empty prompt, prompt longer than the context) comes back with
        ``finish_reason='error'`` and ``error`` set while the others complete.
        """
        ids = self._add(self._normalize_prompts(prompts), sampling_params)
        try:
            pending = _Pending(self.engine, ids)
            with tqdm(total=len(ids), disable=not use_tqdm, desc="Processed prompts") as bar:
                while pending:
                    for seq in self.engine.step():
                        if pending.finished(seq):
                            bar.update(1)
            return [self._output(rid) for rid in ids]
        finally:  # (raised mid-flight: the engine keeps nothing of this call)
            for rid in ids:
                self.engine.discard_request(rid)

    def chat(self, messages: Messages | abc.Sequence[Messages],
             sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation (a list of
        ``{"role", "content"}`` dicts) or to a list of them, then :meth:`generate`."""
        return self.generate(self.chat_prompts(messages, add_generation_prompt),
                             sampling_params, use_tqdm)

    def chat_prompts(self, messages: Messages | abc.Sequence[Messages],
                     add_generation_prompt: bool = True) -> list[list[int]]:
        """Token ids of each conversation after the chat template."""
        tokenizer = self.engine.tokenizer
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("this model's tokenizer has no chat template; use generate()")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict):
            messages = [messages]
        prompts = []
        for conversation in messages:
            text = tokenizer.apply_chat_template(list(conversation), tokenize=False,
                                                 add_generation_prompt=add_generation_prompt)
            prompts.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        return prompts

    def generate_stream(
            self, prompts: Prompt | abc.Sequence[Prompt],
            sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None = None,
    ) -> abc.Iterator[StreamDelta]:
        """Yield text deltas as tokens are accepted, for every sample of every prompt; the last
        delta of a sample has ``finish_reason`` set. Text that could still be the start of a stop
        string is held back until it is not (or the sample finishes)."""
        ids = self._add(self._normalize_prompts(prompts), sampling_params)
        try:
            pending = _Pending(self.engine, ids)
            while pending:
                for seq in self.engine.step():
                    if seq.request_id not in pending.remaining:
                        continue
                    delta = self._delta(seq)
                    if pending.finished(seq):  # before yielding: the caller may abort meanwhile
                        self.engine.pop_request(seq.request_id)
                    if delta is not None:
                        yield delta
        finally:  # (the consumer stopped early or raised: the engine keeps nothing of this call)
            for rid in ids:
                self.engine.discard_request(rid)

    def abort(self, request_id: str) -> None:
        """Stop a request now; it finishes with ``finish_reason='abort'`` and its output so far."""
        self.engine.abort_request(request_id)

    # ------------------------------------------------------------------ metrics
    def get_metrics(self, baseline_tokens_per_s: float | None = None) -> EngineMetrics:
        """Engine metrics; with the tokens/s of a no-speculation run, also the measured speedup."""
        return self.engine.metrics.snapshot(baseline_tokens_per_s)

    def reset_metrics(self) -> None:
        self.engine.metrics.reset()

    # ------------------------------------------------------------------ helpers
    def _normalize_prompts(self, prompts: Prompt | abc.Sequence[Prompt]) -> list[tuple[str | None,
                                                                                   list[int]]]:
        if isinstance(prompts, (str, dict)) or (
                isinstance(prompts, (list, tuple)) and prompts
                and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of strings or a list of token id "
                             f"lists, got {type(prompts).__name__}")
        return [self._one_prompt(prompt) for prompt in prompts]

    def _one_prompt(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of a string, a token id list, or vLLM's dict forms
        ``{"prompt": text}`` and ``{"prompt_token_ids": ids}``."""
        if isinstance(prompt, dict):
            keys = set(prompt)
            if keys == {"prompt"} and isinstance(prompt["prompt"], str):
                prompt = prompt["prompt"]
            elif keys == {"prompt_token_ids"}:
                prompt = prompt["prompt_token_ids"]
                if not isinstance(prompt, (list, tuple)):
                    raise ValueError("prompt_token_ids must be a list of token ids, got "
                                     f"{type(prompt).__name__}")
            else:
                raise ValueError(f"a prompt dict must have exactly one key, 'prompt' (a string) "
                                 f"or 'prompt_token_ids' (token ids), got keys {sorted(keys)}")
        if isinstance(prompt, str):
            ids = self.engine.tokenizer(prompt)["input_ids"] if prompt else []
            return prompt, list(ids)
        if isinstance(prompt, (list, tuple)) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise ValueError(f"each prompt must be a string or a list of token ids (or a dict with "
                         f"'prompt' or 'prompt_token_ids'), got {type(prompt).__name__}")

    def _add(self, prompts: list[tuple[str | None, list[int]]],
             sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None) -> list[str]:
        if sampling_params is None:
            sampling_params = self.default_sampling_params
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} "
                                 "prompts: give one, or one per prompt")
        for p in params:
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params entries must be SamplingParams, got "
                                 f"{type(p).__name__}")
            self.engine.check_params(p)
        ids = []
        for (text, token_ids), p in zip(prompts, params, strict=True):
            rid = str(next(self._ids))
            self.engine.add_request(rid, text, token_ids, p)
            ids.append(rid)
        return ids

    def _output(self, request_id: str) -> RequestOutput:
        seqs = self.engine.pop_request(request_id)
        return build_output(seqs)

    @staticmethod
    def _delta(seq: Sequence) -> StreamDelta | None:
        text = seq.text
        if not seq.is_finished and seq.params.stop:
            hold = max(len(s) for s in seq.params.stop) - 1
            text = text[:max(len(text) - hold, seq.num_streamed_chars)]
        new_text = text[seq.num_streamed_chars:]
        new_tokens = seq.output_token_ids[seq.num_streamed_tokens:]
        if not new_text and not new_tokens and not seq.is_finished:
            return None
        seq.num_streamed_chars = len(text)
        seq.num_streamed_tokens = seq.num_output_tokens
        return StreamDelta(seq.request_id, seq.index, new_text, new_tokens, seq.finish_reason,
                           seq.stop_reason)


class _Pending:
    """Requests not finished yet, counted by their unfinished samples."""

    def __init__(self, engine: LLMEngine, request_ids: list[str]) -> None:
        self.engine = engine
        self.remaining = {rid: len(engine.requests[rid]) for rid in request_ids}
        self._done: set[str] = set()

    def __bool__(self) -> bool:
        if self.remaining and not self.engine.has_work():
            raise RuntimeError(f"requests {sorted(self.remaining)} cannot finish: the engine has "
                               "nothing left to run")
        return bool(self.remaining)

    def finished(self, seq: Sequence) -> bool:
        """Count a sample that finished; True when it was its request's last one."""
        if not seq.is_finished or seq.seq_id in self._done or seq.request_id not in self.remaining:
            return False
        self._done.add(seq.seq_id)
        self.remaining[seq.request_id] -= 1
        if self.remaining[seq.request_id] == 0:
            del self.remaining[seq.request_id]
            return True
        return False


def build_output(seqs: list[Sequence]) -> RequestOutput:
    """The API view of a request's samples."""
    first = seqs[0]
    metrics = RequestMetrics(arrival_time=first.metrics.arrival_time)
    for seq in seqs:
        metrics.add(seq.metrics)
    firsts = [s.metrics.first_token_time for s in seqs if s.metrics.first_token_time is not None]
    metrics.first_token_time = min(firsts) if firsts else None
    if all(s.metrics.finished_time is not None for s in seqs):
        metrics.finished_time = max(s.metrics.finished_time for s in seqs)
    errors = [s.error for s in seqs if s.error]
    return RequestOutput(request_id=first.request_id, prompt=first.prompt,
                         prompt_token_ids=list(first.prompt_token_ids),
                         outputs=[s.completion() for s in seqs],
                         finished=all(s.is_finished for s in seqs), metrics=metrics,
                         error=errors[0] if errors else None)
