"""Where a run's time goes, step by step: each stage of ``LLMEngine.step``, the time between
steps, and which steps the speculation controller measured.

The controller decides from the steps it times (``SpeculationPolicy.record_step``); time it does
not see (steps it leaves out, work outside ``step()``) is a loss it cannot weigh. This prints,
for one warm ``LLM.generate`` per method over the benchmark's prompts: wall time, steps,
milliseconds per step, the sum of the stages, the time outside ``step()``, and the steps the
controller recorded (their count, mean time, and by width). On CUDA a stage's time is host time
until the first synchronisation, which is verification (``.tolist()``).

    python benchmarks/step_times.py --device cuda --kind open --batch-size 32 --methods none,ngram

``oracle`` / ``oracle-fixed``: the oracle proposer of ``benchmarks/efficiency.py`` (the target's
own greedy continuation, each draft right with probability ``--alpha``; a random target made
decisive), to see the controller's choices where the acceptance is known:

    python benchmarks/step_times.py --device cuda --model random-llama-1b --methods \
        none,oracle,oracle-fixed --alpha 0.5
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.e2e_runs import engine_generate  # noqa: E402
from benchmarks.e2e_workloads import (  # noqa: E402
    PROMPT_KINDS,
    RANDOM_LLAMAS,
    build_model,
    build_prompts,
)
from benchmarks.efficiency import STATE, decisive  # noqa: E402  (registers "oracle_bench")
from engine import LLM  # noqa: E402
from scheduler.goodput import expected_by_width  # noqa: E402

STAGES = ("_schedule", "_propose", "_forward", "_observe", "_adjust", "_verify",
          "_append_and_stop", "_rollback", "_hand_features", "_record")


class StepClock:
    """Times ``engine.step`` and its stages by wrapping them on the instance."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.stage_s: dict[str, float] = defaultdict(float)
        self.steps: list[dict] = []  # per step: start, seconds, recorded width or None
        self._recorded: tuple[int, float] | None = None
        for name in STAGES:
            setattr(engine, name, self._timed(name, getattr(engine, name)))
        self._stage_record = engine._record
        engine._record = self._on_stage_record
        self._info: dict = {}
        self._cur: dict[str, float] = {}  # this step's stage times
        self._step = engine.step
        engine.step = self._timed_step
        policy = engine.spec_policy
        # (the controller's learning, while the forward runs: LLMEngine._run_step)
        policy.flush = self._timed("flush", policy.flush)
        self._record_step = policy.record_step
        policy.record_step = self._on_record
        # the controller's width choices: predicted token gain and cost against what came
        self.decisions: list[dict] = []
        ctl = policy.controller
        self._choose_width, ctl.choose_width = ctl.choose_width, self._on_choose_width
        self._update, policy.update = policy.update, self._on_update

    def _timed(self, name, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                self.stage_s[name] += took
                self._cur[name.strip("_")] = took
        return run

    def _on_choose_width(self, accs, avail, backed, min_width, critical=None, batch_size=None,
                         layout=None):
        ctl = self.engine.spec_policy.controller
        probing = ctl.probing
        width = self._choose_width(accs, avail, backed, min_width, critical, batch_size, layout)
        if accs:
            tokens = expected_by_width(ctl.acceptance.rates(accs, backed), avail)
            cost = ctl.step_cost(len(accs) if batch_size is None else batch_size)[1:]
            self.decisions.append({"probe": probing, "width": width, "n": len(accs),
                                   "critical": len(accs) if critical is None else sum(critical),
                                   "predicted": float(tokens[width] / tokens[0]),
                                   "cost": float(cost[width])})
        return width

    def _on_update(self, seqs, num_drafted, num_accepted, num_backed, private=None):
        last = self.decisions[-1] if self.decisions else None
        if last is not None and "real" not in last and any(num_drafted):
            kept = sum(min(a, d) for a, d in zip(num_accepted, num_drafted, strict=True))
            last["real"] = (len(seqs) + kept) / max(len(seqs), 1)
        return self._update(seqs, num_drafted, num_accepted, num_backed, private)

    def _on_record(self, items, drafts, step_s, propose_s, after_idle_s=None, packed_rows=None,
                   kv=0):
        self._recorded = (1 + max(map(len, drafts)), step_s)
        self._info["packed_rows"] = packed_rows
        return self._record_step(items, drafts, step_s, propose_s, after_idle_s, packed_rows,
                                 kv)

    def _on_stage_record(self, batch, start):
        """What decides whether the controller records the step (``LLMEngine._record``)."""
        graphs = self.engine.runner.graphs
        self._info = {
            "items": len(batch.items), "width": 1 + max(map(len, batch.drafts), default=0),
            "verified": bool(batch.verified_at), "steady": self.engine.runner.last_step_steady,
            "decode_only": all(i.samples and i.num_context_tokens == 1 for i in batch.items),
            "propose_ms": 1e3 * batch.propose_s, "first_proposal": batch.first_proposal,
            "typical_proposal": getattr(batch, "typical_proposal", None),
            "graphs": 0 if graphs is None else graphs.num_graphs,
            "head_graphs": head_graphs(self.engine.proposer)}
        return self._stage_record(batch, start)

    def _timed_step(self):
        self._recorded, self._info, self._cur = None, {}, {}
        start = time.perf_counter()
        out = self._step()
        self.steps.append({"start": start, "s": time.perf_counter() - start,
                           "recorded": self._recorded, "stages": self._cur, **self._info})
        return out

    def reset(self) -> None:
        self.stage_s.clear()
        self.steps.clear()
        self.decisions.clear()


def head_graphs(proposer) -> int | None:
    """The CUDA graphs a draft head's proposals captured so far (None: no head, or eager): a
    slow step where it grows captured one."""
    graphs = getattr(proposer, "graphs", None) or getattr(getattr(proposer, "head", None),
                                                          "graphs", None)
    return None if graphs is None else graphs.num_graphs


def decision_summary(decisions: list[dict]) -> dict:
    """Per kind of width choice (a probe, a step that chose drafts, one that chose none): how
    many, and the mean predicted token gain, realised gain and relative cost."""
    out = {}
    for name, picked in (("probe", [d for d in decisions if d["probe"]]),
                         ("drafted", [d for d in decisions if not d["probe"] and d["width"]]),
                         ("declined", [d for d in decisions
                                       if not d["probe"] and not d["width"]])):
        real = [d["real"] for d in picked if "real" in d]
        out[name] = {"n": len(picked),
                     "predicted": round(float(sum(d["predicted"] for d in picked))
                                        / max(len(picked), 1), 3),
                     "real": round(sum(real) / max(len(real), 1), 3),
                     "cost": round(sum(d["cost"] for d in picked) / max(len(picked), 1), 3)}
    return out


class GcPauses:
    """The garbage collector's pauses during a timed run (``gc.callbacks``): host time that
    no stage owns."""

    def __init__(self) -> None:
        self._start = 0.0
        self.counts = [0, 0, 0]  # collections by generation
        self.seconds = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.counts[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._start

    def reset(self) -> None:
        self.counts, self.seconds = [0, 0, 0], 0.0

    def close(self) -> None:
        """Stop listening (the callback is process-wide)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def summary(self) -> dict:
        return {"gc_collections": list(self.counts), "gc_ms": round(1e3 * self.seconds, 3)}


def percentiles(seconds: list[float]) -> dict[str, float]:
    """Median, 90th percentile and maximum of ``seconds``, in milliseconds."""
    if not seconds:
        return {}
    ordered = sorted(seconds)
    return {q: round(1e3 * ordered[min(int(f * len(ordered)), len(ordered) - 1)], 3)
            for q, f in (("p50", 0.5), ("p90", 0.9), ("max", 1.0))}


def summary(clock: StepClock, wall: float) -> dict:
    steps = clock.steps
    inside = sum(s["s"] for s in steps)
    recorded = [s for s in steps if s["recorded"] is not None]
    packed = [s["s"] for s in recorded if s.get("packed_rows")]
    by_width: dict[int, list[float]] = defaultdict(list)
    stages_by_width: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in recorded:
        by_width[s["recorded"][0]].append(s["recorded"][1])
        for name, took in s["stages"].items():
            stages_by_width[s["recorded"][0]][name] += took
    left_out = [s["s"] for s in steps if s["recorded"] is None]
    return {
        "wall_s": wall, "steps": len(steps), "ms_per_step": 1e3 * wall / max(len(steps), 1),
        "inside_step_s": inside, "outside_step_s": wall - inside,
        "stages_ms_per_step": {k.strip("_"): 1e3 * v / max(len(steps), 1)
                               for k, v in clock.stage_s.items()},
        "recorded_steps": len(recorded),
        "recorded_ms_mean": 1e3 * sum(s["s"] for s in recorded) / max(len(recorded), 1),
        "left_out_steps": len(left_out), "left_out_s": sum(left_out),
        "left_out_ms_max": 1e3 * max(left_out, default=0.0),
        "recorded_by_width": {w: {"n": len(v), "ms_median": 1e3 * sorted(v)[len(v) // 2],
                                  "stages_ms_mean": {k: round(1e3 * t / len(v), 3) for k, t
                                                     in stages_by_width[w].items()}}
                              for w, v in sorted(by_width.items())},
        "recorded_ms_percentiles": percentiles([s["s"] for s in recorded]),
        # steps the runner packed (one token a row: ModelRunner.packed_rows), their median
        "packed": {"n": len(packed), "ms_median": 1e3 * sorted(packed)[len(packed) // 2]
                   if packed else 0.0},
        # steps that only decode (or verify) against steps with a prompt's chunk in them
        "by_step_kind": {name: {"n": len(v), "s": sum(v),
                                "ms_median": 1e3 * sorted(v)[len(v) // 2] if v else 0.0}
                         for name, v in (("decode_only", [s["s"] for s in steps
                                                          if s.get("decode_only")]),
                                         ("with_prefill", [s["s"] for s in steps
                                                           if not s.get("decode_only")]))},
        "stage_ms_percentiles": {name.strip("_"): percentiles(
            [s["stages"].get(name.strip("_"), 0.0) for s in recorded])
            for name in (*STAGES, "flush")},
        # (where a mean and a median part: the slowest steps, whole)
        "slowest": [{**{k: v for k, v in s.items() if k not in ("start", "recorded", "stages")},
                     "index": i, "ms": round(1e3 * s["s"], 3),
                     "stages_ms": {k: round(1e3 * v, 3) for k, v in s["stages"].items()}}
                    for i, s in sorted(enumerate(recorded), key=lambda p: -p[1]["s"])[:6]],
        "decisions": decision_summary(clock.decisions),
        # every step in order: [width recorded (0: not recorded), ms, graphs captured so far]
        "trace": [[s["recorded"][0] if s["recorded"] else 0, round(1e3 * s["s"], 3),
                   s.get("graphs", 0)] for s in steps],
        "left_out": [{**{k: v for k, v in s.items() if k not in ("start", "recorded",
                                                                 "stages")},
                      "index": i, "ms": 1e3 * s["s"]}
                     for i, s in enumerate(steps) if s["recorded"] is None],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--methods", default="none,ngram",
                   help="comma-separated: none, ngram, ngram-fixed (no controller), "
                        "early_exit, eagle, eagle-eager (its draft chain without CUDA graphs), "
                        "eagle_tree, ngram_eagle_tree (with --draft-tree), oracle, oracle-fixed")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampled runs (no seed) at this temperature; 0: greedy")
    p.add_argument("--draft-tree", default="3,2",
                   help="candidates per node at each depth for eagle_tree / ngram_eagle_tree")
    p.add_argument("--alpha", type=float, default=0.9,
                   help="the oracle's chance that a draft is right")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--kind", default="open", choices=PROMPT_KINDS)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--waves", type=int, default=1,
                   help="waves * batch-size prompts, at most batch-size running at once (a "
                        "finished request's place is refilled: steps that admit a prompt)")
    p.add_argument("--warmups", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method, alternating")
    p.add_argument("--json", default=None, help="write the summaries here")
    p.add_argument("--gc-freeze", action="store_true",
                   help="move every object alive after the warm-ups out of the collector's "
                        "reach (gc.freeze) before the timed runs")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for the run (default: torch's own)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    model, tokenizer = build_model(args.model, args.device, dtype)
    methods = args.methods.split(",")
    oracle = any(m.startswith("oracle") for m in methods)
    if oracle and args.temperature:
        p.error("the oracle methods check greedy output: --temperature must be 0")
    if oracle and args.model in RANDOM_LLAMAS:
        model = decisive(model)  # (greedy margins above bf16 noise: the oracle stays in sync)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    if args.waves < 1:
        p.error(f"--waves {args.waves} is invalid: allowed an integer >= 1")
    prompts = build_prompts(args.kind, args.batch_size * args.waves, args.model, tokenizer,
                            vocab_size)
    max_model_len = max(map(len, prompts)) + args.max_tokens + args.k + 8

    def build(spec: dict | None) -> LLM:
        return LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=dtype,
                   speculative_config=spec, max_num_seqs=args.batch_size,
                   max_model_len=max_model_len, kv_cache_tokens=args.batch_size * max_model_len)

    want = None
    if oracle:  # the oracle drafts the plain engine's greedy continuation
        want = engine_generate(build(None), prompts, args.max_tokens)
        STATE["references"] = [p + w for p, w in zip(prompts, want, strict=True)]
        STATE["alpha"] = args.alpha
    engines = {}
    for method in methods:
        name, _, fixed = method.partition("-")  # "ngram-fixed": every step verifies k drafts
        spec = None if name == "none" else {
            "method": "oracle_bench" if name == "oracle" else name.removesuffix("_tree"),
            "num_speculative_tokens": args.k, "adaptive_k": fixed != "fixed"}
        if name.endswith("_tree"):  # "eagle_tree": eagle drafting trees (--draft-tree)
            spec["draft_tree"] = [int(b) for b in args.draft_tree.split(",")]
        llm = build(spec)
        if fixed == "eager":  # the head's draft chain eager, the rest as usual
            llm.engine.proposer.graphs = None
        for _ in range(args.warmups):
            engine_generate(llm, prompts, args.max_tokens, args.temperature)
        engines[method] = (llm, StepClock(llm.engine))
    results: dict[str, list[dict]] = defaultdict(list)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    pauses = GcPauses()
    try:
        timed_rounds(args, engines, results, pauses, prompts, want)
    finally:  # (the collector's state and callbacks are the process's, not this run's)
        pauses.close()
        if args.gc_freeze:
            gc.unfreeze()
    report(args, dtype, oracle, results)


def timed_rounds(args: argparse.Namespace, engines: dict, results: dict, pauses: GcPauses,
                 prompts: list[list[int]], want: list[list[int]] | None) -> None:
    """``--repeats`` rounds, each method's run timed in turn; summaries into ``results``."""
    for _ in range(args.repeats):
        for method, (llm, clock) in engines.items():
            clock.reset()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            pauses.reset()
            start, cpu = time.perf_counter(), time.process_time()
            got = engine_generate(llm, prompts, args.max_tokens, args.temperature)
            wall = time.perf_counter() - start
            results[method].append({**summary(clock, wall), **pauses.summary(),
                                    "process_cpu_s": time.process_time() - cpu,
                                    "python_threads": threading.active_count(),
                                    "torch_threads": torch.get_num_threads()})
            if want is not None and got != want:
                raise AssertionError(f"{method}: the output differs from the plain engine's")


def report(args: argparse.Namespace, dtype: str, oracle: bool, results: dict) -> None:
    """Print every run's summary; write them as JSON with ``--json``."""
    print(f"{args.model} {args.device} {dtype}, {args.kind} prompts, batch {args.batch_size}, "
          f"{args.max_tokens} tokens, k {args.k}" + (f", alpha {args.alpha}" if oracle else ""))
    for method, runs in results.items():
        for r in runs:
            stages = " ".join(f"{k} {v:.2f}" for k, v in r["stages_ms_per_step"].items())
            print(f"{method:>10}: wall {r['wall_s'] * 1e3:.1f} ms, {r['steps']} steps, "
                  f"{r['ms_per_step']:.2f} ms/step; outside step {r['outside_step_s'] * 1e3:.1f}"
                  f" ms; recorded {r['recorded_steps']} (mean {r['recorded_ms_mean']:.2f} ms), "
                  f"left out {r['left_out_steps']} ({r['left_out_s'] * 1e3:.1f} ms, max "
                  f"{r['left_out_ms_max']:.1f})")
            print(f"{'':>12}stages ms/step: {stages}")
            print(f"{'':>12}host: gc {r['gc_collections']} ({r['gc_ms']} ms), process CPU "
                  f"{r['process_cpu_s'] * 1e3:.1f} ms, {r['python_threads']} Python threads, "
                  f"{r['torch_threads']} torch threads")
            print(f"{'':>12}by width: {r['recorded_by_width']}")
            print(f"{'':>12}recorded ms: {r['recorded_ms_percentiles']}; stages: "
                  + ", ".join(f"{k} {v}" for k, v in r["stage_ms_percentiles"].items()))
            for slow in r["slowest"]:
                print(f"{'':>12}slow step: {slow}")
            print(f"{'':>12}decisions: {r['decisions']}")
            for lo in r["left_out"]:
                print(f"{'':>12}left out: {lo}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results},
                                              indent=1))


if __name__ == "__main__":
    main()
