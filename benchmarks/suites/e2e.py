"""End-to-end throughput: the engine with and without speculation, beside HF ``generate``.

Greedy decoding (or sampled, ``--temperature``), the same prompts and the same number of tokens
for every system, all in one process, the systems taking turns group by group so that a change
in the machine's load hits them alike. Copy-heavy prompts edit or quote text given in the prompt;
open-ended ones do not. One row per (system, kind, batch size).

    python -m benchmarks e2e --device cpu --json e2e_cpu.json        # CPU, default model
    python -m benchmarks e2e --quick                                 # smoke run
    python -m benchmarks e2e --device cuda --model random-llama-1b --batch-sizes 1,8,32
    python -m benchmarks e2e --methods ngram,eagle --oracle ...      # the best fixed k beside
    python -m benchmarks e2e --prompt-set real --kinds open,copy,multi_turn   # held-out split

``--oracle`` adds, for every method, the engine with each fixed k in 1..k (``adaptive_k`` off;
k = 0 is the engine without speculation), so that each (method, kind, batch) cell has its best
fixed k measured in the same run, with the real proposer's costs, and the controller is judged
against it (``oracle`` in the summary). ``--prompt-set real``: the held-out split of the
real-text workload (``benchmarks/real_text/``).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch

from benchmarks import models
from benchmarks.engines import (
    COMPILED,
    controller_state,
    engine_generate,
    hf_generate,
    one_off_costs,
    speculative_config,
)
from benchmarks.record import Result
from benchmarks.suites.e2e_table import (
    RunResult,
    check_targets,
    oracle_rows,
    print_oracle,
    print_positions,
    print_table,
    rows_of,
)
from benchmarks.timing import timed
from benchmarks.workloads import PROMPT_SETS, build_prompts, text_prompts
from engine import LLM

# "eager": the engine without speculation and without CUDA graphs (enforce_eager=True)
METHODS = ("ngram", "early_exit", "eagle", "ngram_eagle", "draft_model", "eager",
           "eagle_tree", "ngram_eagle_tree", "eagle3", "eagle3_tree")  # (*_tree: --draft-tree)


def add_arguments(p: argparse.ArgumentParser) -> None:
    models.add_model_arguments(p, "smollm2-135m")
    p.add_argument("--draft-model", help="draft for method draft_model (only run when given)")
    p.add_argument("--methods", default="ngram,early_exit",
                   help="comma list of " + ",".join(METHODS))
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4, dest="k")
    p.add_argument("--num-early-exit-layers", type=int, default=None)
    p.add_argument("--fixed-k", action="store_true",
                   help="every step verifies k drafts (adaptive_k off): the proposer alone")
    p.add_argument("--oracle", action="store_true",
                   help="also run every method at each fixed k in 1..k (adaptive_k off): the "
                        "best fixed k per (method, kind, batch), beside the controller")
    p.add_argument("--eagle-head", default=None,
                   help="draft head directory for method eagle (default: the shipped head)")
    p.add_argument("--eagle3-head", default=None,
                   help="EAGLE-3 head (speculators directory) for method eagle3 (needed by it)")
    p.add_argument("--draft-tree", default="3,2",
                   help="candidates per node at each depth for the *_tree methods (draft_tree)")
    p.add_argument("--batch-sizes", default=None, help="comma list (default 1,32; --quick 1,4)")
    p.add_argument("--kinds", default="copy,open",
                   help="comma list of the prompt set's kinds (real: open, copy, multi_turn, "
                        "or one kind: story, explain, factual, code_write, code_edit, quote)")
    p.add_argument("--prompt-set", default="bench", choices=PROMPT_SETS,
                   help="whose prompts: benchmarks/workloads.py's (bench), "
                        "examples/prompt_sets.py's, or the real-text workload's held-out split")
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
                   help="smoke run: 1 prompt per kind at batch 1, 16 tokens per prompt")


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Validate and complete the arguments (``SystemExit`` naming the bad one)."""
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"--methods: unknown method {m!r}; allowed: {', '.join(METHODS)}")
    if args.temperature and not args.no_hf:
        raise SystemExit("--temperature > 0 needs --no-hf (the Hugging Face rows are greedy)")
    if "draft_model" in methods and not args.draft_model:
        raise SystemExit("--methods draft_model needs --draft-model")
    if any(m.startswith("eagle3") for m in methods) and not args.eagle3_head:
        raise SystemExit("--methods eagle3 needs --eagle3-head")
    if args.draft_model and "draft_model" not in methods:
        methods.append("draft_model")
    if args.waves < 1:
        raise SystemExit(f"--waves {args.waves} is invalid: allowed an integer >= 1")
    args.methods = methods
    args.batch_sizes = [int(b) for b in (args.batch_sizes or
                                         ("1,4" if args.quick else "1,32")).split(",")]
    args.kinds = args.kinds.split(",")
    for kind in args.kinds:
        try:
            text_prompts(kind, args.prompt_set)
        except ValueError as e:
            raise SystemExit(f"--kinds: {e}") from None
    if args.quick:
        args.num_prompts, args.max_tokens = 1, 16
    return models.resolve(args)


