"""``LLM``: the user-facing API, shaped like vLLM's so that code written for it ports.

>>> from engine import LLM, SamplingParams                                    # doctest: +SKIP
>>> llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
>>> out = llm.generate(["Repeat: the cat sat on the mat."], SamplingParams(temperature=0))
>>> out[0].outputs[0].text
"""

from __future__ import annotations

import itertools
import logging
from collections import abc, deque
from pathlib import Path
from typing import Any

from tqdm import tqdm  # (text bars: tqdm.auto warns in a notebook without ipywidgets)

from engine.config import EngineConfig, SpeculativeConfig, field_names
from engine.inputs import Messages, Prompt, normalize_conversations, normalize_prompts
from engine.llm_engine import LLMEngine
from engine.outputs import EngineMetrics, RequestMetrics, RequestOutput, StreamDelta
from engine.sequence import Sequence
from samplers.sampling_params import SamplingParams

# A request that fails alone (its output has finish_reason='error') is also logged here, so that
# a loop written for vLLM, which raises for such prompts, does not print empty text unnoticed.
logger = logging.getLogger("specdec")


class LLM:
    """A target model with optional speculative decoding, serving batches of prompts.

    ``model``: hub id, local path, ``.gguf`` file, ``"smollm2-135m"`` (the embedded default), or an
    already-loaded HF causal LM together with ``tokenizer``. ``speculative_config``: None (plain
    decoding), a dict or a :class:`SpeculativeConfig`. Other keyword arguments are
    :class:`EngineConfig` fields (``max_num_batched_tokens``, ``max_model_len``,
    ``kv_cache_tokens``, and vLLM's ``gpu_memory_utilization``, ``logprobs_mode``,
    ``trust_remote_code``, ``tensor_parallel_size``); vLLM keywords that mean nothing here are
    a ``ValueError`` naming them (:data:`VLLM_ONLY_KEYWORDS`).
    """

    def __init__(self, model: Any = "smollm2-135m",
                 speculative_config: SpeculativeConfig | dict[str, Any] | None = None,
                 tokenizer: Any = None, dtype: str = "auto", device: str = "auto",
                 max_num_seqs: int = 32, seed: int | None = 0, **engine_kwargs: Any) -> None:
        check_engine_keywords(engine_kwargs)
        self.config = EngineConfig(model=model, tokenizer=tokenizer, dtype=dtype, device=device,
                                   max_num_seqs=max_num_seqs, seed=seed,
                                   speculative_config=speculative_config, **engine_kwargs)
        self.engine = LLMEngine(self.config)
        self.default_sampling_params = SamplingParams()
        self._ids = itertools.count()
        # request id -> the inbox of the open call (generate, a stream) that owns the request
        self._inboxes: dict[str, deque[Sequence]] = {}

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

    @property
    def llm_engine(self) -> LLMEngine:
        """vLLM's name for :attr:`engine`."""
        return self.engine

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Prompt | abc.Sequence[Prompt],
                 sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in prompt order.

        ``prompts``: a string, a list of strings, or token id lists (or vLLM's dicts
        ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``). ``sampling_params``: one for
        all prompts or one per prompt. Invalid prompts and parameters raise ``TypeError`` /
        ``ValueError`` before any work; a request that cannot run (empty prompt, prompt longer
        than the context) comes back with ``finish_reason='error'`` and ``error`` set while the
        others complete.
        """
        return self._generate(normalize_prompts(prompts, self.engine.tokenizer), sampling_params,
                              use_tqdm)

    def _generate(self, inputs: list[tuple[str | None, list[int]]],
                  sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None,
                  use_tqdm: bool) -> list[RequestOutput]:
        ids = self._add(inputs, sampling_params, together=True)
        outputs: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), disable=not use_tqdm, desc="Processed prompts") as bar:
            for seq, last in self._updates(ids, self._inboxes[ids[0]] if ids else deque()):
                if last:
                    outputs[seq.request_id] = build_output(
                        self.engine.pop_request(seq.request_id))
                    if outputs[seq.request_id].error is not None:
                        logger.error("request %s failed: %s", seq.request_id,
                                     outputs[seq.request_id].error)
                    bar.update(1)
        return [outputs[rid] for rid in ids]

    def chat(self, messages: Messages | abc.Sequence[Messages],
             sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_kwargs: dict[str, Any] | None = None,
             tools: list[dict[str, Any]] | None = None) -> list[RequestOutput]:
        """Apply the chat template (the tokenizer's, or ``chat_template``) to one conversation (a
        list of ``{"role", "content"}`` dicts) or to a list of them, then generate. The outputs'
        ``prompt`` is the formatted text. ``continue_final_message``: the last (assistant)
        message is left open for the model to continue, instead of a new turn."""
        inputs = self.chat_inputs(messages, chat_template, add_generation_prompt,
                                  continue_final_message, chat_template_kwargs, tools)
        return self._generate(inputs, sampling_params, use_tqdm)

    def chat_inputs(self, messages: Messages | abc.Sequence[Messages],
                    chat_template: str | None = None, add_generation_prompt: bool = True,
                    continue_final_message: bool = False,
                    chat_template_kwargs: dict[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> list[tuple[str, list[int]]]:
        """``(formatted text, token ids)`` of each conversation after the chat template."""
        conversations = normalize_conversations(messages)
        tokenizer = self.engine.tokenizer
        if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("this model's tokenizer has no chat template; pass chat_template= "
                             "or use generate()")
        if continue_final_message and add_generation_prompt:
            add_generation_prompt = False  # (vLLM: the two cannot both hold; continuing wins)
        inputs = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(
                conversation, chat_template=chat_template, tools=tools, tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(chat_template_kwargs or {}))
            inputs.append((text, list(tokenizer(text, add_special_tokens=False)["input_ids"])))
        return inputs

    def generate_stream(
            self, prompts: Prompt | abc.Sequence[Prompt],
            sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None = None,
    ) -> abc.Iterator[StreamDelta]:
        """Yield text deltas as tokens are accepted, for every sample of every prompt; the last
        delta of a sample has ``finish_reason`` set (and ``error`` when it failed). Text that
        could still be the start of a stop string is held back until it is not (or the sample
        finishes). Several streams (and ``generate`` calls) may be open at once: each sees
        exactly its own requests' deltas."""
        ids = self._add(normalize_prompts(prompts, self.engine.tokenizer), sampling_params)
        return _Stream(self, ids)

    def _stream(self, ids: list[str]) -> abc.Iterator[StreamDelta]:
        for seq, last in self._updates(ids, self._inboxes[ids[0]] if ids else deque()):
            delta = seq.take_delta()
            if last:  # before yielding: the caller may abort meanwhile
                self.engine.pop_request(seq.request_id)
            if delta is not None:
                yield delta

    def _updates(self, ids: list[str],
                 inbox: deque[Sequence]) -> abc.Iterator[tuple[Sequence, bool]]:
        """This call's sequences as the steps update them (through ``inbox``, registered when
        the requests were added), with True for a request's last sample to finish, until every
        request finished. Steps run here route other open calls' updates to their inboxes.
        However the call ends (finished, an exception, a consumer that stops reading), its
        requests leave the engine."""
        pending = _Pending(self.engine, ids)
        try:
            while pending.remaining:
                if not inbox:
                    if not self.engine.has_work():
                        raise RuntimeError(f"requests {sorted(pending.remaining)} cannot finish: "
                                           "the engine has nothing left to run")
                    self._step()
                while inbox:
                    seq = inbox.popleft()
                    if seq.request_id in pending.remaining:
                        yield seq, pending.finished(seq)
        finally:
            self._release(ids)

    def _release(self, ids: list[str]) -> None:
        """A call ended: its requests leave the engine and nothing more is routed to it."""
        for rid in ids:
            self._inboxes.pop(rid, None)
            self.engine.discard_request(rid)

    def _step(self) -> None:
        """One engine step; each updated sequence goes to the inbox of the call that owns it."""
        for seq in self.engine.step():
            inbox = self._inboxes.get(seq.request_id)
            if inbox is not None:
                inbox.append(seq)

    def abort(self, request_id: str | int) -> None:
        """Stop a request now; it finishes with ``finish_reason='abort'`` and its output so far.
        An id the engine does not hold (finished and returned already) is ignored, as in vLLM."""
        if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
            raise TypeError(f"request_id must be a string (or an int), got "
                            f"{type(request_id).__name__} {request_id!r}")
        self.engine.abort_request(str(request_id))

    # ------------------------------------------------------------------ metrics
    def get_metrics(self, baseline_tokens_per_s: float | None = None) -> EngineMetrics:
        """Engine metrics; with the tokens/s of a no-speculation run, also the measured speedup."""
        return self.engine.metrics.snapshot(baseline_tokens_per_s,
                                            self.engine.runner.num_prefix_cached_tokens)

    def reset_metrics(self) -> None:
        self.engine.metrics.reset()

    # ------------------------------------------------------------------ helpers
    def _add(self, prompts: list[tuple[str | None, list[int]]],
             sampling_params: SamplingParams | abc.Sequence[SamplingParams] | None,
             together: bool = False) -> list[str]:
        """Add the requests; ``together``: the caller returns when all have finished
        (``generate``, not a stream: see ``LLMEngine.add_request``)."""
        if sampling_params is None:
            sampling_params = self.default_sampling_params
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        elif not isinstance(sampling_params, (list, tuple)):
            raise TypeError("sampling_params must be a SamplingParams or a list of them (one per "
                            f"prompt), got {type(sampling_params).__name__} "
                            f"{sampling_params!r:.60}")
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} "
                                 "prompts: give one, or one per prompt")
        for p in params:
            if not isinstance(p, SamplingParams):
                raise TypeError("sampling_params must be a SamplingParams or a list of them (one "
                                f"per prompt), got {type(p).__name__} {p!r:.60}")
            self.engine.check_params(p)
        ids: list[str] = []
        inbox: deque[Sequence] = deque()  # this call's: the steps route its updates here
        try:
            for (text, token_ids), p in zip(prompts, params, strict=True):
                if p.truncate_prompt_tokens is not None:
                    token_ids = token_ids[-p.truncate_prompt_tokens:]  # (vLLM: keep the end)
                ids.append(str(next(self._ids)))
                self._inboxes[ids[-1]] = inbox
                self.engine.add_request(ids[-1], text, token_ids, p, together)
        except BaseException:
            self._release(ids)
            raise
        return ids


