"""The goodput controller against fixed k, simulated: no model, the engine's own policy calls.

The efficiency suite measures the controller on a GPU, where one cell moves by 0.1-0.3 between
runs; this replays the same decisions offline, many times, so that a change to the controller
can be judged before a GPU run. It drives the engine's controller
(``scheduler.make_controller``) with real ``Sequence`` objects through the calls the engine
makes each step (``plan``, ``trim``, ``learn``: ``scheduler.speculation``). Drafts are an
oracle's: each one right with probability ``alpha``, independently, so a step accepts the
leading right ones. A step of ``b`` sequences that scores ``w`` tokens each takes ``cost(b, w)``
plain steps, with lognormal noise; the cost model is ``1 + verify_cost * (w - 1) +
spec_overhead`` (``w > 1``), whose defaults are near the measured ratios of the random 1B LLaMA
(alpha = 0 rows of docs/performance.md, "Efficiency against an oracle"). ``--bursts P``: with
probability ``P`` a step starts a slow stretch (something outside the engine slowing every width
alike): ``--burst-height`` plain steps more, shrinking by ``--burst-decay`` a step.
``--kv-growth G``: every step's time grows with the batch's context, by ``G`` times its cost over
``--max-tokens`` tokens; ``--hide-kv``: the controller is not told the steps' contexts. Each
batch is closed (``LLM.generate``: ``max_tokens`` each, the call ends with its slowest
sequence), one engine per (batch, alpha, policy) serves ``--warmup`` batches, then ``--runs``
timed ones.

    python -m benchmarks controller sim --batch-sizes 1,8,32 --alphas 0,0.3,0.5,0.7,0.9

One row per (batch, alpha): the simulated speedup over plain decoding of each fixed k and of
the controller, and the controller over the best fixed k. ``--drift``: 8 batches at alpha 0,
then batches at 0.9 on the same engine, against a fresh engine at 0.9.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks.record import Result
from engine.config import SpeculativeConfig
from engine.sequence import Sequence
from samplers import SamplingParams
from scheduler import ScheduledSequence, StepOutcome, StepTiming, make_controller

PLAIN_STEP_S = 0.004  # seconds of a plain step (only ratios are reported)
PROMPT_LEN = 16


class SimEngine:
    """One engine's policy and clock over simulated steps (see the module docstring)."""

    def __init__(self, k: int, adaptive: bool, verify_cost: float, spec_overhead: float,
                 noise: float, seed: int, defer: bool = True,
                 bursts: tuple[float, float, float] = (0.0, 0.0, 0.0), kv_growth: float = 0.0,
                 tell_kv: bool = True) -> None:
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k, adaptive_k=adaptive)
        self.controller = make_controller(spec, k, 1 << 20, drafts_are_free=True,
                                          measured_draft_cost=lambda: 0.0)
        self.defer = defer  # (as an overlapped engine: a step's outcome is learnt after the next
        # plan, a few together: scheduler.spec_policy.GoodputPolicy.learn)
        self.outcome: StepOutcome | None = None  # the last step's, not learnt yet
        self.verify_cost, self.spec_overhead, self.noise = verify_cost, spec_overhead, noise
        self.rng = np.random.default_rng(seed)
        self.steps = 0
        self.bursts = bursts  # (chance a step starts one, height in plain steps, decay)
        self.excess = 0.0  # the slow stretch's extra plain steps at this step
        self.score_clean = False  # time the batches without the noise (--score-clean)
        self.kv_growth, self.tell_kv = kv_growth, tell_kv
        self.context = 0.0  # the batch's generated tokens over max_tokens (kv_growth's clock)

    def clean_cost(self, width: int) -> float:
        """Seconds of a step scoring ``width`` tokens per sequence, without noise."""
        return PLAIN_STEP_S * (1.0 if width == 1 else
                               1.0 + self.verify_cost * (width - 1) + self.spec_overhead
                               ) * (1.0 + self.kv_growth * self.context)

    def cost(self, width: int) -> float:
        """Seconds of a step scoring ``width`` tokens per sequence, with noise."""
        chance, height, decay = self.bursts
        self.excess *= decay
        if chance and self.rng.random() < chance:
            self.excess = height
        return (self.clean_cost(width) * float(self.rng.lognormal(0.0, self.noise))
                + PLAIN_STEP_S * self.excess)

    def batch(self, size: int, alpha: float, max_tokens: int) -> tuple[float, int]:
        """One closed batch: its seconds and decode steps."""
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        running = []
        for i in range(size):
            seq = Sequence(str(i), 0, None, list(range(PROMPT_LEN)), params, None, frozenset(),
                           0.0)
            seq.append_token(0, with_text=False)  # the prefill's token
            seq.num_computed_tokens = seq.num_tokens - 1
            seq.speculation = self.controller.new_tracker(seq, together=True)
            running.append(seq)
        seconds, steps = PLAIN_STEP_S * 2.0, 0  # (the prefill: the same for every policy)
        while running:
            step_s, clean_s = self.step(running, alpha, max_tokens)
            seconds += clean_s if self.score_clean else step_s
            steps += 1
            self.steps += 1
            running = [s for s in running if s.num_output_tokens < max_tokens]
        return seconds, steps

    def step(self, running: list[Sequence], alpha: float, max_tokens: int) -> tuple[float, float]:
        """One decode step through the controller's three calls, as ``LLMEngine._run_step``
        makes them (plan, trim, learn: the last step's outcome while the forward runs when
        deferred, else this step's at its end); its seconds, with and without noise."""
        plan = self.controller.plan(running, False)
        items = [ScheduledSequence(s, 1, True, plan.drafts_for(s)) for s in running]
        # (the engine asks the controller only about the sequences that asked for drafts)
        wanted = [i for i, item in enumerate(items) if item.num_spec_tokens]
        kept = [0] * len(items)
        if wanted:
            others = len(items) - len(wanted)  # (decoding: one new token each)
            got = self.controller.trim([items[i] for i in wanted],
                                       [items[i].num_spec_tokens for i in wanted], None,
                                       (others, min(others, 1), others))
            for i, g in zip(wanted, got, strict=True):
                kept[i] = g
        if self.defer:
            self.learn()
        most = max(s.num_output_tokens for s in running)  # (before this step's tokens)
        accepted = []
        for seq, d in zip(running, kept, strict=True):
            right = self.rng.random(d) < alpha
            a = int(np.argmin(right)) if not right.all() else d
            accepted.append(a)
            for _ in range(min(a + 1, max_tokens - seq.num_output_tokens)):
                seq.append_token(1, with_text=False)
            seq.num_computed_tokens = seq.num_tokens - 1
        width = 1 + max(kept)
        self.context = most / max_tokens
        step_s = self.cost(width)  # (what the controller measures)
        asked = max(item.num_spec_tokens for item in items) if wanted else 0
        timing = StepTiming(len(items), width, step_s, asked, 0.0 if wanted else None, None,
                            None, PROMPT_LEN + most + width if self.tell_kv else 0)
        drafted = running if wanted else []
        self.outcome = StepOutcome(drafted, kept if wanted else [], accepted if wanted else [],
                                   [None] * len(drafted), None, timing,
                                   [s for s in running if s.num_output_tokens >= max_tokens])
        if not self.defer:
            self.learn()
        return step_s, self.clean_cost(width)

    def learn(self) -> None:
        """The controller learns the outcome it has not seen yet."""
        if self.outcome is not None:
            outcome, self.outcome = self.outcome, None
            self.controller.learn(outcome, self.defer)


