"""The efficiency suite's drift: an engine whose controller learned alpha 0 meets alpha 0.9.

Alpha 0 for 8 requests (after two warm batches), then 0.9 on the same engine, one batch after
another, against a fresh engine at 0.9. Per batch after the drift: its speedup, its share of the
fresh engine's, and the engine steps run since the drift when it began; ``recovered_after``:
those steps for the first batch at >= 0.9 of the fresh engine (None: none of them).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.engines import release
from benchmarks.oracle import ORACLE
from benchmarks.suites.efficiency_runs import engine, timed
from engine import SamplingParams

DRIFT_BATCHES = 4  # batches served at alpha 0.9 after the drift
DRIFT_BOUND = 64  # steps within which the engine should have recovered (printed beside)


def run_drift(model: Any, tokenizer: Any, args: argparse.Namespace, prompts: list[list[int]],
              params: SamplingParams, base_tps: float, batch: int) -> dict:
    ORACLE.alpha = 0.9
    fresh = engine(model, tokenizer, args, max(args.ks), True)
    fresh_tps = timed(fresh, prompts, params, args.repeats)[0]
    release(fresh)
    ORACLE.alpha = 0.0
    llm = engine(model, tokenizer, args, max(args.ks), True)
    for _ in range(2):
        llm.generate(prompts, params, use_tqdm=False)  # (warm: the drift, not the graphs)
    llm.generate((prompts * 8)[:8], params, use_tqdm=False)
    ORACLE.last.alpha = 0.9  # the text became predictable
    metrics = llm.engine.metrics
    drift_step = metrics.num_steps
    after = []
    for _ in range(DRIFT_BATCHES):
        began = metrics.num_steps - drift_step
        start = time.perf_counter()
        out = llm.generate(prompts, params, use_tqdm=False)
        tps = sum(len(o.outputs[0].token_ids) for o in out) / (time.perf_counter() - start)
        after.append(dict(steps_before=began, speedup=tps / base_tps, ratio=tps / fresh_tps))
    release(llm)
    recovered = next((a["steps_before"] for a in after if a["ratio"] >= 0.9), None)
    result = dict(batch=batch, fresh_speedup=fresh_tps / base_tps,
                  after_drift_speedup=after[0]["speedup"], ratio=after[0]["ratio"],
                  batches=after, recovered_after=recovered)
    print(f"batch {batch:3d} drift: fresh {result['fresh_speedup']:.2f}x; after 8 requests at "
          "alpha 0, batch by batch: " + ", ".join(
              f"{a['speedup']:.2f}x ({a['ratio']:.2f} of fresh, from step {a['steps_before']})"
              for a in after)
          + f"; at >= 0.9 of fresh from step {recovered} (bound {DRIFT_BOUND})", flush=True)
    return result