# vLLM keywords of LLM(...) that have no meaning in this engine, and why (a ValueError names them).
VLLM_ONLY_KEYWORDS = {
    "pipeline_parallel_size": "one GPU is served",
    "quantization": "weights run in the dtype they load in",
    "kv_cache_dtype": "the KV cache is in the model's dtype",
    "swap_space": "preemption recomputes, it does not swap",
    "cpu_offload_gb": "there is no CPU offload",
    "block_size": "the KV cache is paged per token",
    "enable_lora": "LoRA adapters are not served",
    "tokenizer_mode": "the model's own Hugging Face tokenizer is used",
    "skip_tokenizer_init": "the tokenizer is needed for stop strings and text",
    "hf_overrides": "the model's config is used as it is",
    "compilation_config": "CUDA graphs are captured without torch.compile",
    "max_seq_len_to_capture": "graphs are captured per bucket (engine.runner.cuda_graphs)",
    "distributed_executor_backend": "one process serves",
    "load_format": "weights load through transformers",
    "revision": "models load from local files or the local Hugging Face cache",
}
# vLLM keywords accepted as no-ops: what they ask for is what happens here anyway.
VLLM_NOOP_KEYWORDS = ("disable_log_stats", "enable_chunked_prefill")


def check_engine_keywords(kwargs: dict[str, Any]) -> None:
    """Drop vLLM's no-op keywords; raise ValueError for vLLM-only and unknown ones."""
    for key in VLLM_NOOP_KEYWORDS:
        kwargs.pop(key, None)
    allowed = field_names(EngineConfig)
    for key in kwargs:
        if key in VLLM_ONLY_KEYWORDS:
            raise ValueError(f"LLM({key}=...) is a vLLM keyword with no meaning here: "
                             f"{VLLM_ONLY_KEYWORDS[key]}; remove it")
        if key not in allowed:
            raise ValueError(f"unknown key {key!r} for LLM / EngineConfig; allowed: "
                             f"{', '.join(allowed)}")