def timed(engine: SimEngine, size: int, alpha: float, args: argparse.Namespace) -> float:
    for _ in range(args.warmup):
        engine.batch(size, alpha, args.max_tokens)
    return sum(engine.batch(size, alpha, args.max_tokens)[0] for _ in range(args.runs))


def sim_engine(args: argparse.Namespace, k: int, adaptive: bool, seed: int) -> SimEngine:
    """An engine with the command line's cost model (k = 0: plain decoding)."""
    engine = SimEngine(k, adaptive, args.verify_cost, args.spec_overhead, args.noise, seed,
                       args.defer, (args.bursts, args.burst_height, args.burst_decay),
                       args.kv_growth, not args.hide_kv)
    engine.score_clean = args.score_clean
    return engine


def cell(size: int, alpha: float, args: argparse.Namespace, seed: int) -> dict:
    """Speedups of each fixed k and of the controller over plain decoding, one seed."""
    def engine(k: int, adaptive: bool) -> SimEngine:
        return sim_engine(args, k, adaptive, seed)

    plain = timed(engine(0, False), size, alpha, args)
    out = {f"k={k}": plain / timed(engine(k, False), size, alpha, args) for k in args.ks}
    out["controller"] = plain / timed(engine(args.max_k, True), size, alpha, args)
    return out


