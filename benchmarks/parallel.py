"""Tokens/s of one target on one GPU, spread over GPUs by layers (pipeline: accelerate's
``device_map``), and split by tensor parallelism (transformers' ``tp_plan``, one process per GPU),
each with and without speculation; greedy outputs compared across layouts.

One invocation measures one layout (tensor parallelism runs under ``torchrun``, one method per
launch: the other ranks serve one engine, then exit); ``table`` reads
their JSON files and prints the ratios to the one-GPU engine without speculation::

    python benchmarks/parallel.py save --model random-llama-8b --dir /tmp/llama8b
    python benchmarks/parallel.py run --layout single --model /tmp/llama8b --json single.json
    python benchmarks/parallel.py run --layout pipeline --model /tmp/llama8b --json pipeline.json
    for m in none ngram; do torchrun --nproc-per-node 2 benchmarks/parallel.py run --layout tp \\
        --methods $m --model /tmp/llama8b --json tp-$m.json; done
    python benchmarks/parallel.py table single.json pipeline.json tp-none.json tp-ngram.json

``save`` writes a random-weight checkpoint of a real shape (seeded; bfloat16 on CUDA), made
decisive as ``benchmarks/efficiency.py`` makes its target (its output head a permutation of its
embeddings, the layers' output projections zeroed: the same cost), so that the layouts' greedy
outputs can be compared token for token in bf16: on the first two-GPU run, with plain random
weights, near-tied logits made every multi-GPU layout's text differ from one GPU's. With random
weights n-gram drafts are accepted only where the model repeats itself: the speculation columns
measure what speculation costs and keeps across layouts, not what real text would gain.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.e2e_runs import engine_generate  # noqa: E402
from benchmarks.e2e_workloads import (  # noqa: E402
    RANDOM_EOS_ID,
    RANDOM_LLAMAS,
    build_prompts,
    word_tokenizer,
)
from benchmarks.efficiency import decisive  # noqa: E402
from engine import LLM  # noqa: E402

SHAPES = RANDOM_LLAMAS
LAYOUTS = ("single", "pipeline", "tp")
METHODS = ("none", "ngram")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    save = sub.add_parser("save", help="write a random-weight checkpoint")
    save.add_argument("--model", choices=sorted(SHAPES), default="random-llama-8b")
    save.add_argument("--dir", type=Path, required=True)
    run = sub.add_parser("run", help="measure one layout")
    run.add_argument("--layout", choices=LAYOUTS, required=True)
    run.add_argument("--model", required=True, help="a checkpoint directory (``save``) or a name")
    run.add_argument("--json", type=Path, required=True)
    run.add_argument("--batch-sizes", default="1,32")
    run.add_argument("--methods", default=",".join(METHODS))
    run.add_argument("--max-tokens", type=int, default=128)
    run.add_argument("--repeats", type=int, default=3)
    run.add_argument("-k", type=int, default=4, help="n-gram num_speculative_tokens")
    run.add_argument("--max-memory", type=json.loads, default=None,
                     help="pipeline: accelerate's max_memory as JSON, e.g. '{\"0\": \"10GiB\"}'")
    run.add_argument("--device", default=None, help="single: the device (default cuda:0 or cpu)")
    run.add_argument("--enforce-eager", action="store_true",
                     help="no CUDA graphs (the layout is named with -eager)")
    run.add_argument("--no-fused-ops", action="store_true",
                     help="transformers' own RMSNorm and rotary operations (the layout is named "
                          "with -unfused)")
    run.add_argument("--profile", type=Path, default=None,
                     help="after the timed runs, one run of --profile-tokens tokens per batch "
                          "under the torch profiler on rank 0: its tables and trace go here")
    run.add_argument("--profile-tokens", type=int, default=16)
    table = sub.add_parser("table", help="print the ratios of measured layouts")
    table.add_argument("files", nargs="+", type=Path)
    return parser.parse_args(argv)


def save_checkpoint(name: str, out: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    on_gpu = torch.cuda.is_available()
    config = LlamaConfig(**SHAPES[name], max_position_embeddings=4096, bos_token_id=None,
                         eos_token_id=RANDOM_EOS_ID, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda" if on_gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16 if on_gpu else torch.float32)
    # (decisive: greedy margins far above bf16 noise, so that every layout's greedy text can be
    # compared with one GPU's; the same bytes and FLOPs. The exactness of tensor parallelism
    # itself, zeroed projections included, is in tests/engine/runner/test_tensor_parallel.py.)
    decisive(model).save_pretrained(out)
    word_tokenizer(config.vocab_size).save_pretrained(out)
    print(f"wrote {name} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters) "
          f"to {out}")


def layout_kwargs(args: argparse.Namespace) -> dict:
    if args.layout == "single":
        return {"device": args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")}
    if args.layout == "pipeline":
        return {"device": "auto", "max_memory": args.max_memory}
    return {"device": "auto", "tensor_parallel_size": int(os.environ.get("WORLD_SIZE", "1"))}


def where(llm: LLM) -> str:
    """Where the target's weights are: the device map, or the tensor-parallel world."""
    model = llm.llm_engine.model
    if llm.config.tensor_parallel_size > 1:
        return f"tensor parallel over {llm.config.tensor_parallel_size} ranks"
    devices = sorted({str(d) for d in getattr(model, "hf_device_map", {}).values()})
    return f"device_map over {devices}" if devices else str(model.device)


