"""The speculation policy's host work per drafting step, at several batch sizes.

On a GPU a step of a small model takes about 4 ms, most of it host work, so the controller's own
share matters. This times the calls the engine makes on a step that drafts
(``SpeculationPolicy.begin_step``, ``num_spec_tokens`` per sequence, ``kept_drafts``,
``update``, ``record_step``) with real ``Sequence`` objects and synthetic proposals (random
backed drafts and acceptances), after the controller has measured its step costs. No model runs.

    python benchmarks/policy_cost.py --batch-sizes 1,8,32 [--defer]
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.config import SpeculativeConfig  # noqa: E402
from engine.sequence import Sequence  # noqa: E402
from samplers import SamplingParams  # noqa: E402
from scheduler import ScheduledSequence, SpeculationPolicy  # noqa: E402


def policy_step_seconds(batch_size: int, k: int, number: int, seed: int = 0,
                        defer: bool = False) -> tuple[float, int, float]:
    """Mean seconds of one drafting step's policy calls, the steps (of 200 before timing)
    whose chosen width was above 0, and (``defer``: learning deferred as on a GPU) the mean
    seconds of ``flush``, which a GPU engine runs while the forward does (left out of the
    first number)."""
    rng = np.random.default_rng(seed)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k)
    policy = SpeculationPolicy(spec, k, 4096, drafts_are_free=True,
                               measured_draft_cost=lambda: 0.0)
    params = SamplingParams(temperature=0, max_tokens=1024, ignore_eos=True)
    seqs = [Sequence(str(i), 0, None, list(range(100)), params, None, frozenset(), 0.0)
            for i in range(batch_size)]
    policy.defer_updates = defer
    for seq in seqs:
        seq.speculation = policy.new_tracker(seq)
    for width in (1, k + 1):  # measured costs: drafting pays
        for _ in range(12):
            policy.controller.record(batch_size, width, 0.004 if width == 1 else 0.0045, k,
                                     0.0002)
    backed = [[int(x) for x in rng.integers(1, k + 1, batch_size)] for _ in range(64)]
    accepted = [[int(x) for x in rng.integers(0, 3, batch_size)] for _ in range(64)]
    drafts = [list(range(k))] * batch_size
    state = {"i": 0, "drafted": 0, "flush": 0.0, "steps": 0}

    def step() -> None:
        i = state["i"] = (state["i"] + 1) % 64
        policy.begin_step(seqs)
        items = [ScheduledSequence(s, 1, True, policy.num_spec_tokens(s)) for s in seqs]
        kept = policy.kept_drafts(items, drafts, backed[i], None)
        start = time.perf_counter()
        policy.flush()  # (where the engine calls it: after the forward's launch)
        state["flush"] += time.perf_counter() - start
        policy.update(seqs, kept, accepted[i],
                      [min(b, g) for b, g in zip(backed[i], kept, strict=True)])
        # (a batch's context grows, and its steps with it: the costs' drift is estimated)
        kv = 100 + (3 * state["steps"]) % 300
        state["steps"] += 1
        policy.record_step(items, [d[:g] for d, g in zip(drafts, kept, strict=True)],
                           0.0045 * (1 + kv / 3000), 0.0002, kv=kv)
        state["drafted"] += kept[0] > 0

    for _ in range(200):
        step()
    drafted, state["flush"] = state["drafted"], 0.0
    total = timeit.timeit(step, number=number)
    return (total - state["flush"]) / number, drafted, state["flush"] / number


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--number", type=int, default=2000, help="timed steps per batch size")
    p.add_argument("--defer", action="store_true",
                   help="learn during the next forward, as a GPU engine does (flush timed apart)")
    args = p.parse_args(argv)
    for b in map(int, args.batch_sizes.split(",")):
        seconds, drafted, flush = policy_step_seconds(b, args.k, args.number, defer=args.defer)
        print(f"batch {b:3d}: {seconds * 1e6:6.0f} us per drafting step "
              f"(drafted in {drafted} of 200 warm-up steps)"
              + (f", and {flush * 1e6:.0f} us of flush in the forward's shadow"
                 if args.defer else ""))


if __name__ == "__main__":
    main()
