"""Step latency of the model runner against a plain Hugging Face forward over a DynamicCache.

For every batch size, each sequence holds ``--context`` cached tokens; a *decode* step appends 1
token per sequence, a *verify* step appends k + 1 (last token + k drafts). After each timed step
both caches are cut back to ``--context`` tokens (runner: ``truncate``; HF: slicing its layers),
so every iteration measures the same step; the two take turns. Also reports the KV bytes per
cached token, and with ``--profile PATH`` each system's kernels and host time at batch 1.

    python -m benchmarks runner vs-hf --device cpu
    python -m benchmarks runner vs-hf --device cuda --model random-llama-1b
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import DynamicCache

from benchmarks import models
from benchmarks.record import Result
from benchmarks.timing import seconds_of, sync, take_turns
from engine.runner.executor import cache_argument
from engine.runner.model_runner import ModelRunner


def add_arguments(parser: argparse.ArgumentParser) -> None:
    models.add_model_arguments(parser, None)
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--context", type=int, default=128, help="cached tokens per sequence")
    parser.add_argument("-k", type=int, default=4, help="drafts per verify step (k + 1 tokens)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (1 is steadier on a shared machine)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="also profile batch-1 steps; write the host-op tables here")


def runner_step(model, batch: int, context: int, num_new: int):
    """A runner holding ``batch`` sequences of ``context`` tokens, and one step on it."""
    runner = ModelRunner(model, max_num_seqs=batch, max_num_tokens=batch * (context + num_new),
                         max_model_len=context + num_new)
    gen = torch.Generator().manual_seed(batch)
    vocab = model.config.vocab_size
    slots = [runner.allocate_slot() for _ in range(batch)]
    runner.forward(slots, torch.randint(vocab, (batch, context), generator=gen).tolist())
    new = torch.randint(vocab, (batch, num_new), generator=gen).tolist()

    def step():
        runner.forward(slots, new)
        for slot in slots:
            runner.truncate(slot, context)

    return step


def hf_step(model, batch: int, context: int, num_new: int):
    """The same with a plain Hugging Face forward over a DynamicCache."""
    device = model.get_input_embeddings().weight.device
    gen = torch.Generator().manual_seed(batch)
    vocab = model.config.vocab_size
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.randint(vocab, (batch, context), generator=gen).to(device),
              use_cache=True, **{cache_argument(model.base_model): cache})
    new = torch.randint(vocab, (batch, num_new), generator=gen).to(device)

    @torch.inference_mode()
    def step():
        model(input_ids=new, use_cache=True, **{cache_argument(model.base_model): cache})
        for layer in cache.layers:  # roll back (DynamicCache.crop's sign convention changed)
            layer.keys, layer.values = layer.keys[:, :, :context], layer.values[:, :, :context]

    return step


SYSTEMS = {"runner": runner_step, "HF": hf_step}


def profile_steps(model, context: int, k: int, path: Path) -> list[dict]:
    """torch.profiler over one batch-1 decode and verify step of each system: device kernels
    launched and host milliseconds (the top host ops go to ``path``)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    device = model.get_input_embeddings().weight.device
    rows, tables = [], []
    for label, num_new in (("decode", 1), (f"verify{k + 1}", k + 1)):
        for system, make in SYSTEMS.items():
            step = make(model, 1, context, num_new)
            for _ in range(3):
                step()
            sync(device)
            with profile(activities=activities) as prof:
                with record_function("step"):
                    step()
                sync(device)
            events = prof.key_averages()
            rows.append({"system": system, "step": label,
                         "kernels": sum(e.count for e in events if e.device_type.name == "CUDA"),
                         "host_ms": next(e.cpu_time_total for e in events
                                         if e.key == "step") / 1e3})
            print(f"profile {system} {label}: {rows[-1]['kernels']} kernels, "
                  f"{rows[-1]['host_ms']:.2f} host ms")
            tables.append(f"== {system} {label}\n" + events.table(
                sort_by="self_cpu_time_total", row_limit=25))
    path.write_text("\n".join(tables))
    return rows


def run(args: argparse.Namespace) -> Result:
    if args.threads:
        torch.set_num_threads(args.threads)
    on_cuda = args.device.startswith("cuda")
    args.model = args.model or ("random-llama-1b" if on_cuda else "smollm2-135m")
    models.resolve(args)
    model, _ = models.build_model(args.model, args.device, args.dtype)
    bytes_per_token = ModelRunner(model, max_num_seqs=1, max_num_tokens=1,
                                  max_model_len=1).kv_bytes_per_token
    device = model.get_input_embeddings().weight.device
    print(f"{args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M params, "
          f"{args.dtype}) on {args.device}, {torch.get_num_threads()} threads; context "
          f"{args.context}; KV cache {bytes_per_token} bytes per cached token")
    print(f"{'batch':>5} {'step':>8} {'runner ms':>10} {'HF ms':>8} {'runner/HF':>9}")
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        for label, num_new in (("decode", 1), (f"verify{args.k + 1}", args.k + 1)):
            steps = {name: make(model, batch, args.context, num_new)
                     for name, make in SYSTEMS.items()}
            ms = take_turns(lambda name, steps=steps: 1e3 * seconds_of(steps[name], device),
                            steps, args.warmup, args.iters)
            rows.append(dict(batch=batch, step=label, num_new=num_new, runner_ms=ms["runner"],
                             hf_ms=ms["HF"], runner_over_hf=ms["runner"] / ms["HF"]))
            print(f"{batch:>5} {label:>8} {ms['runner']:>10.2f} {ms['HF']:>8.2f} "
                  f"{ms['runner'] / ms['HF']:>9.2f}")
    summary = {"kv_bytes_per_token": bytes_per_token, "threads": torch.get_num_threads()}
    if args.profile:
        summary["profile"] = profile_steps(model, args.context, args.k, args.profile)
    return Result(rows, args.model, summary)