def drift(size: int, args: argparse.Namespace, seed: int) -> dict:
    """Batches at alpha 0.9 after 8 at alpha 0, against a fresh engine: speedup per batch."""
    def engine(k: int, adaptive: bool) -> SimEngine:
        return sim_engine(args, k, adaptive, seed)

    plain = engine(0, False).batch(size, 0.9, args.max_tokens)[0]
    fresh_s = timed(engine(args.max_k, True), size, 0.9, args) / args.runs
    used = engine(args.max_k, True)
    for _ in range(8):
        used.batch(size, 0.0, args.max_tokens)
    after = [plain / used.batch(size, 0.9, args.max_tokens)[0] for _ in range(4)]
    return {"fresh": plain / fresh_s, "after_drift": after}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--alphas", default="0,0.3,0.5,0.7,0.9,0.95")
    p.add_argument("--ks", default="1,2,3,4")
    p.add_argument("--max-k", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--verify-cost", type=float, default=0.05,
                   help="a step's cost per scored token past the first, in plain steps")
    p.add_argument("--spec-overhead", type=float, default=0.02,
                   help="a drafting step's fixed extra cost, in plain steps")
    p.add_argument("--noise", type=float, default=0.03, help="lognormal sigma of step times")
    p.add_argument("--bursts", type=float, default=0.0,
                   help="chance that a step starts a slow stretch (see the module docstring)")
    p.add_argument("--burst-height", type=float, default=4.0,
                   help="a slow stretch's first step: this many plain steps more")
    p.add_argument("--burst-decay", type=float, default=0.6,
                   help="a slow stretch's extra time shrinks by this factor a step")
    p.add_argument("--kv-growth", type=float, default=0.0,
                   help="a step's time grows by this fraction over max-tokens of context")
    p.add_argument("--hide-kv", action="store_true",
                   help="the controller is not told the steps' contexts")
    p.add_argument("--score-clean", action="store_true",
                   help="time the batches by the cost model without noise (the controller still "
                        "measures the noisy steps): the decisions' worth, not the noise's luck")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seeds", type=int, default=5, help="simulations per cell (mean reported)")
    p.add_argument("--drift", action="store_true")
    p.add_argument("--no-defer", dest="defer", action="store_false",
                   help="learn each step at once (a CPU engine), not late and a few together")


def run(args: argparse.Namespace) -> Result:
    args.ks = [int(k) for k in args.ks.split(",")]
    rows = []
    print("| batch | alpha | " + " | ".join(f"k={k}" for k in args.ks)
          + " | controller | controller / best k | worst seed |")
    print("| ---: | ---: |" + " ---: |" * (len(args.ks) + 3))
    for size in map(int, args.batch_sizes.split(",")):
        for alpha in map(float, args.alphas.split(",")):
            runs = [cell(size, alpha, args, seed) for seed in range(args.seeds)]
            mean = {key: float(np.mean([r[key] for r in runs])) for key in runs[0]}
            ratios = [r["controller"] / max(1.0 if alpha == 0 else 0.0,
                                            *(r[f"k={k}"] for k in args.ks)) for r in runs]
            rows.append({"batch": size, "alpha": alpha, **mean,
                         "ratio": float(np.mean(ratios)), "worst": min(ratios)})
            print(f"| {size} | {alpha} | " + " | ".join(f"{mean[f'k={k}']:.2f}" for k in args.ks)
                  + f" | {mean['controller']:.2f} | {np.mean(ratios):.2f} | {min(ratios):.2f} |")
            sys.stdout.flush()
    summary = {}
    if args.drift:
        summary["drift"] = {}
        for size in map(int, args.batch_sizes.split(",")):
            d = drift(size, args, 0)
            summary["drift"][size] = d
            print(f"drift, batch {size}: fresh {d['fresh']:.2f}, after 8 batches at alpha 0: "
                  + ", ".join(f"{x:.2f}" for x in d["after_drift"]))
    return Result(rows, None, summary)
