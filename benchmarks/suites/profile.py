"""Where an engine run spends its time: one ``LLM.generate`` under the torch profiler.

Prints the wall time, the operators by self time on the host and, on CUDA, the kernels by GPU
time, for the workload's prompts after two untimed runs of the same batch. For reading, not for
timing: the profiler slows the host. One row: tokens and seconds under the profiler (with
``--json``, the tables too).

    python -m benchmarks profile --device cuda --model random-llama-8b --batch-size 32
    python -m benchmarks profile --device cpu --kind copy --batch-size 1 --method ngram
"""

from __future__ import annotations

import argparse

from torch.profiler import ProfilerActivity, profile

from benchmarks import models
from benchmarks.engines import engine_generate, speculative_config
from benchmarks.record import Result
from benchmarks.timing import timed
from benchmarks.workloads import PROMPT_KINDS, build_prompts
from engine import LLM


def add_arguments(p: argparse.ArgumentParser) -> None:
    models.add_model_arguments(p, "smollm2-135m")
    p.add_argument("--method", default="none", help="none or a proposer (ngram, eagle ...)")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--kind", default="copy", choices=PROMPT_KINDS)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rows", type=int, default=25, help="rows per table")
    p.add_argument("--draft-tree", default=None, help="draft_tree, e.g. 3,2 (eagle methods)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--fixed-k", action="store_true", help="the controller off")


def run(args: argparse.Namespace) -> Result:
    models.resolve(args)
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    prompts = build_prompts(args.kind, args.batch_size, args.model, tokenizer,
                            models.vocab_size(model))
    method = args.method
    if args.draft_tree and method != "none" and not method.endswith("_tree"):
        method += "_tree"
    spec = speculative_config(method, args.k, args.draft_tree, adaptive=not args.fixed_k)
    max_model_len = max(map(len, prompts)) + args.max_tokens + args.k + 8
    llm = LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=args.dtype,
              speculative_config=spec, max_num_seqs=args.batch_size,
              max_model_len=max_model_len, kv_cache_tokens=args.batch_size * max_model_len)
    for _ in range(2):  # warm-up: allocations, kernels, the graphs of this batch's buckets
        engine_generate(llm, prompts, args.max_tokens, args.temperature)
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        outputs, wall, _ = timed(lambda: engine_generate(llm, prompts, args.max_tokens,
                                                         args.temperature), args.device)
    tokens = sum(map(len, outputs))
    print(f"{args.model} {args.dtype} {args.device}, {args.kind} prompts, batch "
          f"{args.batch_size}, method {args.method}: {tokens} tokens in {wall:.3f} s under the "
          "profiler")
    tables = {"host": prof.key_averages().table(sort_by="self_cpu_time_total",
                                                row_limit=args.rows)}
    if cuda:
        tables["device"] = prof.key_averages().table(sort_by="self_cuda_time_total",
                                                     row_limit=args.rows)
    for table in tables.values():
        print(table)
    return Result([{"method": args.method, "batch_size": args.batch_size, "tokens": tokens,
                    "seconds": wall}], args.model, tables)
