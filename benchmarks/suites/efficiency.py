"""How much of the ideal speedup the engine keeps: an oracle proposer of set acceptance.

The oracle (``benchmarks/oracle.py``) drafts the target's own greedy continuation, computed
first by the engine without speculation, each draft right with probability alpha and wrong
otherwise, for free. Then for each (batch, alpha, policy), one row:

- speedup: tokens/s over the engine without speculation, same prompts, timed right before and
  right after the policy (the mean of the two: on a noisy machine a ratio holds only between
  runs close in time); every tokens/s is the median of ``--repeats`` runs timed one by one;
- ideal: expected tokens per step ``E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)`` over the
  step-cost ratio ``c(k)`` that alpha = 0 measures (every draft rejected: one token per step of
  k + 1 scored tokens, so ``c(k)`` = plain tokens/s over alpha-0 tokens/s); for the adaptive
  policy, the best k's ideal;
- efficiency = speedup / ideal;
- ideal at the batch's end and its efficiency: each run is one closed batch, so it lasts until
  its *slowest* sequence is done, and its prefill costs the same with or without drafts. An
  engine whose steps cost exactly what alpha = 0 measures takes ``P + (T0 - P) D(alpha, k) /
  D(0)`` seconds: ``P`` a run of one token per prompt (timed), ``T0`` the alpha-0 run, ``D`` the
  mean decode steps until every sequence of the batch has all its tokens (:func:`batch_steps`;
  ``D(0) = max_tokens - 1``). What this efficiency misses is the speculative path's own cost.

Policies: every fixed k (``--ks``) and the goodput controller (``adaptive``, at most the largest
k). ``--drift``: see ``efficiency_drift.py``. A random target is made decisive
(``models.decisive``) so that the oracle stays in sync in bf16; every run's output is checked
token for token against the plain engine's.

    python -m benchmarks efficiency --device cpu --batch-sizes 1,8 --alphas 0.5,0.9 --ks 1,2,4
    python -m benchmarks efficiency --device cuda --model random-llama-1b --batch-sizes 1,8,32
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks import models
from benchmarks.engines import release
from benchmarks.oracle import ORACLE
from benchmarks.record import Result
from benchmarks.suites.efficiency_drift import run_drift
from benchmarks.suites.efficiency_runs import engine, median_rate, timed
from engine import SamplingParams
from scheduler import expected_tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    models.add_model_arguments(parser, "random-llama-tiny")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--alphas", default="0.5,0.9")
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--drift", action="store_true")
    parser.add_argument("--no-fused-ops", action="store_true",
                        help="transformers' own RMSNorm and rotary operations (CUDA)")


def batch_steps(alpha: float, k: int, max_tokens: int, batch: int, trials: int = 4000,
                seed: int = 0) -> float:
    """Mean decode steps until each of ``batch`` sequences has ``max_tokens`` tokens (the
    prefill gives the first), each step verifying ``k`` drafts accepted i.i.d. with probability
    ``alpha`` up to the first rejection, never past ``max_tokens``."""
    rng = np.random.default_rng(seed)
    left = np.full((trials, batch), max_tokens - 1)  # [trials, batch] tokens still to come
    steps = np.zeros(trials)  # [trials]
    while (left > 0).any():
        accepted = np.cumprod(rng.random((trials, batch, k)) < alpha, axis=2).sum(axis=2)
        steps += (left > 0).any(axis=1)
        left = np.maximum(left - 1 - accepted, 0)
    return float(steps.mean())


def prompts_for(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    return [torch.randint(3, vocab, (32,), generator=g).tolist() for _ in range(batch)]


def run(args: argparse.Namespace) -> Result:
    models.resolve(args)
    args.batches = [int(b) for b in args.batch_sizes.split(",")]
    args.alphas = [float(a) for a in args.alphas.split(",")]
    args.ks = [int(k) for k in args.ks.split(",")]
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    if args.model in models.RANDOM_LLAMAS:
        model = models.decisive(model)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    plain = engine(model, tokenizer, args, None)
    rows, drift = [], []
    for batch in args.batches:
        prompts = prompts_for(batch, models.vocab_size(model))
        rows += batch_rows(args, model, tokenizer, plain, prompts, params)
        if args.drift:
            drift.append(run_drift(model, tokenizer, args, prompts, params,
                                   rows[-1]["plain_tokens_per_s"], batch))
    return Result(rows, args.model, {"drift": drift})


def batch_rows(args, model, tokenizer, plain, prompts: list[list[int]],
               params: SamplingParams) -> list[dict]:
    """Every (alpha, policy) at one batch size, each policy between two plain timings."""
    batch = len(prompts)
    base_tps, want, _, _ = timed(plain, prompts, params, args.repeats)
    ORACLE.references = [p + w for p, w in zip(prompts, want, strict=True)]
    one_token = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    prefill_s = batch / timed(plain, prompts, one_token, args.repeats)[0]  # P: one token
    plain_before = median_rate(plain, prompts, params, args.repeats)[0]
    cost, alpha0_s, rows = {}, {}, []
    for alpha in [0.0, *args.alphas]:
        ORACLE.alpha = alpha
        for k in [*args.ks, None]:
            policy = "adaptive" if k is None else f"k={k}"
            llm = engine(model, tokenizer, args, max(args.ks) if k is None else k,
                         adaptive=k is None)
            tps, got, (captures, capture_s), steps = timed(llm, prompts, params, args.repeats)
            release(llm)
            # the plain engine right before and right after this policy
            plain_after = median_rate(plain, prompts, params, args.repeats)[0]
            base_tps, plain_before = (plain_before + plain_after) / 2, plain_after
            if got != want:
                raise RuntimeError(f"batch {batch}, alpha {alpha}, {policy}: the output "
                                   "differs from the plain engine's")
            run_tokens = batch * args.max_tokens
            if alpha == 0.0 and k is not None:
                cost[k] = base_tps / tps  # a step of k drafts over a plain step
                alpha0_s[k] = run_tokens / tps  # T0: one run at alpha 0
            ks = args.ks if k is None else [k]
            ideal = max(expected_tokens(alpha, j) / cost[j] for j in ks)
            ideal_end = max(run_tokens / base_tps / (
                prefill_s + (alpha0_s[j] - prefill_s)
                * batch_steps(alpha, j, args.max_tokens, batch) / (args.max_tokens - 1))
                for j in ks)
            speedup = tps / base_tps
            rows.append(dict(batch=batch, alpha=alpha, policy=policy, tokens_per_s=tps,
                             speedup=speedup, ideal=ideal, efficiency=speedup / ideal,
                             ideal_end=ideal_end, efficiency_end=speedup / ideal_end,
                             prefill_s=prefill_s, captures=captures, capture_s=capture_s,
                             plain_tokens_per_s=base_tps, **steps))
            print_row(rows[-1])
    return rows


def print_row(r: dict) -> None:
    print(f"batch {r['batch']:3d} alpha {r['alpha']:4.2f} {r['policy']:9s} "
          f"{r['tokens_per_s']:9.1f} tok/s  speedup {r['speedup']:5.2f}  ideal {r['ideal']:5.2f}"
          f"  efficiency {r['efficiency']:5.2f}  at the batch's end: ideal "
          f"{r['ideal_end']:5.2f}  efficiency {r['efficiency_end']:5.2f}  {r['steps']} steps, "
          f"drafts in {r['drafting_request_steps']} sequence steps, {r['mean_drafts']:.2f} each"
          + (f"  ({r['captures']} graph captures, {r['capture_s']:.2f} s, timed)"
             if r["captures"] else "")
          + (f"  costs by width {r['controller_costs']}, engine acceptance "
             f"{r['engine_acceptance']}" if "controller_costs" in r else ""), flush=True)
