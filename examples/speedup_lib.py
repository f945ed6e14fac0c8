"""Timing of greedy generation: the engine with no speculation, with each proposer (n-gram,
early-exit self-draft, the shipped draft head ``eagle``, and ``ngram_eagle``) for several fixed k
and with the default policy (the adaptive controller, ``adaptive_k=True``), beside Hugging Face
``generate`` plain and with ``prompt_lookup_num_tokens``.

Shared by ``02_speedups.ipynb`` and ``compare_speedups.py``. Every system decodes greedily
(temperature 0) the same token ids (:mod:`prompt_sets`) with the same weights, and stops at EOS
or ``max_tokens``, so the engine's outputs are token for token Hugging Face's and tokens/s compare
like for like. Times are wall-clock seconds around the whole call (prefill included) after one
warm-up call.

Batch 1 runs the prompts one after another; a batch of B submits B prompts at once (the engine
decodes them together; Hugging Face ``generate`` pads them on the left; its prompt lookup only
works at batch 1).

The theory to compare with: Leviathan et al. (arXiv 2211.17192, eq. 1). With per-token acceptance
``alpha``, ``k`` drafts per step and a draft step costing ``c`` target steps, one step yields
``(1 - alpha^(k+1)) / (1 - alpha)`` tokens for the cost of ``k c + 1`` plain steps:
``S = (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))`` (:func:`engine.metrics.predicted_speedup`).
It assumes that scoring k+1 tokens costs the target as much as scoring one, and that every step
drafts k tokens; where these fail (a CPU's forward grows with the tokens scored; n-gram lookup
finds nothing to draft on some steps) the measured speedup falls short of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from prompt_sets import prompt_batch, prompt_set

from engine import LLM, SamplingParams
from engine.metrics import predicted_speedup

SPEC_METHODS = ("ngram", "early_exit", "eagle", "ngram_eagle")
ENGINE_METHODS = ("none", *SPEC_METHODS)
HF_METHODS = ("hf", "hf_prompt_lookup")
METHODS = ENGINE_METHODS + HF_METHODS
LABELS = {"none": "engine, no speculation", "ngram": "engine, n-gram",
          "early_exit": "engine, early-exit self-draft", "eagle": "engine, draft head (eagle)",
          "ngram_eagle": "engine, n-gram or head", "hf": "HF generate",
          "hf_prompt_lookup": "HF generate, prompt lookup"}


@dataclass
class Measurement:
    """One (method, k, prompt kind, batch size) timing; speculation counters for the engine.

    ``token_acceptance``: Leviathan's alpha (accepted / tested drafts, a draft being tested when
    no earlier draft of its step was rejected); ``draft_cost_ratio``: c, measured by the engine.
    ``acceptance_per_position[i]``: drafts accepted at position i / drafts verified there, a
    draft after a rejected one counting as verified and not accepted (the engine's
    ``EngineMetrics.acceptance_per_position``). ``policy``: the default policy (the adaptive
    controller) ran, with ``k`` its cap, instead of a fixed k.
    ``outputs``: the generated token ids of each prompt, in prompt order.
    """

    method: str
    k: int
    kind: str
    batch_size: int
    num_tokens: int
    seconds: float
    acceptance_rate: float | None = None
    token_acceptance: float | None = None
    mean_accepted_length: float | None = None
    acceptance_per_position: list[float] = field(default_factory=list)
    draft_cost_ratio: float | None = None
    outputs: list[list[int]] = field(default_factory=list)
    policy: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def predicted_speedup(self) -> float | None:
        """Leviathan's S from this run's alpha, k and c (None without speculation or a fixed k)."""
        if self.method not in SPEC_METHODS or self.policy or self.token_acceptance is None:
            return None
        return predicted_speedup(self.token_acceptance, self.k, self.draft_cost_ratio or 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s,
                "predicted_speedup": self.predicted_speedup}


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_default_model(device: str | None = None) -> tuple[Any, Any]:
    """The embedded default model (SmolLM2-135M-Instruct) and its tokenizer, loaded once."""
    from engine.runner.loader import load_model

    return load_model("smollm2-135m", device=device or default_device())


def make_llm(model: Any, tokenizer: Any, method: str, k: int, max_batch_size: int,
             adaptive_k: bool = False, max_model_len: int = 1024,
             **spec: Any) -> LLM:
    """An engine over an already-loaded model. ``method`` ``none`` means no speculation; with a
    fixed k (``adaptive_k=False``) every step drafts k tokens whenever the proposer finds some;
    ``eagle`` and ``ngram_eagle`` load the draft head shipped for the default model."""
    if method not in ENGINE_METHODS:
        raise ValueError(f"method={method!r} is invalid: allowed {' | '.join(ENGINE_METHODS)}")
    config = None
    if method != "none":
        config = {"method": method, "num_speculative_tokens": k, "adaptive_k": adaptive_k, **spec}
    return LLM(model=model, tokenizer=tokenizer, speculative_config=config,
               max_num_seqs=max_batch_size, max_model_len=max_model_len,
               kv_cache_tokens=max_batch_size * max_model_len)


def _batches(prompts: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    return [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]


def time_engine(llm: LLM, prompts: list[list[int]], max_tokens: int, batch_size: int,
                method: str, k: int, kind: str, policy: bool = False) -> Measurement:
    """Greedy generation of ``prompts`` in batches of ``batch_size``, after a short warm-up."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    llm.reset_metrics()
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for batch in _batches(prompts, batch_size):
        outputs += [list(o.outputs[0].token_ids)
                    for o in llm.generate(batch, params, use_tqdm=False)]
    seconds = time.perf_counter() - start
    m = llm.get_metrics()
    spec = method != "none"
    return Measurement(
        method=method, k=k, kind=kind, batch_size=batch_size,
        num_tokens=sum(len(o) for o in outputs), seconds=seconds,
        acceptance_rate=m.acceptance_rate if spec else None,
        token_acceptance=m.token_acceptance if spec else None,
        mean_accepted_length=m.mean_accepted_length if spec else None,
        acceptance_per_position=list(m.acceptance_per_position) if spec else [],
        draft_cost_ratio=m.draft_cost_ratio if spec else None, outputs=outputs, policy=policy)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [] if ids is None else [ids])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _until_eos(ids: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[:i + 1]
    return ids


@torch.inference_mode()
def _hf_generate(model: Any, tokenizer: Any, batch: list[list[int]], max_tokens: int,
                 prompt_lookup: int | None) -> list[list[int]]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch],
                        device=model.device)
    extra = {} if prompt_lookup is None else {"prompt_lookup_num_tokens": prompt_lookup}
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                         do_sample=False, pad_token_id=pad, **extra)
    eos = _eos_ids(model, tokenizer)
    return [_until_eos(row[width:].tolist(), eos) for row in out]


