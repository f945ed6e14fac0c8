"""The two-GPU session: the tests that need two GPUs, then one GPU against layers spread over two
(accelerate's device_map) and tensor parallel over two (transformers' tp_plan under torchrun),
with and without n-gram speculation, on one random checkpoint of ``--model``'s shape.

Steps (default: all but the two ``-unfused`` ones, in this order): ``tests``, ``single``,
``pipeline``, ``capped`` (the first GPU's memory capped below the model: ``--capped``),
``tp-none``, ``tp-ngram``, ``tp-eager``, ``table``; ``single-unfused`` and ``tp-unfused`` (the
fused decoder kernels off: an A/B on one lease). The checkpoint is written once, by the first
step that needs it, and kept in ``--ckpt``. Each step runs as its own process and writes
``OUT/<step>.json`` (its record) and ``OUT/<step>.log``; a step that fails or runs past
``--step-timeout`` seconds leaves no record, and the others still run. One row per step: its exit
status and seconds. Run from the repository root on a machine with two GPUs::

    python -m benchmarks parallel session OUT [--steps single,tp-none]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.record import ROOT, Result
from benchmarks.suites.parallel_table import table

STEPS = ("tests", "single", "pipeline", "capped", "tp-none", "tp-ngram", "tp-eager", "table")
EXTRA_STEPS = ("single-unfused", "tp-unfused")
TESTS = ("tests/engine/runner/test_tensor_parallel.py", "tests/engine/runner/test_spread_model.py",
         "tests/engine/test_llm_spread.py")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="the folder of the steps' records and logs")
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma list of {', '.join(STEPS + EXTRA_STEPS)}")
    p.add_argument("--model", default="random-llama-8b", help="the checkpoint's shape")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--capped", default='{"0": "6GiB", "1": "60GiB"}',
                   help="accelerate's max_memory for the capped pipeline (the 8B: 16 GB)")
    p.add_argument("--ckpt", type=Path, default=None,
                   help="the checkpoint's folder (default /tmp/specdec-<model>)")
    p.add_argument("--step-timeout", type=int, default=420, help="seconds a step may take")


def bench(*args: str, torchrun: bool = False) -> list[str]:
    """A ``python -m benchmarks`` command line, under torchrun over two processes if asked."""
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return [sys.executable, *(launch if torchrun else []), "-m", "benchmarks", *args]


def command(step: str, args: argparse.Namespace) -> list[str]:
    out = str(args.out / f"{step}.json")
    common = ["--model", str(args.ckpt), "--batch-sizes", args.batch_sizes,
              "--max-tokens", str(args.max_tokens), "--json", out]
    layout = {"single": ["--layout", "single"], "pipeline": ["--layout", "pipeline"],
              "capped": ["--layout", "pipeline", "--max-memory", args.capped],
              "single-unfused": ["--layout", "single", "--methods", "none", "--no-fused-ops"]}
    tp = {"tp-none": ["--methods", "none"], "tp-ngram": ["--methods", "ngram"],
          "tp-eager": ["--methods", "none", "--enforce-eager"],
          "tp-unfused": ["--methods", "none", "--no-fused-ops"]}
    if step == "tests":
        return [sys.executable, "-m", "pytest", "-q", "-rs", *TESTS]
    if step in layout:
        return bench("parallel", "run", *layout[step], *common)
    if step in tp:
        return bench("parallel", "run", "--layout", "tp", *tp[step], *common, torchrun=True)
    raise SystemExit(f"unknown step {step!r}: allowed {', '.join(STEPS + EXTRA_STEPS)}")


def run_step(step: str, args: argparse.Namespace) -> dict:
    """One step as its own process, its output in OUT/<step>.log; a failed step's record is
    removed (a stale one would enter the table)."""
    if step != "tests" and not (args.ckpt / "config.json").exists():
        subprocess.run(bench("parallel", "save", "--model", args.model, "--dir", str(args.ckpt)),
                       cwd=ROOT, check=True)
    (args.out / f"{step}.json").unlink(missing_ok=True)
    start = time.perf_counter()
    with open(args.out / f"{step}.log", "w") as log:
        try:
            rc = subprocess.run(command(step, args), cwd=ROOT, stdout=log, stderr=log,
                                timeout=args.step_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    if rc != 0:
        (args.out / f"{step}.json").unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    print(f"{step}: exit {rc} in {seconds:.0f} s (log: {args.out / f'{step}.log'})", flush=True)
    return {"step": step, "rc": rc, "seconds": seconds}


def run(args: argparse.Namespace) -> Result:
    if torch.cuda.device_count() < 2:
        raise SystemExit(f"the session needs two GPUs, found {torch.cuda.device_count()}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.ckpt = args.ckpt or Path(f"/tmp/specdec-{args.model}")
    rows = []
    for step in args.steps.split(","):
        if step == "table":
            table(sorted(p for p in args.out.glob("*.json")))
            continue
        rows.append(run_step(step, args))
    return Result(rows, args.model, {"failed": [r["step"] for r in rows if r["rc"]]})
