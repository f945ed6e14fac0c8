"""n-gram lookup alone, at scale: ``--ngram-batch`` requests of ``--ngram-context`` tokens.

Steady state: each step every request gains 1 to k + 1 tokens (a random accepted run plus its
bonus), drawn from a bank of 64 phrases of 8 tokens so that matches occur. Reported: the first
call (it indexes every context), and the median and minimum step in wall time and in this
process's CPU time (what the step costs when it does not wait for a busy core; the minimum:
when other processes did not evict its caches either). No model is loaded.

    python -m benchmarks proposers ngram-scale --threads 1
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from benchmarks.record import Result
from proposers import ProposeRequest
from proposers.ngram import NgramProposer
from samplers.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--ngram-batch", type=int, default=256)
    p.add_argument("--ngram-context", type=int, default=4000)
    p.add_argument("--ngram-steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="64 requests x 1,000 tokens, 20 steps")


def run(args: argparse.Namespace) -> Result:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.ngram_batch, args.ngram_context, args.ngram_steps = 64, 1000, 20
    rng = random.Random(0)
    bank = [[rng.randrange(49152) for _ in range(8)] for _ in range(64)]

    def grow(context: list[int], n: int) -> None:
        while n > 0:
            piece = rng.choice(bank)[:n]
            context.extend(piece)
            n -= len(piece)

    contexts = []
    for _ in range(args.ngram_batch):
        contexts.append([])
        grow(contexts[-1], args.ngram_context)
    proposer = NgramProposer(prompt_lookup_min=1, prompt_lookup_max=4)
    start = time.perf_counter()
    proposer.propose([ProposeRequest(i, c, args.k, GREEDY) for i, c in enumerate(contexts)])
    index_s = time.perf_counter() - start
    times, cpu_times, drafted = [], [], 0
    for step in range(args.warmup + args.ngram_steps):
        for context in contexts:
            grow(context, rng.randrange(1, args.k + 2))
        requests = [ProposeRequest(i, c, args.k, GREEDY) for i, c in enumerate(contexts)]
        start, cpu_start = time.perf_counter(), time.process_time()
        proposal = proposer.propose(requests)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        drafted += proposal.num_tokens if step >= args.warmup else 0
    times, cpu_times = sorted(times[args.warmup:]), sorted(cpu_times[args.warmup:])
    row = dict(batch=args.ngram_batch, context_len=args.ngram_context, k=args.k,
               first_call_ms=index_s * 1e3, median_step_ms=statistics.median(times) * 1e3,
               min_step_ms=times[0] * 1e3,
               median_step_cpu_ms=statistics.median(cpu_times) * 1e3,
               min_step_cpu_ms=cpu_times[0] * 1e3,
               drafts_per_request=drafted / args.ngram_steps / args.ngram_batch)
    print(f"ngram {args.ngram_batch} requests x {args.ngram_context} tokens: first call "
          f"{index_s * 1e3:.0f} ms, step median {row['median_step_ms']:.3f} ms wall "
          f"(min {row['min_step_ms']:.3f}), {row['median_step_cpu_ms']:.3f} ms CPU "
          f"(min {row['min_step_cpu_ms']:.3f}); {row['drafts_per_request']:.2f} drafts/request",
          flush=True)
    return Result([row])