def time_hf(model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: int,
            batch_size: int, kind: str, prompt_lookup: int | None = None) -> Measurement:
    """Hugging Face greedy ``generate``, plain or with ``prompt_lookup_num_tokens`` (batch 1)."""
    if prompt_lookup is not None and batch_size != 1:
        raise ValueError("prompt_lookup works at batch_size=1 only in Hugging Face generate")
    _hf_generate(model, tokenizer, prompts[:1], 2, prompt_lookup)
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for batch in _batches(prompts, batch_size):
        outputs += _hf_generate(model, tokenizer, batch, max_tokens, prompt_lookup)
    seconds = time.perf_counter() - start
    return Measurement(method="hf" if prompt_lookup is None else "hf_prompt_lookup",
                       k=prompt_lookup or 0, kind=kind, batch_size=batch_size,
                       num_tokens=sum(len(o) for o in outputs), seconds=seconds, outputs=outputs)


def run_sweep(model: Any, tokenizer: Any, kinds: Iterable[str] = ("copy", "open"),
              methods: Iterable[str] = METHODS, ks: Iterable[int] = range(1, 9),
              batch_sizes: Iterable[int] = (1, 16), max_tokens: int = 64,
              num_prompts: int | None = None,
              log: Callable[[Measurement], None] | None = None,
              batched_ks: Iterable[int] | None = None,
              policy_k: int | None = None) -> list[Measurement]:
    """Every (kind, batch size, method, k) measurement. Batch 1 runs each prompt of a kind alone
    (``num_prompts`` of them, all by default); batch B runs B prompts of the kind at once.
    ``none`` and ``hf`` run once (k = 0); ``hf_prompt_lookup`` only at batch 1. ``batched_ks``:
    the k values at batch sizes above 1 (default: ``ks``). ``policy_k``: also run each proposer
    with the default policy (``adaptive_k=True``), at most ``policy_k`` drafts a step."""
    methods, ks = list(methods), list(ks)
    batched_ks = ks if batched_ks is None else list(batched_ks)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"methods {unknown} are invalid: allowed {' | '.join(METHODS)}")
    results: list[Measurement] = []
    for batch_size in batch_sizes:
        prompts = {kind: prompt_set(tokenizer, kind, num_prompts) if batch_size == 1
                   else prompt_batch(tokenizer, kind, batch_size, num_prompts) for kind in kinds}
        for method in methods:
            if method == "hf_prompt_lookup" and batch_size > 1:
                continue
            runs = [(k, False) for k in ([0] if method in ("none", "hf")
                                         else ks if batch_size == 1 else batched_ks)]
            if policy_k is not None and method in SPEC_METHODS:
                runs.append((policy_k, True))
            for k, policy in runs:
                llm = (make_llm(model, tokenizer, method, k, batch_size, adaptive_k=policy)
                       if method in ENGINE_METHODS else None)
                for kind, kind_prompts in prompts.items():
                    if llm is not None:
                        m = time_engine(llm, kind_prompts, max_tokens, batch_size, method, k,
                                        kind, policy)
                    else:
                        m = time_hf(model, tokenizer, kind_prompts, max_tokens, batch_size, kind,
                                    k if method == "hf_prompt_lookup" else None)
                    results.append(m)
                    if log is not None:
                        log(m)
    return results


