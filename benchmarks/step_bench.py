"""What the one-step runner benchmarks share (``mixed_step.py``, ``packed_step.py``): their
common arguments, the runner they time, and the JSON they write."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from benchmarks.e2e_workloads import build_model
from engine.runner.model_runner import ModelRunner


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def add_arguments(parser: argparse.ArgumentParser, batch_sizes: str, widths: str,
                  widths_help: str, context: int, warmup: int) -> None:
    """The arguments every one-step benchmark takes (defaults as given)."""
    parser.add_argument("--model", default="random-smollm2-135m")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bf16 on CUDA")
    parser.add_argument("--batch-sizes", default=batch_sizes)
    parser.add_argument("--widths", default=widths, help=widths_help)
    parser.add_argument("--context", type=int, default=context)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--json", default=None)


def build_runner(args: argparse.Namespace) -> tuple[ModelRunner, list[int], list[int]]:
    """The runner of ``args.model`` for the largest batch and width (on CPU: the graph
    buckets' layout, eagerly), the batch sizes and the widths."""
    device = torch.device(args.device)
    dtype = args.dtype or ("float32" if device.type == "cpu" else "bfloat16")
    model, _ = build_model(args.model, args.device, dtype)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    runner = ModelRunner(model, max_num_seqs=max(batches), max_num_tokens=max(batches) * 1024,
                         max_model_len=1024, cuda_graph_max_new=max(widths))
    if runner.graphs is None and device.type == "cpu":  # (the buckets' layout, eagerly)
        runner.use_graph_buckets(max(widths), capture=False)
    return runner, batches, widths


def write_json(args: argparse.Namespace, runner: ModelRunner, rows: list[dict],
               **extra) -> None:
    """``args.json`` (when given): the arguments, commit, machine, rows and ``extra``."""
    if not args.json:
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    device = runner.device
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    Path(args.json).write_text(json.dumps(dict(args=vars(args), commit=commit, machine=machine,
                                               rows=rows, **extra), indent=1))


def take_turns(step: Callable[[str], float], layouts: Iterable[str], warmup: int,
               iters: int) -> dict[str, float]:
    """Each layout's median of ``iters`` timed ``step(layout)`` calls, the layouts taking
    turns after ``warmup`` untimed calls of each."""
    layouts = list(layouts)
    times: dict[str, list[float]] = {layout: [] for layout in layouts}
    for layout in layouts:
        for _ in range(warmup):
            step(layout)
    for _ in range(iters):
        for layout in layouts:
            times[layout].append(step(layout))
    return {layout: statistics.median(t) for layout, t in times.items()}
