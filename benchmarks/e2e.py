"""End-to-end throughput: the engine with and without speculation, beside HF ``generate``.

Greedy decoding, the same prompts and the same number of tokens for every system, all in one run
so the ratios are fair; prints a table, checks the targets of issue 5 (printed, never asserted)
and writes JSON. Copy-heavy prompts edit or quote text given in the prompt; open-ended ones do not.

    python benchmarks/e2e.py --json e2e_cpu.json                   # CPU, default model (~10 min)
    python benchmarks/e2e.py --quick                               # smoke test (~1 min)
    python benchmarks/e2e.py --device cuda --dtype bfloat16 --model random-llama-1b \\
        --batch-sizes 1,8,32 --json e2e_gpu_1b.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.e2e_runs import (  # noqa: E402
    RunResult,
    controller_state,
    engine_generate,
    graph_stats,
    hf_generate,
    timed,
)
from benchmarks.e2e_targets import check_targets, print_positions, print_table  # noqa: E402
from benchmarks.e2e_workloads import RANDOM_LLAMAS, build_model, build_prompts  # noqa: E402
from engine import LLM  # noqa: E402

# "eager": the engine without speculation and without CUDA graphs (enforce_eager=True)
METHODS = ("ngram", "early_exit", "eagle", "ngram_eagle", "draft_model", "eager",
           "eagle_tree", "ngram_eagle_tree")  # (*_tree: the method with --draft-tree)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m",
                   help=f"smollm2-135m, a path or hub id, or one of {sorted(RANDOM_LLAMAS)}")
    p.add_argument("--draft-model", help="draft for method draft_model (only run when given)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--methods", default="ngram,early_exit",
                   help="comma list of " + ",".join(METHODS))
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4, dest="k")
    p.add_argument("--num-early-exit-layers", type=int, default=None)
    p.add_argument("--fixed-k", action="store_true",
                   help="every step verifies k drafts (adaptive_k off): the proposer alone")
    p.add_argument("--eagle-head", default=None,
                   help="draft head directory for method eagle (default: the shipped head)")
    p.add_argument("--draft-tree", default="3,2",
                   help="candidates per node at each depth for the *_tree methods (draft_tree)")
    p.add_argument("--batch-sizes", default=None, help="comma list (default 1,32; --quick 1,4)")
    p.add_argument("--kinds", default="copy,open")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per kind at batch 1")
    p.add_argument("--waves", type=int, default=1,
                   help="at batch b > 1, give each run waves * b prompts with at most b running "
                        "at once (continuous batching refills a finished request's place), so "
                        "that a batch's end weighs less in the time (1: b prompts, one batch)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--repeats", type=int, default=1, help="rounds over the prompts (summed)")
    p.add_argument("--warmup-rounds", type=int, default=2,
                   help="untimed runs of every system at each batch size before timing")
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the engine's sampling temperature (0: greedy; sampled runs need "
                        "--no-hf: Hugging Face runs greedy)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="every engine without CUDA graphs (method 'eager' adds one such row)")
    p.add_argument("--no-fused-ops", action="store_true",
                   help="every engine with transformers' own RMSNorm and rotary operations")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1 prompt per kind at batch 1, 16 tokens per prompt")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    for m in args.methods:
        if m not in METHODS:
            p.error(f"--methods: unknown method {m!r}; allowed: {', '.join(METHODS)}")
    if args.temperature and not args.no_hf:
        p.error("--temperature > 0 needs --no-hf (the Hugging Face rows are greedy)")
    if "draft_model" in args.methods and not args.draft_model:
        p.error("--methods draft_model needs --draft-model")
    if args.draft_model and "draft_model" not in args.methods:
        args.methods.append("draft_model")
    if args.waves < 1:
        p.error(f"--waves {args.waves} is invalid: allowed an integer >= 1")
    batch_sizes = args.batch_sizes or ("1,4" if args.quick else "1,32")
    args.batch_sizes = [int(b) for b in batch_sizes.split(",")]
    args.kinds = args.kinds.split(",")
    if args.quick:
        args.num_prompts, args.max_tokens = 1, 16
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    return args


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def speculative_config(args: argparse.Namespace, method: str) -> dict | None:
    if method in ("none", "eager"):
        return None
    spec = {"method": method.removesuffix("_tree"), "num_speculative_tokens": args.k}
    if method.endswith("_tree"):
        spec["draft_tree"] = [int(b) for b in args.draft_tree.split(",")]
    if args.fixed_k:
        spec["adaptive_k"] = False
    if method == "early_exit" and args.num_early_exit_layers is not None:
        spec["num_early_exit_layers"] = args.num_early_exit_layers
    if method == "draft_model":
        spec["model"] = args.draft_model
    if spec["method"] in ("eagle", "ngram_eagle") and args.eagle_head:
        spec["model"] = args.eagle_head
    return spec


def measure(args: argparse.Namespace, llms: dict, model, pad_id: int, kind: str, b: int,
            prompts: list[list[int]], device: torch.device) -> list[RunResult]:
    """Every system on ``prompts`` in groups of ``b`` (``waves * b`` at batch b > 1, at most b
    running at once), taking turns group by group."""
    group_size = b * args.waves if b > 1 else b
    for llm in llms.values():  # the engines' concurrency: b (they are built for the largest)
        llm.engine.scheduler.max_num_seqs = b
    systems = {method: (RunResult("engine", method, kind, b,
                                  0 if method in ("none", "eager") else args.k),
                        lambda g, llm=llm: engine_generate(llm, g, args.max_tokens,
                                                           args.temperature))
               for method, llm in llms.items()}
    if not args.no_hf:
        systems["hf"] = (RunResult("hf", "none", kind, b, 0),
                         lambda g: [out for i in range(0, len(g), b) for out in hf_generate(
                             model, g[i:i + b], pad_id, args.max_tokens, device)])
        if b == 1:
            systems["hf_pl"] = (RunResult("hf", "prompt_lookup", kind, b, args.k),
                                lambda g: hf_generate(model, g, pad_id, args.max_tokens, device,
                                                      prompt_lookup=args.k))
    # Untimed warm-up of every system at this batch size (allocator growth, kernels compiled
    # for its shapes, the engine's CUDA graphs: a bucket is captured on its second step), so
    # that no system pays those costs inside a timed run; captures that still happen there are
    # counted in the JSON (graph_captures, capture_seconds).
    for _ in range(args.warmup_rounds):  # (a whole group: waves meet prefill shapes of theirs)
        for _, generate in systems.values():
            timed(generate, prompts[:group_size], device)
    for llm in llms.values():
        llm.reset_metrics()
    graphs_before = {method: graph_stats(llm) for method, llm in llms.items()}
    for _ in range(args.repeats):
        for start in range(0, len(prompts), group_size):
            group = prompts[start:start + group_size]
            for run, generate in systems.values():
                run.add(*timed(generate, group, device))
    for method, llm in llms.items():
        run = systems[method][0]
        count, seconds = graph_stats(llm)
        run.graph_captures = count - graphs_before[method][0]
        run.capture_seconds = seconds - graphs_before[method][1]
        if method not in ("none", "eager"):
            metrics = llm.get_metrics()
            run.acceptance_rate = metrics.acceptance_rate
            run.mean_accepted_length = metrics.mean_accepted_length
            if metrics.num_drafted:
                run.acceptance_per_position = [round(r, 4)
                                               for r in metrics.acceptance_per_position]
                run.mean_k = metrics.mean_k
            run.controller = controller_state(llm, b)
    for run, _ in systems.values():
        captures = (f" ({run.graph_captures} graph captures, {run.capture_seconds:.2f} s)"
                    if run.graph_captures else "")
        if run.steal is not None:
            captures += f" (steal {run.steal:.0%})"
        print(f"  {kind} b={b} {run.name}: {run.tokens_per_s:.1f} tok/s{captures}",
              file=sys.stderr)
    return [run for run, _ in systems.values()]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    model, tokenizer = build_model(args.model, args.device, args.dtype)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    max_batch = max(args.batch_sizes)
    prompts = {(kind, b): build_prompts(kind, args.num_prompts if b == 1 else b * args.waves,
                                        args.model, tokenizer, vocab_size)
               for kind in args.kinds for b in args.batch_sizes}
    longest = max(len(p) for group in prompts.values() for p in group)
    max_model_len = longest + args.max_tokens + args.k + 8
    llms = {method: LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=args.dtype,
                        speculative_config=speculative_config(args, method),
                        enforce_eager=args.enforce_eager or method == "eager",
                        fused_ops=not args.no_fused_ops, max_num_seqs=max_batch,
                        max_model_len=max_model_len,
                        kv_cache_tokens=max_batch * max_model_len)
            for method in ["none", *args.methods]}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    warm = prompts[(args.kinds[0], args.batch_sizes[0])][:1]
    for llm in llms.values():  # warm-up: allocations, kernels, caches
        engine_generate(llm, warm, 8)
    if not args.no_hf:
        hf_generate(model, warm, pad_id, 8, device)

    results: list[RunResult] = []
    for kind in args.kinds:
        for b in args.batch_sizes:
            results += measure(args, llms, model, pad_id, kind, b, prompts[(kind, b)], device)
    machine = {"device": args.device,
               "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                               else cpu_name()),
               "cpu_count": os.cpu_count(),
               "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
               "python": platform.python_version()}
    decoding = f"temperature {args.temperature}" if args.temperature else "greedy"
    print(f"\nmodel {args.model} ({args.dtype}) on {machine['device_name']}, {decoding}, "
          f"{args.max_tokens} tokens per prompt, k = {args.k}")
    if args.model in RANDOM_LLAMAS:
        print("note: random weights: the output ignores the prompt's meaning, so n-gram "
              "acceptance depends on the prompts and on the model's own repetition loops.")
    rows = print_table(results)
    print_positions(results)
    targets = check_targets(results, on_gpu=device.type == "cuda", k=args.k)
    if args.json:
        doc = {"args": vars(args), "machine": machine, "results": rows, "targets": targets,
               "runs": [r.record() for r in results]}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