def find(results: list[Measurement], method: str, kind: str, batch_size: int,
         k: int | None = None, policy: bool = False) -> list[Measurement]:
    """The measurements of one method on one prompt kind and batch size (one k, or all), by k:
    those at a fixed k, or (``policy=True``) the default policy's."""
    found = [m for m in results if m.method == method and m.kind == kind
             and m.batch_size == batch_size and (k is None or m.k == k) and m.policy == policy]
    return sorted(found, key=lambda m: m.k)


def measured_speedup(m: Measurement, results: list[Measurement]) -> float | None:
    """tokens/s of ``m`` over the engine's without speculation, same prompts and batch size."""
    base = find(results, "none", m.kind, m.batch_size)
    if not base or base[0].tokens_per_s == 0:
        return None
    return m.tokens_per_s / base[0].tokens_per_s


def format_table(results: list[Measurement]) -> str:
    """A plain-text table: one line per measurement, with the speedup over the engine without
    speculation and Leviathan's prediction."""
    head = (f"{'kind':<5} {'batch':>5} {'method':<17} {'k':>3} {'tokens':>6} {'s':>7} "
            f"{'tok/s':>7} {'speedup':>7} {'alpha':>5} {'c':>5} {'pred.':>5}")
    lines = [head, "-" * len(head)]

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    order = lambda m: (m.kind, m.batch_size, METHODS.index(m.method), m.policy, m.k)
    for m in sorted(results, key=order):
        speedup = num(measured_speedup(m, results), '7.2f')
        k = f"<={m.k}" if m.policy else str(m.k)  # (the policy: at most k drafts a step)
        lines.append(
            f"{m.kind:<5} {m.batch_size:>5} {m.method:<17} {k:>3} {m.num_tokens:>6} "
            f"{m.seconds:>7.2f} {m.tokens_per_s:>7.2f} {speedup:>7} "
            f"{num(m.token_acceptance, '5.2f'):>5} {num(m.draft_cost_ratio, '5.2f'):>5} "
            f"{num(m.predicted_speedup, '5.2f'):>5}")
    return "\n".join(lines)


def machine_description() -> str:
    """One line naming the device the measurements ran on (GPU name, or CPU model and cores)."""
    import os
    import platform

    import transformers

    if torch.cuda.is_available():
        device = f"GPU {torch.cuda.get_device_name()}"
    else:
        model = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                model = next(line.split(":", 1)[1].strip() for line in f
                             if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        device = f"CPU {model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    return (f"{device}; torch {torch.__version__}, transformers {transformers.__version__}, "
            f"Python {platform.python_version()}")
