"""The parallel suite's layouts: one target on one GPU (``single``), spread over GPUs by layers
(``pipeline``: accelerate's ``device_map``, ``--max-memory`` caps a GPU), or split by tensor
parallelism (``tp``: transformers' ``tp_plan``, one process per GPU under torchrun, one method
per launch: the other ranks serve rank 0's engine, then exit), each with and without n-gram
speculation; and ``save``: a random-weight checkpoint of a real shape (seeded; bf16 on CUDA),
made decisive (``models.decisive``) so that the layouts' greedy outputs can be compared token for
token in bf16. With random weights n-gram drafts are accepted only where the model repeats
itself: the speculation rows measure what speculation costs across layouts, not what real text
would gain. One row per (layout, method, batch): tokens/s (best of ``--repeats``), the outputs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from benchmarks.engines import engine_generate
from benchmarks.models import RANDOM_LLAMAS, decisive, random_config, word_tokenizer
from benchmarks.record import Result
from benchmarks.timing import timed
from benchmarks.workloads import build_prompts
from engine import LLM

LAYOUTS = ("single", "pipeline", "tp")
METHODS = ("none", "ngram")


def add_save_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=sorted(RANDOM_LLAMAS), default="random-llama-8b")
    p.add_argument("--dir", type=Path, required=True)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", choices=LAYOUTS, required=True)
    p.add_argument("--model", required=True, help="a checkpoint directory (``save``) or a name")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("-k", type=int, default=4, help="n-gram num_speculative_tokens")
    p.add_argument("--max-memory", type=json.loads, default=None,
                   help="pipeline: accelerate's max_memory as JSON, e.g. '{\"0\": \"10GiB\"}'")
    p.add_argument("--device", default=None, help="single: the device (default cuda:0 or cpu)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs (the layout is named with -eager)")
    p.add_argument("--no-fused-ops", action="store_true",
                   help="transformers' own RMSNorm and rotary operations (the layout is named "
                        "with -unfused)")
    p.add_argument("--profile", type=Path, default=None,
                   help="after the timed runs, one run of --profile-tokens tokens per batch "
                        "under the torch profiler on rank 0: its tables and trace go here")
    p.add_argument("--profile-tokens", type=int, default=16)


def run_save(args: argparse.Namespace) -> None:
    save_checkpoint(args.model, args.dir)


def save_checkpoint(name: str, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    on_gpu = torch.cuda.is_available()
    config = random_config(name)
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


def layout_name(args: argparse.Namespace) -> str:
    """The layout, named apart with --max-memory (``-capped``), -eager and -unfused."""
    layout = args.layout + ("-capped" if args.layout == "pipeline" and args.max_memory else "")
    layout += "-eager" if args.enforce_eager else ""
    return layout + ("-unfused" if args.no_fused_ops else "")


def run_layout(args: argparse.Namespace) -> Result:
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    layout = layout_name(args)
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
        for b in batch_sizes:
            prompts = build_prompts("copy", b, "random-llama-8b", None,
                                    llm.llm_engine.vocab_size)
            rows.append({"layout": layout, "method": method, "batch_size": b,
                         **measure(llm, prompts, args)})
            if args.profile is not None:
                profile_run(llm, prompts, args, f"{layout}-{method}-b{b}")
            print(f"{layout:<9} {method:<6} batch {b:>3}: {rows[-1]['tokens_per_s']:9.1f} "
                  f"tokens/s ({rows[-1]['placement']})", flush=True)
        del llm
    return Result(rows, args.model, {"max_tokens": args.max_tokens})


def measure(llm: LLM, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Tokens/s of the prompts (the best of ``--repeats`` timed runs after two warm-ups),
    where the weights are, the graphs, and the outputs (compared across layouts)."""
    engine = llm.llm_engine
    graphs = engine.runner.graphs
    for _ in range(2):  # warm-up (a bucket is captured the second time it is met)
        engine_generate(llm, prompts, args.max_tokens)
    captured = 0.0 if graphs is None else graphs.capture_seconds
    runs = [timed(lambda: engine_generate(llm, prompts, args.max_tokens), llm.engine.device)
            for _ in range(args.repeats)]
    stats = engine.metrics
    return {"tokens_per_s": len(prompts) * args.max_tokens / min(s for _, s, _ in runs),
            "seconds": [s for _, s, _ in runs],
            "acceptance_rate": stats.num_accepted / stats.num_drafted
            if stats.num_drafted else None, "placement": where(llm),
            "fused": dict(getattr(engine.runner, "fused", {})),
            "graphs": 0 if graphs is None else graphs.num_graphs,
            "capture_s_in_timed_runs": 0.0 if graphs is None
            else graphs.capture_seconds - captured,
            # (the device time of a step, beside the wall time per step above: what the host
            # adds)
            "replay_ms": {} if graphs is None else {
                "x".join(map(str, key)): 1e3 * s for key, s in graphs.replay_seconds.items()},
            "outputs": runs[-1][0]}


def profile_run(llm: LLM, prompts: list, args: argparse.Namespace, name: str) -> None:
    """One run under the torch profiler (rank 0; for reading, not timing): the host operators
    and the kernels by time, and a Chrome trace, in ``args.profile``."""
    from torch.profiler import ProfilerActivity, profile

    args.profile.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        wall = timed(lambda: engine_generate(llm, prompts, args.profile_tokens),
                     llm.engine.device)[1]
    averages = prof.key_averages()
    text = [f"{name}: {args.profile_tokens} tokens per prompt, {wall:.4f} s under the profiler"]
    for key in ("self_cpu_time_total", "cpu_time_total") + (
            ("self_device_time_total",) if torch.cuda.is_available() else ()):
        text.append(averages.table(sort_by=key, row_limit=30, max_name_column_width=70))
    (args.profile / f"{name}.txt").write_text("\n".join(text))
    prof.export_chrome_trace(str(args.profile / f"{name}.json.gz"))  # (gzipped by the suffix)