class _Stream(abc.Iterator[StreamDelta]):
    """The iterator ``LLM.generate_stream`` returns. Its requests are in the engine from the
    call on; closing it (or dropping it, even unstarted) takes them out."""

    def __init__(self, llm: LLM, ids: list[str]) -> None:
        self._llm, self._ids = llm, ids
        self._deltas = llm._stream(ids)

    def __next__(self) -> StreamDelta:
        return next(self._deltas)

    def close(self) -> None:
        self._deltas.close()  # (runs the generator's cleanup if it started)
        self._llm._release(self._ids)  # (and covers one that never started)

    def __del__(self) -> None:
        self.close()


class _Pending:
    """Requests not finished yet, counted by their unfinished samples."""

    def __init__(self, engine: LLMEngine, request_ids: list[str]) -> None:
        self.engine = engine
        self.remaining = {rid: len(engine.requests[rid]) for rid in request_ids}
        self._done: set[str] = set()

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
    prompt_logprobs = next((s.prompt_logprobs for s in seqs if s.prompt_logprobs is not None
                            and len(s.prompt_logprobs) == len(s.prompt_token_ids)), None)
    return RequestOutput(request_id=first.request_id, prompt=first.prompt,
                         prompt_token_ids=list(first.prompt_token_ids),
                         outputs=[s.completion() for s in seqs],
                         finished=all(s.is_finished for s in seqs), metrics=metrics,
                         error=errors[0] if errors else None,
                         prompt_logprobs=None if prompt_logprobs is None else list(prompt_logprobs),
                         num_cached_tokens=first.num_cached_tokens or 0)
