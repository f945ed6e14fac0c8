"""What the runner suite's cases share: their arguments, and the runner they time.

Every case holds sequences of ``--context`` cached tokens, runs one step, cuts the runner back
(``truncate``) so that every repetition runs the same step, and times the variants taking turns
(``benchmarks.timing.take_turns``), synchronised on CUDA. Medians, milliseconds.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import models
from engine.runner.model_runner import ModelRunner


def add_step_arguments(parser: argparse.ArgumentParser, model: str, batch_sizes: str,
                       widths: str, widths_help: str, context: int, warmup: int,
                       iters: int = 30) -> None:
    """The arguments every case takes (defaults as given)."""
    models.add_model_arguments(parser, model)
    parser.add_argument("--batch-sizes", default=batch_sizes)
    parser.add_argument("--widths", default=widths, help=widths_help)
    parser.add_argument("--context", type=int, default=context, help="cached tokens a sequence")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iters", type=int, default=iters)


def build_runner(args: argparse.Namespace) -> tuple[ModelRunner, list[int], list[int]]:
    """The runner of ``args.model`` for the largest batch and width (on CPU: the graph
    buckets' layout, eagerly), the batch sizes and the widths."""
    models.resolve(args)
    model, _ = models.build_model(args.model, args.device, args.dtype)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    runner = ModelRunner(model, max_num_seqs=max(batches), max_num_tokens=max(batches) * 1024,
                         max_model_len=1024, cuda_graph_max_new=max(widths))
    if runner.graphs is None and runner.device.type == "cpu":  # (the buckets' layout, eagerly)
        runner.use_graph_buckets(max(widths), capture=False)
    return runner, batches, widths


def filled_slots(runner: ModelRunner, count: int, context: int,
                 gen: torch.Generator) -> list[int]:
    """``count`` slots, each holding ``context`` random cached tokens (prefilled one by one)."""
    vocab = min(runner.vocab_size, 5000)
    slots = [runner.allocate_slot() for _ in range(count)]
    for slot in slots:
        runner.forward([slot], [torch.randint(2, vocab, (context,), generator=gen).tolist()])
    return slots

