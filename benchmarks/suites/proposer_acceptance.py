"""Proposer acceptance on real prompts (``acceptance``), and how often the target's first N
layers agree with it (``early-exit``).

``acceptance``: greedy speculative decoding of the short tasks of ``workloads.TASKS`` (copy,
edit, code, open), batch 1, on the runner directly: acceptance rate (accepted / drafted), mean
tokens per target step, and whether the output equals the target's plain greedy output.

``early-exit``: teacher-forced along the target's own greedy continuation of each task, the
share of positions where the first N layers' argmax is the target's greedy token: the per-token
acceptance alpha of greedy early-exit drafting (k = 1), for every N at the cost of one truncated
forward each.

    python -m benchmarks proposers acceptance --device cpu
    python -m benchmarks proposers early-exit --threads 1 --sweep-layers 16,20,24,26,28
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import models
from benchmarks.engines import hf_generate
from benchmarks.record import Result
from benchmarks.suites.proposer_cost import (
    GREEDY,
    add_proposer_arguments,
    make_proposer,
    methods_of,
    prepare,
)
from benchmarks.workloads import TASKS, chat_ids
from engine.runner.model_runner import ModelRunner
from proposers import ProposeRequest
from proposers.early_exit import early_exit_model


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default=",".join(TASKS), help=f"comma list of {list(TASKS)}")
    p.add_argument("--new-tokens", type=int, default=48)


def add_acceptance_arguments(p: argparse.ArgumentParser) -> None:
    add_proposer_arguments(p)
    add_task_arguments(p)


def add_early_exit_arguments(p: argparse.ArgumentParser) -> None:
    models.add_model_arguments(p, "smollm2-135m")
    add_task_arguments(p)
    p.add_argument("--sweep-layers", default="8,16,20,24,26,28",
                   help="early-exit depths N, comma list")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")


def greedy_speculative(target, proposer, prompt: list[int], k: int, max_new: int):
    """Greedy speculative decoding, batch 1: (new tokens, drafted, accepted, steps)."""
    runner = ModelRunner(target, 1, len(prompt) + max_new + k + 2, len(prompt) + max_new + k + 2)
    slot = runner.allocate_slot()
    tokens = list(prompt)
    tokens.append(int(runner.forward([slot], [prompt], [len(prompt) - 1]).logits[0].argmax()))
    drafted = accepted = steps = 0
    while len(tokens) - len(prompt) < max_new:
        want = min(k, max_new - (len(tokens) - len(prompt)) - 1)
        drafts = proposer.propose([ProposeRequest(0, tokens, want, GREEDY)]).draft_token_ids[0]
        best = runner.forward([slot], [[tokens[-1]] + drafts]).logits.argmax(dim=-1).tolist()
        n = 0
        while n < len(drafts) and drafts[n] == best[n]:
            n += 1
        runner.truncate(slot, len(tokens) + n)
        proposer.on_accepted(0, len(tokens) + n)
        tokens += drafts[:n] + [best[n]]
        drafted, accepted, steps = drafted + len(drafts), accepted + n, steps + 1
    proposer.remove(0)
    return tokens[len(prompt):], drafted, accepted, steps


def plain_greedy(target, prompt: list[int], max_new: int) -> list[int]:
    """The target's own greedy continuation (Hugging Face ``generate``, past EOS as the
    speculative loop goes)."""
    return hf_generate(target, [prompt], 0, max_new, target.device)[0]


def tasks(args: argparse.Namespace):
    """(target, tokenizer, [(task, prompt ids, the target's greedy answer)])."""
    target, tokenizer = models.build_model(args.model, args.device, args.dtype)
    out = []
    for kind in args.prompts.split(","):
        prompt = chat_ids(tokenizer, TASKS[kind])
        out.append((kind, prompt, plain_greedy(target, prompt, args.new_tokens)))
    return target, out


def run_acceptance(args: argparse.Namespace) -> Result:
    prepare(args)
    target, work = tasks(args)
    random_weights = args.model in models.RANDOM_LLAMAS
    rows = []
    for kind, prompt, reference in work:
        for method in methods_of(args, random_weights):
            proposer = make_proposer(method, target, random_weights, args, 1, 4096)
            start = time.perf_counter()
            out, drafted, accepted, steps = greedy_speculative(target, proposer, prompt, args.k,
                                                               args.new_tokens)
            elapsed = time.perf_counter() - start
            rate = accepted / drafted if drafted else 0.0
            rows.append(dict(prompt=kind, method=method, k=args.k, drafted=drafted,
                             accepted=accepted, acceptance_rate=rate, steps=steps,
                             tokens_per_step=len(out) / steps, seconds=elapsed,
                             equals_greedy=out == reference))
            print(f"{kind:5s} {method:14s} acceptance {rate:6.1%}  tokens/step "
                  f"{len(out) / steps:5.2f}  {elapsed:6.1f} s  equals greedy {out == reference}",
                  flush=True)
    return Result(rows, args.model)


def run_early_exit(args: argparse.Namespace) -> Result:
    models.resolve(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, work = tasks(args)
    rows = []
    for kind, prompt, reference in work:
        ids = torch.tensor([prompt + reference[:-1]], device=target.device)
        want = torch.tensor(reference, device=target.device)
        for n in (int(x) for x in args.sweep_layers.split(",")):
            with torch.inference_mode():
                logits = early_exit_model(target, n)(input_ids=ids).logits[0, len(prompt) - 1:]
            alpha = (logits.argmax(dim=-1) == want).float().mean().item()
            rows.append(dict(prompt=kind, num_layers=n, alpha=alpha, tokens=len(reference)))
            print(f"{kind:5s} early exit N={n:2d}  alpha {alpha:6.1%}", flush=True)
    return Result(rows, args.model)
