"""The draft head's acceptance offline, by kind of text: where its drafts are right.

The target answers each prompt set greedily (``--max-tokens``, with its chat template, through
the engine); one target forward gives every position's feature; from every answer position the
head drafts 4 tokens chained on its own greedy drafts through its draft vocabulary, as the
proposer does, and a draft counts while it equals the target's greedy text (the measure that
``examples/train_draft_head.py`` prints each epoch, here on other prompts). Sets:

- ``bench_open`` / ``bench_copy``: the workload's open-ended and copy-heavy prompts;
- ``held_out``: the first ``--num-prompts`` held-out training-style prompts (templates crossed
  with topics that no training prompt has, ``examples/draft_head_prompts.py``);
- ``train``: the first ``--num-prompts`` training prompts (without the target's rewordings and
  copy tasks), text of the kind the head was fit on;
- ``real_open`` / ``real_copy``: the real-text workload's held-out split (``benchmarks.real_text``:
  32 story, explanation, factual and code-writing prompts; 16 code-edit and quote prompts), what
  the benchmarks report on and no head is trained on.

One row per set: first-draft acceptance, the conditional rate at each position, mean drafts
accepted of 4 (tokens per step minus one), and per prompt::

    python -m benchmarks proposers head-acceptance --device cpu
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import models
from benchmarks.real_text import heldout_prompts
from benchmarks.record import Result
from benchmarks.workloads import COPY_HEAVY, OPEN_ENDED
from engine import LLM
from examples.draft_head_prompts import draft_head_prompts
from examples.train_draft_head import (
    acceptance_counts,
    acceptance_rates,
    features_of,
    generate,
)
from proposers.draft_head import DEFAULT_HEAD_DIR
from proposers.head_model import DraftHead

SETS = ("bench_open", "bench_copy", "held_out", "train", "real_open", "real_copy")


def add_arguments(p: argparse.ArgumentParser) -> None:
    models.add_model_arguments(p, "smollm2-135m")
    p.add_argument("--head", default=str(DEFAULT_HEAD_DIR), help="a saved draft head directory")
    p.add_argument("--sets", default=",".join(SETS), help=f"comma list of {SETS}")
    p.add_argument("--num-prompts", type=int, default=8,
                   help="prompts of the held_out and train sets")
    p.add_argument("--max-tokens", type=int, default=128)


def prompt_sets(names: list[str], num_prompts: int) -> dict[str, list[str]]:
    """The prompts of each named set (see the module docstring)."""
    train, held = draft_head_prompts(1800)
    every = {"bench_open": OPEN_ENDED, "bench_copy": COPY_HEAVY,
             "held_out": [p.chat for p in held[:num_prompts]],
             "train": [p.chat for p in train[:num_prompts]],
             # (the open and copy groups' prompts are single user turns)
             "real_open": [p.turns[0] for p in heldout_prompts("open")],
             "real_copy": [p.turns[0] for p in heldout_prompts("copy")]}
    return {name: every[name] for name in names}


def run(args: argparse.Namespace) -> Result:
    models.resolve(args)
    names = [s for s in args.sets.split(",") if s]
    unknown = [s for s in names if s not in SETS]
    if unknown:
        raise SystemExit(f"--sets: unknown {unknown}; allowed {SETS}")
    llm = LLM(model=args.model, device=args.device, dtype=args.dtype, max_num_seqs=16)
    model = llm.engine.model
    device = next(model.parameters()).device
    head = DraftHead.load(args.head).to(device=device, dtype=getattr(torch, args.dtype)).eval()
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    rows = []
    for name, prompts in prompt_sets(names, args.num_prompts).items():
        seqs, starts = generate(llm, prompts, args.max_tokens, 0.0, 0)
        feats = features_of(model, seqs, device)
        accepted, tried = acceptance_counts(head, embed, lm_head, feats, seqs, starts)
        whole = acceptance_rates(accepted.sum(0), tried.sum(0))  # (each draft run once)
        each = [acceptance_rates(a, t)["mean_accepted"]
                for a, t in zip(accepted, tried, strict=True)]
        rows.append({"set": name, **whole, "per_prompt_mean_accepted": each})
        print(f"{name:<10} first draft {whole['first_draft']:.3f}, conditional per position "
              f"{[round(x, 3) for x in whole['per_position']]}, mean accepted "
              f"{whole['mean_accepted']:.2f} of 4 ({whole['positions']} positions); per prompt "
              f"{[round(x, 2) for x in each]}")
    return Result(rows, args.model, {"head": args.head})