def method_config(args: argparse.Namespace, method: str) -> dict | None:
    """The speculative config of system ``method``: a method name, or ``method@kJ`` (the
    oracle's: that method with a fixed k of J)."""
    method, _, fixed = method.partition("@k")
    options = {}
    if method == "early_exit" and args.num_early_exit_layers is not None:
        options["num_early_exit_layers"] = args.num_early_exit_layers
    if method == "draft_model":
        options["model"] = args.draft_model
    if method.removesuffix("_tree") in ("eagle", "ngram_eagle") and args.eagle_head:
        options["model"] = args.eagle_head
    if method.removesuffix("_tree") == "eagle3":
        options["model"] = args.eagle3_head
    if fixed:
        return speculative_config(method, int(fixed), args.draft_tree, False, **options)
    return speculative_config(method, args.k, args.draft_tree, not args.fixed_k, **options)


def system_names(args: argparse.Namespace) -> list[str]:
    """The engines of the run: none, each method, and with ``--oracle`` each method at each
    fixed k (``method@kJ``)."""
    names = ["none", *args.methods]
    if args.oracle:
        names += [f"{m}@k{j}" for m in args.methods if m != "eager" for j in range(1, args.k + 1)]
    return names


def system_k(args: argparse.Namespace, name: str) -> int:
    if name in ("none", "eager"):
        return 0
    return int(name.partition("@k")[2] or args.k)


