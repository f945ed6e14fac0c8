"""Where a run's time goes, step by step: each stage of ``LLMEngine.step``, the time between
steps, and which steps the speculation controller measured.

The controller decides from the steps it times; time it does not see (steps it leaves out, work
outside ``step()``) is a loss it cannot weigh. For one warm ``LLM.generate`` per method over the
workload's prompts, the methods taking turns round by round: wall time, steps, milliseconds per
step, the sum of the stages, the time outside ``step()``, the steps the controller recorded
(their count, mean time, and by width), the garbage collector's pauses; the steps by how their
next forward was launched (overlapped steps: from the host, from a drafting flight's chains, a
plain flight ...; ``step_clock.LAUNCHES``), and those of the whole batch against a closed
batch's tail (fewer sequences: speculation ends them at different steps), each with its stages'
mean times (an overlapped step's: its launch, the runner's forward, the proposer's drafts, the
commit, and ``read``, the wait for the flight's tokens: what is left of the step is host time
on the critical path). In an engine that overlaps (CUDA's default), ``forward`` is the
engine's part of a synchronous step's forward and ``runner.forward`` the runner's; without
overlap ``forward`` holds both, as before. On CUDA a stage's time is host time until the
first synchronisation, which is verification (``.tolist()``) or an overlapped step's ``read``.
One row per (method, round).

    python -m benchmarks steps --device cuda --kind open --batch-size 32 --methods none,ngram

``oracle`` / ``oracle-fixed``: the oracle proposer (``benchmarks/oracle.py``; each draft right
with probability ``--alpha``; a random target made decisive), to see the controller's choices
where the acceptance is known:

    python -m benchmarks steps --device cuda --model random-llama-1b --methods \\
        none,oracle,oracle-fixed --alpha 0.5
"""

from __future__ import annotations

import argparse
import gc
import threading
import time

import torch

from benchmarks import models
from benchmarks.engines import engine_generate, speculative_config
from benchmarks.oracle import METHOD as ORACLE_METHOD
from benchmarks.oracle import ORACLE
from benchmarks.record import Result
from benchmarks.suites.step_clock import GcPauses, StepClock, reads_timed
from benchmarks.suites.step_summary import summary
from benchmarks.workloads import PROMPT_SETS, build_prompts, text_prompts
from engine import LLM


def add_arguments(p: argparse.ArgumentParser) -> None:
    models.add_model_arguments(p, "smollm2-135m")
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
    p.add_argument("--kind", default="open",
                   help="one of the prompt set's kinds (bench: copy, open, copy_short; real: "
                        "open, copy, multi_turn or one of their kinds)")
    p.add_argument("--prompt-set", default="bench", choices=PROMPT_SETS,
                   help="whose prompts (real: the real-text workload's held-out split)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--waves", type=int, default=1,
                   help="waves * batch-size prompts, at most batch-size running at once (a "
                        "finished request's place is refilled: steps that admit a prompt)")
    p.add_argument("--warmups", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method, alternating")
    p.add_argument("--gc-freeze", action="store_true",
                   help="move every object alive after the warm-ups out of the collector's "
                        "reach (gc.freeze) before the timed runs")
    p.add_argument("--async-scheduling", default="default", choices=("default", "on", "off"),
                   help="EngineConfig.async_scheduling (default: on where the forward runs "
                        "behind the host, CUDA)")
    p.add_argument("--threads", type=int, default=None,
                   help="the engines' torch threads (default: EngineConfig.num_threads's)")


def method_config(args: argparse.Namespace, method: str) -> dict | None:
    """``ngram-fixed``: k drafts every step; ``eagle-eager``: the head's chain without graphs
    (set on the built engine); ``oracle``: the oracle proposer."""
    name, _, variant = method.partition("-")
    if name == "oracle":
        name = ORACLE_METHOD
    return speculative_config(name, args.k, args.draft_tree, adaptive=variant != "fixed")


def run(args: argparse.Namespace) -> Result:
    models.resolve(args)
    if args.waves < 1:
        raise SystemExit(f"--waves {args.waves} is invalid: allowed an integer >= 1")
    try:
        text_prompts(args.kind, args.prompt_set)
    except ValueError as e:
        raise SystemExit(f"--kind: {e}") from None
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    methods = args.methods.split(",")
    oracle = any(m.startswith("oracle") for m in methods)
    if oracle and args.temperature:
        raise SystemExit("the oracle methods check greedy output: --temperature must be 0")
    if oracle and args.model in models.RANDOM_LLAMAS:
        model = models.decisive(model)  # (greedy margins above bf16 noise: the oracle keeps up)
    prompts = build_prompts(args.kind, args.batch_size * args.waves, args.model, tokenizer,
                            models.vocab_size(model), args.prompt_set)
    max_model_len = max(map(len, prompts)) + args.max_tokens + args.k + 8

    def build(spec: dict | None) -> LLM:
        return LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=args.dtype,
                   speculative_config=spec, max_num_seqs=args.batch_size,
                   max_model_len=max_model_len, kv_cache_tokens=args.batch_size * max_model_len,
                   num_threads=args.threads,
                   async_scheduling={"on": True, "off": False}.get(args.async_scheduling))

    want = None
    if oracle:  # the oracle drafts the plain engine's greedy continuation
        want = engine_generate(build(None), prompts, args.max_tokens)
        ORACLE.references = [p + w for p, w in zip(prompts, want, strict=True)]
        ORACLE.alpha = args.alpha
    engines = {}
    for method in methods:
        llm = build(method_config(args, method))
        if method.endswith("-eager"):  # the head's draft chain eager, the rest as usual
            llm.engine.proposer.graphs = None
        for _ in range(args.warmups):
            engine_generate(llm, prompts, args.max_tokens, args.temperature)
        engines[method] = (llm, StepClock(llm.engine))
    rows = timed_rounds(args, engines, prompts, want)
    report(args, oracle, rows)
    return Result(rows, args.model)


