"""What a verification step of unequal drafts costs, padded and packed.

In a step where some sequences verify drafts and the others decode (n-gram finds a match for a
few; requests capped or opted out), the runner either pads every sequence to the longest
(``padded``: ``batch`` rows of ``width`` tokens, one graph bucket) or *packs* the step
(``packed``: one row per new token on its sequence's slot, the decode bucket of that many rows).
Each is timed against the same sequences decoding (``decode``): ``batch`` sequences hold
``--context`` cached tokens, ``drafting`` of them bring ``width`` tokens (k + 1), the others one.
``rule`` says what the runner does on its own (``PACK_MIN_BATCH``, ``PACK_MAX_EXTRA``); here
each layout is forced, and ``packed`` says whether forcing it packed the step (the rows' limit).

    python -m benchmarks runner packed --device cuda --model random-smollm2-135m
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.record import Result
from benchmarks.suites.runner_setup import add_step_arguments, build_runner, filled_slots
from benchmarks.timing import take_turns, timed
from engine.runner import step_layout
from engine.runner.model_runner import ModelRunner

LAYOUTS = ("decode", "padded", "packed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_step_arguments(parser, "random-smollm2-135m", "8,16,32", "3,5",
                       "the drafting sequences' new tokens (k + 1)", context=256, warmup=20)
    parser.add_argument("--drafting", default="1,2,4,8", help="sequences verifying drafts")


def measure(runner: ModelRunner, batch: int, drafting: int, width: int, context: int,
            warmup: int, iters: int) -> tuple[dict[str, float], str, bool]:
    """Median ms of each layout's step, what the runner's own rule does with the step, and
    whether forcing the packed layout packed it."""
    gen = torch.Generator().manual_seed(batch * 1000 + drafting * 10 + width)
    vocab = min(runner.vocab_size, 5000)
    slots = filled_slots(runner, batch, context, gen)
    lens = [width] * drafting + [1] * (batch - drafting)
    news = [torch.randint(2, vocab, (n,), generator=gen).tolist() for n in lens]
    decodes = [ids[:1] for ids in news]
    rule = "packed" if runner.packed_rows(batch, max(lens), sum(lens)) else "padded"
    forced = []

    def step(layout: str) -> float:
        runner.pack_verifications = layout == "packed"
        own = step_layout.PACK_MIN_BATCH, step_layout.PACK_MAX_EXTRA
        # (forced: packed whenever the rows fit)
        step_layout.PACK_MIN_BATCH, step_layout.PACK_MAX_EXTRA = 1, float(1 << 30)
        out, seconds, _ = timed(
            lambda: runner.forward(slots, decodes if layout == "decode" else news), runner.device)
        step_layout.PACK_MIN_BATCH, step_layout.PACK_MAX_EXTRA = own
        if layout == "packed":
            forced.append(out.packed_rows is not None)
        for slot in slots:
            runner.truncate(slot, context)
        return 1e3 * seconds

    ms = take_turns(step, LAYOUTS, warmup, iters)
    for slot in slots:
        runner.free_slot(slot)
    runner.pack_verifications = True
    return ms, rule, all(forced)


def run(args: argparse.Namespace) -> Result:
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
    return Result(rows, args.model, {"pack_min_batch": step_layout.PACK_MIN_BATCH,
                                     "pack_max_extra": step_layout.PACK_MAX_EXTRA,
                                     "fold_rows": runner.fold_rows})
