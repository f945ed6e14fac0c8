"""What a step that admits a prompt while others decode costs, by how the runner lays it out.

Under continuous batching with speculation, requests end at different steps, so most prompts are
admitted in a step where the other sequences decode or verify drafts (a *mixed* step). The
runner can run such a step three ways (``engine/runner/model_runner.py``):

- ``fold``: one forward, each prompt chunk cut into rows of the step's width (the default with
  CUDA graphs, ``ModelRunner._fold``);
- ``split``: two forwards, the decodes in their graph bucket, then the prompt (a prefill graph);
- ``padded``: one forward, every sequence padded to the prompt's length (eager past the graphs).

Each is timed against the same step without the prompt (``decode``). Each row records how the
runner lays the step out (``fold_width``: None when it would not fold; ``split``: False when
the split saves too little and that layout is one padded forward). ``batch - 1`` sequences
hold ``--context`` cached tokens and bring ``width`` new tokens each (1: decoding; k + 1:
verifying drafts); the prompt has ``--prompt`` tokens. After every timed step the runner is cut
back (``truncate``, the prompt's slot freed), so every repetition runs the same step; the
layouts take turns, each after its own warm-up (so that its graph buckets are captured as the
engine would capture them). Medians of ``--iters`` synchronized steps, milliseconds.

    python benchmarks/mixed_step.py --device cuda --model random-smollm2-135m --json out.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.step_bench import (  # noqa: E402
    add_arguments,
    build_runner,
    sync,
    take_turns,
    write_json,
)
from engine.runner.model_runner import ModelRunner  # noqa: E402

LAYOUTS = {"decode": None, "fold": (True, True), "split": (False, True),
           "padded": (False, False)}  # (fold_mixed, split_mixed)


def measure(runner: ModelRunner, batch: int, width: int, prompt_len: int, context: int,
            warmup: int, iters: int) -> dict[str, float]:
    """Median ms of each layout's step (see the module docstring)."""
    gen = torch.Generator().manual_seed(batch * 1000 + width)
    vocab = min(runner.vocab_size, 5000)
    slots = [runner.allocate_slot() for _ in range(batch - 1)]
    for slot in slots:
        runner.forward([slot], [torch.randint(2, vocab, (context,), generator=gen).tolist()])
    news = [torch.randint(2, vocab, (width,), generator=gen).tolist() for _ in slots]
    prompt = torch.randint(2, vocab, (prompt_len,), generator=gen).tolist()
    device = runner.device

    def step(layout: str) -> float:
        sync(device)
        start = time.perf_counter()
        if layout == "decode":
            runner.forward(slots, news)
            sync(device)
            took = time.perf_counter() - start
        else:
            runner.fold_mixed, runner.split_mixed = LAYOUTS[layout]
            extra = runner.allocate_slot()
            runner.forward(slots + [extra], news + [prompt])
            sync(device)
            took = time.perf_counter() - start
            runner.free_slot(extra)
        for slot in slots:
            runner.truncate(slot, context)
        return took * 1e3

    # how the runner lays the mixed step out: the fold's width (None: not folded) and whether
    # the split applies (None / False: that layout ran as one padded forward)
    mixed = news + [prompt]
    runner.fold_mixed = True
    layout_of = dict(fold_width=runner._fold(mixed, [None] * len(mixed), context + prompt_len),
                     split=runner._mixed_groups(mixed) is not None)
    ms = take_turns(step, LAYOUTS, warmup, iters)
    for slot in slots:
        runner.free_slot(slot)
    runner.fold_mixed = runner.split_mixed = True
    return ms, layout_of


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser, "8,32", "1,5", "new tokens per decoding sequence", context=200,
                  warmup=40)
    parser.add_argument("--prompts", default="40,120", help="prompt lengths")
    args = parser.parse_args(argv)
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
    write_json(args, runner, rows,
               graphs=None if runner.graphs is None else sorted(runner.graphs._graphs))


if __name__ == "__main__":
    main()