def systems_for(args, llms: dict, model, pad_id: int, kind: str, b: int,
                device: torch.device) -> dict:
    """name -> (its RunResult, generate(prompts) -> outputs) for one kind and batch size."""
    systems = {method: (RunResult("engine", method, kind, b, system_k(args, method)),
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
    return systems


def measure(args, llms: dict, model, pad_id: int, kind: str, b: int,
            prompts: list[list[int]], device: torch.device) -> list[RunResult]:
    """Every system on ``prompts`` in groups of ``b`` (``waves * b`` at batch b > 1, at most b
    running at once), taking turns group by group."""
    group_size = b * args.waves if b > 1 else b
    for llm in llms.values():  # the engines' concurrency: b (they are built for the largest)
        llm.engine.scheduler.max_num_seqs = b
    systems = systems_for(args, llms, model, pad_id, kind, b, device)
    # Untimed warm-up of every system on every group it is timed on (allocator growth, kernels
    # compiled for their shapes, every CUDA graph their steps meet: the runner's by context
    # bucket, the draft head's, the device proposers'), so that no system pays those costs
    # inside a timed run; captures and Triton compiles that still happen there are counted
    # (graph_captures, triton_compiles and their seconds: every one of the process while that
    # system ran).
    for _ in range(args.warmup_rounds):
        for start in range(0, len(prompts), group_size):
            for _, generate in systems.values():
                timed(partial(generate, prompts[start:start + group_size]), device)
    for llm in llms.values():
        llm.reset_metrics()
    for _ in range(args.repeats):
        began = {name: run.seconds for name, (run, _) in systems.items()}
        for start in range(0, len(prompts), group_size):
            group = prompts[start:start + group_size]
            for run, generate in systems.values():
                before, compiled = one_off_costs(), len(COMPILED)
                run.add(*timed(partial(generate, group), device))
                after = one_off_costs()
                run.graph_captures += after[0] - before[0]
                run.capture_seconds += after[1] - before[1]
                run.triton_compiles += after[2] - before[2]
                run.compile_seconds += after[3] - before[3]
                run.compiled_kernels += COMPILED[compiled:]
        for name, (run, _) in systems.items():
            run.round_seconds.append(run.seconds - began[name])
    for method, llm in llms.items():
        note_engine(systems[method][0], llm, b)
    for run, _ in systems.values():
        captures = (f" ({run.graph_captures} graph captures, {run.capture_seconds:.2f} s)"
                    if run.graph_captures else "")
        if run.triton_compiles:
            captures += (f" ({run.triton_compiles} Triton compiles, {run.compile_seconds:.2f} s:"
                         f" {'; '.join(run.compiled_kernels)})")
        if run.steal is not None:
            captures += f" (steal {run.steal:.0%})"
        print(f"  {kind} b={b} {run.name}: {run.tokens_per_s:.1f} tok/s{captures}",
              file=sys.stderr)
    return [run for run, _ in systems.values()]


def note_engine(run: RunResult, llm: LLM, b: int) -> None:
    """The engine's steps, acceptance and controller state over the timed runs."""
    metrics = llm.get_metrics()
    run.engine_steps, run.step_seconds = metrics.num_steps, round(metrics.elapsed_s, 4)
    if run.method in ("none", "eager"):
        return
    run.acceptance_rate = metrics.acceptance_rate
    run.mean_accepted_length = metrics.mean_accepted_length
    if metrics.num_drafted:
        run.acceptance_per_position = [round(r, 4) for r in metrics.acceptance_per_position]
        run.mean_k = metrics.mean_k
    run.controller = controller_state(llm, b)


def run(args: argparse.Namespace) -> Result:
    args = check(args)
    device = torch.device(args.device)
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    vocab_size = models.vocab_size(model)
    max_batch = max(args.batch_sizes)
    prompts = {(kind, b): build_prompts(kind, args.num_prompts if b == 1 else b * args.waves,
                                        args.model, tokenizer, vocab_size, args.prompt_set)
               for kind in args.kinds for b in args.batch_sizes}
    longest = max(len(p) for group in prompts.values() for p in group)
    max_model_len = longest + args.max_tokens + args.k + 8
    llms = {method: LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=args.dtype,
                        speculative_config=method_config(args, method),
                        enforce_eager=args.enforce_eager or method == "eager",
                        fused_ops=not args.no_fused_ops, max_num_seqs=max_batch,
                        max_model_len=max_model_len,
                        kv_cache_tokens=max_batch * max_model_len)
            for method in system_names(args)}
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
    decoding = f"temperature {args.temperature}" if args.temperature else "greedy"
    print(f"\nmodel {args.model} ({args.dtype}) on {args.device}, {decoding}, "
          f"{args.max_tokens} tokens per prompt, k = {args.k}, prompt set {args.prompt_set}")
    if args.model in models.RANDOM_LLAMAS:
        print("note: random weights: the output ignores the prompt's meaning, so n-gram "
              "acceptance depends on the prompts and on the model's own repetition loops.")
    rows = rows_of(results)
    print_table(rows)
    print_positions(rows)
    oracle = print_oracle(oracle_rows(results)) if args.oracle else None
    targets = check_targets(results, on_gpu=device.type == "cuda", k=args.k)
    return Result(rows, args.model, {"targets": targets, "oracle": oracle,
                                     "prompt_set": args.prompt_set})
