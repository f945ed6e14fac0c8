"""What a step that admits a prompt while others decode costs, by how the runner lays it out.

Under continuous batching with speculation, requests end at different steps, so most prompts are
admitted in a step where the other sequences decode or verify drafts (a *mixed* step). The
runner can run such a step three ways:

- ``fold``: one forward, each prompt chunk cut into rows of the step's width (the default with
  CUDA graphs);
- ``split``: two forwards, the decodes in their graph bucket, then the prompt (a prefill graph);
- ``padded``: one forward, every sequence padded to the prompt's length (eager past the graphs).

Each is timed against the same step without the prompt (``decode``). Each row records how the
runner lays the step out on its own (``fold_width``: None when it would not fold; ``split``:
False when the split saves too little and that layout is one padded forward). ``batch - 1``
sequences hold ``--context`` cached tokens and bring ``width`` new tokens each (1: decoding;
k + 1: verifying drafts); the prompt has ``--prompts`` tokens. Each layout is warmed up on its
own (so that its graph buckets are captured as the engine would capture them).

    python -m benchmarks runner mixed --device cuda --model random-smollm2-135m
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.record import Result
from benchmarks.suites.runner_setup import add_step_arguments, build_runner, filled_slots
from benchmarks.timing import seconds_of, take_turns
from engine.runner.model_runner import ModelRunner
from engine.runner.step_layout import fold_width, mixed_groups

LAYOUTS = {"decode": None, "fold": (True, True), "split": (False, True),
           "padded": (False, False)}  # (fold_mixed, split_mixed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_step_arguments(parser, "random-smollm2-135m", "8,32", "1,5",
                       "new tokens per decoding sequence", context=200, warmup=40)
    parser.add_argument("--prompts", default="40,120", help="prompt lengths")


def measure(runner: ModelRunner, batch: int, width: int, prompt_len: int, context: int,
            warmup: int, iters: int) -> tuple[dict[str, float], dict]:
    """Median ms of each layout's step, and how the runner lays the mixed step out."""
    gen = torch.Generator().manual_seed(batch * 1000 + width)
    vocab = min(runner.vocab_size, 5000)
    slots = filled_slots(runner, batch - 1, context, gen)
    news = [torch.randint(2, vocab, (width,), generator=gen).tolist() for _ in slots]
    prompt = torch.randint(2, vocab, (prompt_len,), generator=gen).tolist()

    def step(layout: str) -> float:
        if layout == "decode":
            ms = 1e3 * seconds_of(lambda: runner.forward(slots, news), runner.device)
        else:
            runner.fold_mixed, runner.split_mixed = LAYOUTS[layout]
            extra = runner.allocate_slot()
            ms = 1e3 * seconds_of(lambda: runner.forward(slots + [extra], news + [prompt]),
                                  runner.device)
            runner.free_slot(extra)
        for slot in slots:
            runner.truncate(slot, context)
        return ms

    # how the runner would lay the mixed step out (its own limits, every layout allowed)
    lens = [width] * len(news) + [prompt_len]
    runner.fold_mixed = runner.split_mixed = True
    limits = runner._limits()
    layout_of = dict(fold_width=fold_width(lens, [None] * len(lens),
                                           max(context + width, prompt_len), limits),
                     split=mixed_groups(lens, limits) is not None)
    ms = take_turns(step, LAYOUTS, warmup, iters)
    for slot in slots:
        runner.free_slot(slot)
    runner.fold_mixed = runner.split_mixed = True
    return ms, layout_of


def run(args: argparse.Namespace) -> Result:
    runner, batches, widths = build_runner(args)
    rows = []
    print("batch width prompt  decode    fold   split  padded  fold/split  fold/decode")
    for batch in batches:
        for width in widths:
            for prompt_len in (int(p) for p in args.prompts.split(",")):
                ms, layout_of = measure(runner, batch, width, prompt_len, args.context,
                                        args.warmup, args.iters)
                rows.append(dict(batch=batch, width=width, prompt=prompt_len, ms=ms, **layout_of,
                                 fold_over_split=ms["fold"] / ms["split"],
                                 fold_over_decode=ms["fold"] / ms["decode"]))
                print(f"{batch:5d} {width:5d} {prompt_len:6d} {ms['decode']:7.2f} "
                      f"{ms['fold']:7.2f} {ms['split']:7.2f} {ms['padded']:7.2f} "
                      f"{rows[-1]['fold_over_split']:11.2f} {rows[-1]['fold_over_decode']:12.2f}"
                      + ("" if layout_of["split"] else "  (split: one padded forward here)")
                      + ("" if layout_of["fold_width"] else "  (fold: not folded here)"),
                      flush=True)
    graphs = None if runner.graphs is None else sorted(runner.graphs._graphs)
    return Result(rows, args.model, {"graphs": graphs})
