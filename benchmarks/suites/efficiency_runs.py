"""The efficiency suite's timed engine runs: steady tokens/s (no CUDA graph captured inside the
kept timings), and what the engine's last run did step by step."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from benchmarks.engines import controller_state
from benchmarks.oracle import METHOD
from engine import LLM, SamplingParams

WARMUPS = (2, 8)  # warm-up runs: at least, and at most while CUDA graphs are still captured
TIMINGS = 3  # timed rounds at most: one with a capture inside is timed again


def engine(model: Any, tokenizer: Any, args: argparse.Namespace, k: int | None,
           adaptive: bool = False) -> LLM:
    """The engine without speculation (k None), or with the oracle at k (``adaptive``: the
    controller chooses up to k)."""
    spec = None if k is None else {"method": METHOD, "num_speculative_tokens": k,
                                   "adaptive_k": adaptive}
    return LLM(model, tokenizer=tokenizer, device=args.device, max_num_seqs=max(args.batches),
               speculative_config=spec, fused_ops=not args.no_fused_ops)


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams,
          repeats: int) -> tuple[float, list[list[int]], tuple[int, float], dict]:
    """Tokens/s of the warm engine (the median of ``repeats`` runs, each timed on its own), the
    last run's tokens, the graphs captured inside the kept timed round (count, seconds), and the
    last run's steps (:func:`run_steps`).

    Warm-up until a whole run captures no CUDA graph (a bucket is captured the second time it
    is met, or once padding in a larger one has cost a capture: that can come runs later). A
    timed round with a capture inside is timed again (at most ``TIMINGS`` rounds): the numbers
    are the steady engine's, and a capture left in the last round is reported."""
    graphs = llm.engine.runner.graphs
    for i in range(WARMUPS[1]):
        before = 0 if graphs is None else graphs.num_graphs
        llm.generate(prompts, params, use_tqdm=False)
        if i + 1 >= WARMUPS[0] and (graphs is None or graphs.num_graphs == before):
            break
    for _ in range(TIMINGS):
        before = (0, 0.0) if graphs is None else (graphs.num_graphs, graphs.capture_seconds)
        tps, outs = median_rate(llm, prompts, params, repeats)
        captures = (0, 0.0) if graphs is None else (graphs.num_graphs - before[0],
                                                     graphs.capture_seconds - before[1])
        if not captures[0]:
            break
    return (tps, [o.outputs[0].token_ids for o in outs], captures,
            run_steps(llm, len(prompts)))


def median_rate(llm: LLM, prompts: list[list[int]], params: SamplingParams,
                repeats: int) -> tuple[float, list]:
    """The median tokens/s of ``repeats`` runs, each timed on its own (its metrics reset
    first), and the last run's outputs."""
    rates = []  # [repeats]
    for _ in range(repeats):
        llm.reset_metrics()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs)
                     / (time.perf_counter() - start))
    return float(np.median(rates)), outs


def run_steps(llm: LLM, batch: int) -> dict:
    """The last ``generate``'s engine steps, its sequences' steps that verified drafts, and the
    mean drafts of those (what the controller chose); with the controller on, also what it
    decided from at the end (``engines.controller_state``)."""
    m = llm.engine.metrics
    out = dict(steps=m.num_steps, drafting_request_steps=m.num_spec_request_steps,
               mean_drafts=m.num_drafted / m.num_spec_request_steps
               if m.num_spec_request_steps else 0.0)
    state = controller_state(llm, batch)
    if state is not None:
        out["controller_costs"], out["engine_acceptance"] = state["costs"], state["acceptance"]
        out["controller_samples_ms"] = state["samples_ms"]
    return out
