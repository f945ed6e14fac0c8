"""The speculation controller's host work per drafting step, at several batch sizes.

On a GPU a step of a small model is mostly host work, so the controller's own share matters.
This times the controller's calls on a step that drafts (``plan``, ``drafts_for`` per sequence,
``trim``, ``learn``: ``scheduler.speculation``) with real ``Sequence`` objects and synthetic
proposals (random backed drafts and acceptances), after the controller has measured its step
costs. No model runs. One row per batch size. ``--method``: a free proposer's controller
(``ngram``: it chooses the width after the proposal) or a costly one's (``eagle``: before it);
``--defer``: as an overlapped engine calls it (the last step's outcome learnt after the next
plan, and ``LEARN_EVERY`` outcomes learnt together: ``scheduler.spec_policy``).

    python -m benchmarks controller cost --batch-sizes 1,8,32 [--method eagle] [--defer]
"""

from __future__ import annotations

import argparse
import time
import timeit

import numpy as np

from benchmarks.record import Result
from engine.config import SpeculativeConfig
from engine.sequence import Sequence
from samplers import SamplingParams
from scheduler import ScheduledSequence, StepOutcome, StepTiming, make_controller


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--number", type=int, default=2000, help="timed steps per batch size")
    p.add_argument("--method", choices=("ngram", "eagle"), default="ngram",
                   help="the proposer's kind: free (ngram) or costly (eagle)")
    p.add_argument("--defer", action="store_true",
                   help="learn as an overlapped engine does (late, a few outcomes together)")


def policy_step_seconds(batch_size: int, k: int, number: int, seed: int = 0,
                        defer: bool = False, method: str = "ngram") -> tuple[float, int, float]:
    """Mean seconds of one drafting step's controller calls (``plan``, ``drafts_for`` per
    sequence, ``trim``, ``learn``), the steps (of 200 before timing) whose chosen width was
    above 0, and the mean seconds of ``learn`` alone; ``defer``: learnt as an overlapped
    engine learns (see the module docstring); ``method``: ``ngram`` (a free proposer) or
    ``eagle`` (a costly one, its drafts 5% of a plain step each)."""
    rng = np.random.default_rng(seed)
    spec = SpeculativeConfig(method=method, num_speculative_tokens=k)
    free = method == "ngram"
    controller = make_controller(spec, k, 4096, drafts_are_free=free,
                                 measured_draft_cost=lambda: 0.0 if free else 0.05)
    params = SamplingParams(temperature=0, max_tokens=1024, ignore_eos=True)
    seqs = [Sequence(str(i), 0, None, list(range(100)), params, None, frozenset(), 0.0)
            for i in range(batch_size)]
    for seq in seqs:
        seq.speculation = controller.new_tracker(seq)
        seq.num_computed_tokens = seq.num_tokens - 1  # (decoding: its prompt is cached)
    for width in (1, k + 1):  # measured costs: drafting pays
        for _ in range(12):
            controller.controller.record(batch_size, width, 0.004 if width == 1 else 0.0045, k,
                                         0.0002)
    backed = [[int(x) for x in rng.integers(1, k + 1, batch_size)] for _ in range(64)]
    accepted = [[int(x) for x in rng.integers(0, 3, batch_size)] for _ in range(64)]
    state = {"i": 0, "drafted": 0, "learn": 0.0, "steps": 0, "outcome": None}

    def learn() -> None:
        start = time.perf_counter()
        if state["outcome"] is not None:
            controller.learn(state["outcome"], defer)
            state["outcome"] = None
        state["learn"] += time.perf_counter() - start

    def step() -> None:
        i = state["i"] = (state["i"] + 1) % 64
        if defer:
            learn()  # (where an overlapped engine learns the last step: before the next plan)
        plan = controller.plan(seqs, False)
        items = [ScheduledSequence(s, 1, True, plan.drafts_for(s)) for s in seqs]
        kept = controller.trim(items, [k] * batch_size, backed[i], (0, 0, 0))
        # (a batch's context grows, and its steps with it: the costs' drift is estimated)
        kv = 100 + (3 * state["steps"]) % 300
        state["steps"] += 1
        timing = StepTiming(batch_size, 1 + max(kept), 0.0045 * (1 + kv / 3000),
                            max(item.num_spec_tokens for item in items), 0.0002, None, None, kv)
        state["outcome"] = StepOutcome(seqs, kept, accepted[i],
                                       [min(b, g) for b, g in zip(backed[i], kept, strict=True)],
                                       None, timing, step=plan.step)
        if not defer:
            learn()
        state["drafted"] += kept[0] > 0

    for _ in range(200):
        step()
    drafted, state["learn"] = state["drafted"], 0.0
    total = timeit.timeit(step, number=number)
    learnt = state["learn"] / number
    return total / number, drafted, learnt


def run(args: argparse.Namespace) -> Result:
    rows = []
    for b in map(int, args.batch_sizes.split(",")):
        seconds, drafted, learn = policy_step_seconds(b, args.k, args.number, defer=args.defer,
                                                      method=args.method)
        rows.append({"batch": b, "us_per_step": seconds * 1e6, "drafted_of_200": drafted,
                     "learn_us": learn * 1e6, "deferred": args.defer, "method": args.method})
        print(f"batch {b:3d}: {seconds * 1e6:6.0f} us per drafting step, learn "
              f"{learn * 1e6:.0f} us of it (drafted in {drafted} of 200 warm-up steps)")
    return Result(rows)