def timed_rounds(args: argparse.Namespace, engines: dict, prompts: list[list[int]],
                 want: list[list[int]] | None) -> list[dict]:
    """``--repeats`` rounds, each method's run timed in turn: one summary row per run."""
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    pauses = GcPauses()
    try:  # (each flight's token read timed too: the host waiting for the device)
        with reads_timed():
            return [timed_run(args, method, round_, llm, clock, prompts, want, pauses)
                    for round_ in range(args.repeats)
                    for method, (llm, clock) in engines.items()]
    finally:  # (the collector's state and callbacks are the process's, not this run's)
        pauses.close()
        if args.gc_freeze:
            gc.unfreeze()


def timed_run(args: argparse.Namespace, method: str, round_: int, llm: LLM, clock: StepClock,
              prompts: list[list[int]], want: list[list[int]] | None, pauses: GcPauses) -> dict:
    """One timed ``generate`` of ``method``'s engine: its summary row."""
    clock.reset()
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    pauses.reset()
    start, cpu = time.perf_counter(), time.process_time()
    got = engine_generate(llm, prompts, args.max_tokens, args.temperature)
    wall = time.perf_counter() - start
    if want is not None and got != want:
        raise RuntimeError(f"{method}: the output differs from the plain engine's")
    return {"method": method, "round": round_, **summary(clock, wall), **pauses.summary(),
            "process_cpu_s": time.process_time() - cpu,
            "python_threads": threading.active_count(),
            "torch_threads": torch.get_num_threads()}


def report(args: argparse.Namespace, oracle: bool, rows: list[dict]) -> None:
    print(f"{args.model} {args.device} {args.dtype}, {args.kind} prompts ({args.prompt_set}), "
          f"batch {args.batch_size}, {args.max_tokens} tokens, k {args.k}"
          + (f", alpha {args.alpha}" if oracle else ""))
    for r in rows:
        stages = " ".join(f"{k} {v:.2f}" for k, v in r["stages_ms_per_step"].items())
        print(f"{r['method']:>10}: wall {r['wall_s'] * 1e3:.1f} ms, {r['steps']} steps, "
              f"{r['ms_per_step']:.2f} ms/step; outside step {r['outside_step_s'] * 1e3:.1f} ms;"
              f" recorded {r['recorded_steps']} (mean {r['recorded_ms_mean']:.2f} ms), left out "
              f"{r['left_out_steps']} ({r['left_out_s'] * 1e3:.1f} ms, max "
              f"{r['left_out_ms_max']:.1f})")
        print(f"{'':>12}stages ms/step: {stages}")
        print(f"{'':>12}host: gc {r['gc_collections']} ({r['gc_ms']} ms), process CPU "
              f"{r['process_cpu_s'] * 1e3:.1f} ms, {r['python_threads']} Python threads, "
              f"{r['torch_threads']} torch threads")
        for group in ("by_launch", "by_batch"):
            for name, t in r[group].items():
                if t["n"]:
                    stages = ", ".join(f"{k} {v:.3f}" for k, v in t["stages_ms_mean"].items())
                    print(f"{'':>12}{name}: {t['n']} steps, {t['s'] * 1e3:.1f} ms, median "
                          f"{t['ms_median']:.2f}; stages ms/step: {stages}")
        print(f"{'':>12}by width: {r['recorded_by_width']}")
        print(f"{'':>12}recorded ms: {r['recorded_ms_percentiles']}; stages: "
              + ", ".join(f"{k} {v}" for k, v in r["stage_ms_percentiles"].items()))
        for slow in r["slowest"]:
            print(f"{'':>12}slow step: {slow}")
        print(f"{'':>12}decisions: {r['decisions']}")
        for lo in r["left_out"]:
            print(f"{'':>12}left out: {lo}")
