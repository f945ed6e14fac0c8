"""Step latency of the model runner against a plain Hugging Face forward over a DynamicCache.

For every batch size, each sequence holds ``--context`` cached tokens; a *decode* step appends 1
token per sequence, a *verify* step appends k+1 (last token + k drafts). After each timed step both
caches are cut back to ``--context`` tokens (runner: ``truncate``; HF: slicing its layers), so
every iteration measures the same step; the two are timed alternately, so both see the same
machine load. Also prints the KV bytes per cached token.

    python benchmarks/model_runner.py --device cpu --json runner_cpu.json
    python benchmarks/model_runner.py --device cuda --model random-llama-1b --json runner_gpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.runner.loader import load_model  # noqa: E402
from engine.runner.model_runner import ModelRunner, cache_argument  # noqa: E402

# About Llama-3.2-1B's shapes: 1.24 B parameters.
RANDOM_LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                       vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=4096)


def build_model(name: str, device: str, dtype: str):
    if name == "random-llama-1b":
        torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(LlamaConfig(**RANDOM_LLAMA_1B),
                                                     dtype=torch_dtype, attn_implementation="sdpa")
        return model.eval()
    model, _ = load_model(name, dtype=dtype, device=device)
    return model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_pair(steps, device: torch.device, warmup: int, iters: int) -> list[float]:
    """Median milliseconds of each step function, run alternately so that both see the same
    machine load (synchronized on CUDA)."""
    times: list[list[float]] = [[] for _ in steps]
    for i in range(warmup + iters):
        for step, record in zip(steps, times, strict=True):
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            if i >= warmup:
                record.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(t) for t in times]


def runner_step(model, batch: int, context: int, num_new: int):
    """A runner holding ``batch`` sequences of ``context`` tokens, and one timed step on it."""
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
        assert runner.num_cached_tokens == batch * context  # rollback returned every draft row

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


def profile_steps(model, context: int, k: int, path: Path | None) -> None:
    """torch.profiler over one batch-1 decode and verify step of each system: device kernels
    launched and host milliseconds (the top host ops go to ``path``)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    device = model.get_input_embeddings().weight.device
    print(f"{'profile':>16} {'kernels':>8} {'host ms':>8}")
    tables = []
    for label, num_new in (("decode", 1), (f"verify{k + 1}", k + 1)):
        for system, make in (("runner", runner_step), ("HF", hf_step)):
            step = make(model, 1, context, num_new)
            for _ in range(3):
                step()
            sync(device)
            with profile(activities=activities) as prof:
                with record_function("step"):
                    step()
                sync(device)
            events = prof.key_averages()
            kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
            host_ms = next(e.cpu_time_total for e in events if e.key == "step") / 1e3
            print(f"{system + ' ' + label:>16} {kernels:>8} {host_ms:>8.2f}")
            tables.append(f"== {system} {label}\n" + events.table(
                sort_by="self_cpu_time_total", row_limit=25))
    if path:
        path.write_text("\n".join(tables))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--model", default=None,
                        help="smollm2-135m (CPU default), random-llama-1b (CUDA default), or any "
                             "load_model source")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=int, default=128, help="cached tokens per sequence")
    parser.add_argument("--k", type=int, default=4, help="drafts per verify step (k+1 tokens)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (1 is steadier on a shared machine)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--profile", type=Path, default=None,
                        help="also profile batch-1 steps; write the host-op tables here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    on_cuda = args.device.startswith("cuda")
    name = args.model or ("random-llama-1b" if on_cuda else "smollm2-135m")
    dtype = args.dtype or ("bfloat16" if on_cuda else "float32")
    model = build_model(name, args.device, dtype)
    probe = ModelRunner(model, max_num_seqs=1, max_num_tokens=1, max_model_len=1)
    bytes_per_token = probe.kv_bytes_per_token
    del probe
    device = model.get_input_embeddings().weight.device
    device_name = torch.cuda.get_device_name(device) if on_cuda else "cpu"
    print(f"{name} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M params, {dtype}) "
          f"on {device_name}, {torch.get_num_threads()} threads; context {args.context}; "
          f"KV cache {bytes_per_token} bytes per cached token")
    print(f"{'batch':>5} {'step':>8} {'runner ms':>10} {'HF ms':>8} {'runner/HF':>9}")
    rows = []
    for batch in args.batch_sizes:
        for label, num_new in (("decode", 1), (f"verify{args.k + 1}", args.k + 1)):
            steps = (runner_step(model, batch, args.context, num_new),
                     hf_step(model, batch, args.context, num_new))
            runner_ms, hf_ms = timed_pair(steps, device, args.warmup, args.iters)
            rows.append(dict(batch=batch, step=label, num_new=num_new, runner_ms=runner_ms,
                             hf_ms=hf_ms))
            print(f"{batch:>5} {label:>8} {runner_ms:>10.2f} {hf_ms:>8.2f} "
                  f"{runner_ms / hf_ms:>9.2f}")
    for batch in args.batch_sizes:
        decode, verify = (r["runner_ms"] for r in rows if r["batch"] == batch)
        print(f"batch {batch}: verify{args.k + 1} / decode = {verify / decode:.2f} (runner)")
    if args.profile:
        profile_steps(model, args.context, args.k, args.profile)
    if args.json:
        args.json.write_text(json.dumps(dict(
            model=name, dtype=dtype, device=device_name, context=args.context, k=args.k,
            threads=torch.get_num_threads(), kv_bytes_per_token=bytes_per_token, rows=rows),
            indent=2))


if __name__ == "__main__":
    main()