def run_layout(args: argparse.Namespace) -> None:
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    layout = args.layout + ("-capped" if args.layout == "pipeline" and args.max_memory
                            else "")  # (a run with --max-memory is named apart)
    layout += "-eager" if args.enforce_eager else ""
    layout += "-unfused" if args.no_fused_ops else ""
    methods = args.methods.split(",")
    if args.layout == "tp" and len(methods) > 1:
        raise SystemExit("--layout tp measures one method per torchrun launch (the other ranks "
                         "serve one engine, then exit): give --methods none or --methods ngram")
    rows = []
    for method in methods:
        spec = None if method == "none" else {"method": method, "num_speculative_tokens": args.k}
        llm = LLM(args.model, speculative_config=spec, max_num_seqs=max(batch_sizes),
                  max_model_len=512, enforce_eager=args.enforce_eager,
                  fused_ops=not args.no_fused_ops, **layout_kwargs(args))
        placed = where(llm)
        graphs = llm.llm_engine.runner.graphs
        for b in batch_sizes:
            prompts = build_prompts("copy", b, "random-llama-8b", None, llm.llm_engine.vocab_size)
            for _ in range(2):  # warm-up (a bucket is captured the second time it is met)
                outputs = engine_generate(llm, prompts, args.max_tokens)
            captured = 0.0 if graphs is None else graphs.capture_seconds
            seconds = []
            for _ in range(args.repeats):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                start = time.perf_counter()
                outputs = engine_generate(llm, prompts, args.max_tokens)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                seconds.append(time.perf_counter() - start)
            best = min(seconds)
            if args.profile is not None:
                profile_run(llm, prompts, args, f"{layout}-{method}-b{b}")
            stats = llm.llm_engine.metrics
            rows.append({"layout": layout, "method": method, "batch_size": b,
                         "tokens_per_s": b * args.max_tokens / best, "seconds": seconds,
                         "acceptance_rate": stats.num_accepted / stats.num_drafted
                         if stats.num_drafted else None, "placement": placed,
                         "fused": dict(getattr(llm.llm_engine.runner, "fused", {})),
                         "graphs": 0 if graphs is None else graphs.num_graphs,
                         "capture_s_in_timed_runs": 0.0 if graphs is None
                         else graphs.capture_seconds - captured,
                         # (the device time of a step, beside the wall time per step above:
                         # what the host adds)
                         "replay_ms": {} if graphs is None else {
                             "x".join(map(str, key)): 1e3 * s
                             for key, s in graphs.replay_seconds.items()},
                         "outputs": outputs})
            print(f"{layout:<9} {method:<6} batch {b:>3}: "
                  f"{rows[-1]['tokens_per_s']:9.1f} tokens/s ({placed})", flush=True)
        del llm
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    args.json.write_text(json.dumps({"rows": rows, "gpus": gpus, "max_tokens": args.max_tokens,
                                     "torch": torch.__version__}, indent=1))


def profile_run(llm: LLM, prompts: list, args: argparse.Namespace, name: str) -> None:
    """One run under the torch profiler (rank 0; for reading, not timing): the host operators
    and the kernels by time, and a Chrome trace, in ``args.profile``."""
    from torch.profiler import ProfilerActivity, profile

    args.profile.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        engine_generate(llm, prompts, args.profile_tokens)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    averages = prof.key_averages()
    text = [f"{name}: {args.profile_tokens} tokens per prompt, {wall:.4f} s under the profiler"]
    for key in ("self_cpu_time_total", "cpu_time_total") + (
            ("self_device_time_total",) if torch.cuda.is_available() else ()):
        text.append(averages.table(sort_by=key, row_limit=30, max_name_column_width=70))
    (args.profile / f"{name}.txt").write_text("\n".join(text))
    prof.export_chrome_trace(str(args.profile / f"{name}.json.gz"))  # (gzipped by the suffix)


def print_table(files: list[Path]) -> list[dict]:
    rows = [row for f in files for row in json.loads(f.read_text())["rows"]]
    base = {(r["batch_size"], r["method"]): r for r in rows if r["layout"] == "single"}
    print(f"{'layout':<16} {'method':<6} {'batch':>5} {'tok/s':>9} {'vs 1 GPU':>8} "
          f"{'vs 1 GPU none':>13} {'accept':>6} {'=1 GPU':>6}")
    table = []
    for r in rows:
        same = base.get((r["batch_size"], r["method"]))
        plain = base.get((r["batch_size"], "none"))
        entry = {"layout": r["layout"], "method": r["method"], "batch_size": r["batch_size"],
                 "tokens_per_s": r["tokens_per_s"],
                 "vs_single": r["tokens_per_s"] / same["tokens_per_s"] if same else None,
                 "vs_single_none": r["tokens_per_s"] / plain["tokens_per_s"] if plain else None,
                 "acceptance_rate": r["acceptance_rate"],
                 "outputs_equal_single": None if same is None else r["outputs"] == same[
                     "outputs"]}
        table.append(entry)
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        print(f"{r['layout']:<16} {r['method']:<6} {r['batch_size']:>5} {r['tokens_per_s']:>9.1f} "
              f"{fmt(entry['vs_single']):>8} {fmt(entry['vs_single_none']):>13} "
              f"{fmt(entry['acceptance_rate']):>6} {str(entry['outputs_equal_single']):>6}")
    return table


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "save":
        save_checkpoint(args.model, args.dir)
    elif args.command == "run":
        run_layout(args)
    else:
        print_table(args.files)


if __name__ == "__main__":
    main()
