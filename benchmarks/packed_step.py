"""What a verification step of unequal drafts costs, padded and packed.

In a step where some sequences verify drafts and the others decode (n-gram finds a match for a
few; requests capped or opted out), the runner either pads every sequence to the longest
(``padded``: ``batch`` rows of ``width`` tokens, one graph bucket) or *packs* the step
(``packed``: one row per new token on its sequence's slot, the decode bucket of that many rows,
``ModelRunner.packed_rows``). Each is timed against the same sequences decoding (``decode``):
``batch`` sequences hold ``--context`` cached tokens, ``drafting`` of them bring ``width``
tokens (k + 1), the others one. After every timed step the runner is cut back (``truncate``),
so every repetition runs the same step; the layouts take turns after their own warm-ups (so
that their graph buckets are captured as the engine would capture them). Medians of
``--iters`` synchronized steps, milliseconds. ``rule`` says what the runner does on its own
(``packed`` or ``padded``: ``PACK_MIN_BATCH``, ``PACK_MAX_EXTRA``); here each layout is forced.

    python benchmarks/packed_step.py --device cuda --model random-smollm2-135m --json out.json
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
from engine.runner import model_runner  # noqa: E402
from engine.runner.model_runner import ModelRunner  # noqa: E402

LAYOUTS = ("decode", "padded", "packed")


def measure(runner: ModelRunner, batch: int, drafting: int, width: int, context: int,
            warmup: int, iters: int) -> tuple[dict[str, float], str, bool]:
    """Median ms of each layout's step (see the module docstring), what the runner's own rule
    does with the step, and whether forcing the packed layout packed it (the rows' limits)."""
    gen = torch.Generator().manual_seed(batch * 1000 + drafting * 10 + width)
    vocab = min(runner.vocab_size, 5000)
    slots = [runner.allocate_slot() for _ in range(batch)]
    for slot in slots:
        runner.forward([slot], [torch.randint(2, vocab, (context,), generator=gen).tolist()])
    lens = [width] * drafting + [1] * (batch - drafting)
    news = [torch.randint(2, vocab, (n,), generator=gen).tolist() for n in lens]
    decodes = [ids[:1] for ids in news]
    rule = "packed" if runner.packed_rows(batch, max(lens), sum(lens)) else "padded"
    device = runner.device
    forced = []

    def step(layout: str) -> float:
        runner.pack_verifications = layout == "packed"
        rule = model_runner.PACK_MIN_BATCH, model_runner.PACK_MAX_EXTRA
        # (forced: packed whenever the rows fit)
        model_runner.PACK_MIN_BATCH, model_runner.PACK_MAX_EXTRA = 1, float(1 << 30)
        sync(device)
        start = time.perf_counter()
        runner.forward(slots, decodes if layout == "decode" else news)
        sync(device)
        took = time.perf_counter() - start
        model_runner.PACK_MIN_BATCH, model_runner.PACK_MAX_EXTRA = rule
        if layout == "packed":
            forced.append(runner.last_packed_rows is not None)
        for slot in slots:
            runner.truncate(slot, context)
        return took * 1e3

    ms = take_turns(step, LAYOUTS, warmup, iters)
    for slot in slots:
        runner.free_slot(slot)
    runner.pack_verifications = True
    return ms, rule, all(forced)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser, "8,16,32", "3,5", "the drafting sequences' new tokens (k + 1)",
                  context=256, warmup=20)
    parser.add_argument("--drafting", default="1,2,4,8", help="sequences verifying drafts")
    args = parser.parse_args(argv)
    runner, batches, widths = build_runner(args)
    rows = []
    print("batch drafting width  decode  padded  packed  padded/decode  packed/decode  "
          "packed/padded  rule")
    for batch in batches:
        for drafting in (int(d) for d in args.drafting.split(",")):
            if drafting >= batch:
                continue
            for width in widths:
                ms, rule, packed = measure(runner, batch, drafting, width, args.context,
                                           args.warmup, args.iters)
                row = dict(batch=batch, drafting=drafting, width=width, ms=ms, rule=rule,
                           packed=packed, padded_over_decode=ms["padded"] / ms["decode"],
                           packed_over_decode=ms["packed"] / ms["decode"],
                           packed_over_padded=ms["packed"] / ms["padded"])
                rows.append(row)
                print(f"{batch:5d} {drafting:8d} {width:5d} {ms['decode']:7.2f} "
                      f"{ms['padded']:7.2f} {ms['packed']:7.2f} "
                      f"{row['padded_over_decode']:14.2f} {row['packed_over_decode']:14.2f} "
                      f"{row['packed_over_padded']:14.2f}  {rule}"
                      + ("" if packed else "  (too many rows: not packed)"), flush=True)
    write_json(args, runner, rows, pack_min_batch=model_runner.PACK_MIN_BATCH,
               pack_max_extra=model_runner.PACK_MAX_EXTRA, fold_rows=runner.fold_rows)


if __name__ == "__main__":
    main()
