"""Where an engine run spends its time: one ``LLM.generate`` under the torch profiler.

Prints the wall time, the operators by self time on the host and, on CUDA, the kernels by GPU
time, for the benchmark's prompts (``benchmarks/e2e_workloads.py``) after an untimed warm-up of
the same batch. For reading, not for timing: the profiler slows the host.

    python benchmarks/profile_engine.py --device cuda --model random-llama-8b --batch-size 32
    python benchmarks/profile_engine.py --kind copy --batch-size 1 --method ngram   # CPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.e2e_runs import engine_generate  # noqa: E402
from benchmarks.e2e_workloads import PROMPT_KINDS, build_model, build_prompts  # noqa: E402
from engine import LLM  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--method", default="none", help="none or a proposer (ngram, eagle ...)")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--kind", default="copy", choices=PROMPT_KINDS)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rows", type=int, default=25, help="rows per table")
    p.add_argument("--draft-tree", default=None, help="draft_tree, e.g. 3,2 (eagle methods)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--fixed-k", action="store_true", help="the controller off")
    args = p.parse_args(argv)
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    model, tokenizer = build_model(args.model, args.device, dtype)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    prompts = build_prompts(args.kind, args.batch_size, args.model, tokenizer, vocab_size)
    spec = None if args.method == "none" else {"method": args.method,
                                               "num_speculative_tokens": args.k}
    if spec is not None and args.draft_tree:
        spec["draft_tree"] = [int(b) for b in args.draft_tree.split(",")]
    if spec is not None and args.fixed_k:
        spec["adaptive_k"] = False
    max_model_len = max(map(len, prompts)) + args.max_tokens + args.k + 8
    llm = LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=dtype,
              speculative_config=spec, max_num_seqs=args.batch_size,
              max_model_len=max_model_len, kv_cache_tokens=args.batch_size * max_model_len)
    for _ in range(2):  # warm-up: allocations, kernels, the graphs of this batch's buckets
        engine_generate(llm, prompts, args.max_tokens, args.temperature)
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        outputs = engine_generate(llm, prompts, args.max_tokens, args.temperature)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    tokens = sum(map(len, outputs))
    print(f"{args.model} {dtype} {args.device}, {args.kind} prompts, batch {args.batch_size}, "
          f"method {args.method}: {tokens} tokens in {wall:.3f} s under the profiler")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if cuda:
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
