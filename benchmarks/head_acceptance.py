"""The draft head's acceptance offline, by kind of text: where its drafts are right.

The target answers each prompt set greedily (``--max-tokens``, with its chat template, through
the engine); one target forward gives every position's feature; from every answer position the
head drafts 4 tokens chained on its own greedy drafts through its draft vocabulary, as the
proposer does, and a draft counts while it equals the target's greedy text (the measure that
``examples/train_draft_head.py`` prints each epoch, here on other prompts). Sets:

- ``bench_open`` / ``bench_copy``: the open-ended and copy-heavy prompts of ``benchmarks/e2e.py``;
- ``held_out``: the first ``--num-prompts`` held-out training-style prompts (templates crossed
  with topics that no training prompt has, ``examples/draft_head_prompts.py``);
- ``train``: the first ``--num-prompts`` training prompts (without the target's rewordings and
  copy tasks), text of the kind the head was fit on.

Per set: first-draft acceptance, the conditional rate at each position, mean drafts accepted of
4 (tokens per step minus one), and per prompt. Runs on this CPU in about two minutes::

    python benchmarks/head_acceptance.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.e2e_workloads import COPY_HEAVY, OPEN_ENDED  # noqa: E402
from engine import LLM  # noqa: E402
from examples.draft_head_prompts import draft_head_prompts  # noqa: E402
from examples.train_draft_head import (  # noqa: E402
    features_of,
    generate,
    held_out_acceptance,
)
from proposers.draft_head import DEFAULT_HEAD_DIR  # noqa: E402
from proposers.head_model import DraftHead  # noqa: E402

SETS = ("bench_open", "bench_copy", "held_out", "train")


def prompt_sets(names: list[str], num_prompts: int) -> dict[str, list[str]]:
    """The prompts of each named set (see the module docstring)."""
    train, held = draft_head_prompts(1800)  # (the shipped head's split: --num-prompts 1800)
    every = {"bench_open": OPEN_ENDED, "bench_copy": COPY_HEAVY,
             "held_out": held[:num_prompts], "train": train[:num_prompts]}
    return {name: every[name] for name in names}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--head", default=str(DEFAULT_HEAD_DIR), help="a saved draft head directory")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--sets", default=",".join(SETS), help=f"comma list of {SETS}")
    p.add_argument("--num-prompts", type=int, default=8,
                   help="prompts of the held_out and train sets")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    names = [s for s in args.sets.split(",") if s]
    unknown = [s for s in names if s not in SETS]
    if unknown:
        p.error(f"--sets: unknown {unknown}; allowed {SETS}")
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    started = time.perf_counter()
    llm = LLM(model=args.model, device=args.device, dtype=dtype, max_num_seqs=16)
    model = llm.engine.model
    device = next(model.parameters()).device
    head = DraftHead.load(args.head).to(device=device, dtype=getattr(torch, dtype)).eval()
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    results = {}
    for name, prompts in prompt_sets(names, args.num_prompts).items():
        seqs, starts = generate(llm, prompts, args.max_tokens, 0.0, 0)
        feats = features_of(model, seqs, device)
        whole = held_out_acceptance(head, embed, lm_head, feats, seqs, starts)
        each = [held_out_acceptance(head, embed, lm_head, feats[i:i + 1], seqs[i:i + 1],
                                    starts[i:i + 1])["mean_accepted"]
                for i in range(len(seqs))]
        results[name] = {**whole, "per_prompt_mean_accepted": each}
        print(f"{name:<10} first draft {whole['first_draft']:.3f}, conditional per position "
              f"{[round(x, 3) for x in whole['per_position']]}, mean accepted "
              f"{whole['mean_accepted']:.2f} of 4 ({whole['positions']} positions); per prompt "
              f"{[round(x, 2) for x in each]}")
    doc = {"args": vars(args), "seconds": round(time.perf_counter() - started, 1),
           "device": str(device), "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return doc


if __name__ == "__main__":
    main()
