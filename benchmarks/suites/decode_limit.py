"""Plain decoding against the hardware: tokens/s beside the weight-plus-KV read limit.

For each (batch, context) one engine runs ``batch`` requests whose prompts are ``context``
random tokens; once every request is past its prefill, ``--steps`` decode steps are timed (a
synchronisation before and after), after a first pass of the same requests that captures every
CUDA graph they meet. The limit is what the step must read, once, at the
machine's measured memory bandwidth: the weights (the output head's matrix included, the input
embedding left out unless tied: a decode step reads a few of its rows) and every sequence's
cached keys and values, at the bandwidth a device-to-device copy of ``COPY_BYTES`` measures
(read plus write). On CUDA a few more steps run under PyTorch's profiler: the kernels' time per
step is the GPU's busy time, and the rest of the step's wall time its *idle* time
(``host_critical_ms_per_step``), split into the gaps under ``SHORT_GAP_US`` between one kernel
and the next (a CUDA graph's launch gaps: at batch 1 most of the idle time) and the rest, the
*host on the critical path* (``host_wait_ms_per_step``: the GPU waiting for the host's
scheduling, launches, sampling, bookkeeping). With
``--methods`` the same is measured with speculation on (tokens/s then counts accepted drafts;
``--fixed-k``: every step asks for k drafts, no controller);
with ``--attention-backends gather,paged`` each cell runs once per attention backend (the
KV cache gathered for SDPA, or read in place by the paged kernel).

    python -m benchmarks decode_limit --device cuda --model random-llama-8b
    python -m benchmarks decode_limit --device cuda --model smollm2-135m --batch-sizes 1,8,32,64
    python -m benchmarks decode_limit --device cpu --model random-llama-tiny --quick
    python -m benchmarks decode_limit --device cuda --attention-backends gather,paged
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from benchmarks import models
from benchmarks.engines import release, speculative_config
from benchmarks.record import Result
from benchmarks.timing import sync
from engine import LLM, SamplingParams

COPY_BYTES = 1 << 30  # the bandwidth probe's buffer
COPY_REPEATS = 10  # copies timed together (device events) ...
COPY_TRIALS = 5  # ... the best of this many
PREFILL_CHUNK = 2048  # EngineConfig.max_num_batched_tokens: the prefill's tokens per step
PROFILE_STEPS = 8  # steps under the profiler after the timed ones (CUDA)
# Gaps between device activities shorter than this are launch gaps (a CUDA graph's kernels
# follow each other well under a microsecond apart: docs/performance.md), not the host.
SHORT_GAP_US = 1.0
SPEC_K = 4  # drafts a step with --methods


def output_tokens(batch: int, context: int, steps: int) -> int:
    """``max_tokens`` for a cell: the first sequences decode while the last ones prefill (about
    ``batch * context / PREFILL_CHUNK`` steps), and every sequence must still be decoding in
    all the timed and profiled steps after that (else fewer than ``batch`` sequences run)."""
    return -(-batch * context // PREFILL_CHUNK) + steps + PROFILE_STEPS + 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    models.add_model_arguments(p, "random-llama-1b")
    p.add_argument("--batch-sizes", default="1,8,32,64")
    p.add_argument("--contexts", default="256,2048,8192",
                   help="prompt tokens per request (cut to the model's context length)")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per cell")
    p.add_argument("--methods", default="", help="comma list: also with these speculation "
                                                 "methods (e.g. ngram), k = 4")
    p.add_argument("--fixed-k", action="store_true",
                   help="with --methods: every step asks for k drafts (no controller), so that "
                        "the host time is a drafting step's own, not its mix with plain steps "
                        "and probes")
    p.add_argument("--attention-backends", default="auto",
                   help="comma list of EngineConfig.attention_backend values to run each cell "
                        "with (auto: the engine's default; gather, paged)")
    p.add_argument("--async-scheduling", default="default",
                   help="comma list of default, on, off: EngineConfig.async_scheduling for each "
                        "run (overlapped plain steps; default: the engine's choice)")
    p.add_argument("--quick", action="store_true", help="smoke run: batch 1, 2; context 32")


def copy_bandwidth(device: torch.device) -> float | None:
    """Bytes per second a device-to-device copy moves (read plus write): ``COPY_REPEATS``
    copies of ``COPY_BYTES`` back to back between two events (the device's clock: a host clock
    around one copy of half a millisecond also counted the synchronisation, which moved the
    limit by several percent between runs), the best of ``COPY_TRIALS`` (None on CPU: no limit
    is computed there)."""
    if device.type != "cuda":
        return None
    best = float("inf")
    with torch.cuda.device(device):  # (events and copies on that device, whichever is current)
        src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)  # (a first copy: nothing timed waits for a first launch)
        for _ in range(COPY_TRIALS):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(COPY_REPEATS):
                dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / COPY_REPEATS)
        del src, dst
    return 2 * COPY_BYTES / best


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads of the weights: every parameter once, less an untied input
    embedding (a step reads only its batch's rows of it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if emb.data_ptr() != head.data_ptr():
        total -= emb.numel() * emb.element_size()
    return total


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * element


def kernel_seconds(prof: torch.profiler.profile) -> tuple[float, int]:
    """The kernels' device time in a profile (self times: nothing counted twice) and how many
    device activities (kernels, copies) ran."""
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0.0) > 0]
    return sum(e.self_device_time_total for e in events) / 1e6, sum(e.count for e in events)


def short_gaps(spans: list[tuple[float, float]]) -> float:
    """Seconds of the gaps under ``SHORT_GAP_US`` between device activities ``spans`` ((start,
    end) in µs, any order; overlapping ones leave no gap): what back-to-back kernels leave
    between them, a CUDA graph's launch to launch, not the device waiting for the host."""
    total, end = 0.0, None
    for start, stop in sorted(spans):
        if end is not None and 0.0 < start - end < SHORT_GAP_US:
            total += start - end
        end = stop if end is None else max(end, stop)
    return total / 1e6


def device_spans(prof: torch.profiler.profile) -> list[tuple[float, float]]:
    """(start, end) in µs of every device activity in a profile."""
    return [(e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]


def decode_steps(llm: LLM, prompts: list[list[int]], steps: int, device: torch.device,
                 profile_steps: int, per_step: int = 1
                 ) -> tuple[float, int, tuple[float, float, float] | None]:
    """(seconds of ``steps`` timed decode steps, tokens they produced, kernel seconds, kernels
    and seconds of short gaps between them per step under the profiler or None) for
    ``prompts`` run together; ``per_step``:
    the most tokens a step may give a sequence (speculation: k + 1), so that every sequence is
    still decoding in the profiled steps."""
    engine = llm.engine
    total = output_tokens(len(prompts), len(prompts[0]), steps) * per_step
    params = SamplingParams(temperature=0.0, max_tokens=total, ignore_eos=True)
    seqs = [s for i, p in enumerate(prompts)
            for s in engine.add_request(f"d{i}", None, p, params, together=True)]
    while any(s.num_tokens - s.num_prompt_tokens < 2 for s in seqs):  # prefills, a first step
        engine.step()
    for _ in range(2):  # (a decode bucket's graph is captured on its second step)
        engine.step()
    before = sum(s.num_tokens for s in seqs)
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(device)
    seconds = time.perf_counter() - start
    made = sum(s.num_tokens for s in seqs) - before
    busy = None
    if profile_steps and device.type == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(profile_steps):
                engine.step()
            sync(device)
        seconds_busy, kernels = kernel_seconds(prof)
        busy = (seconds_busy / profile_steps, kernels / profile_steps,
                short_gaps(device_spans(prof)) / profile_steps)
    for i in range(len(prompts)):
        engine.discard_request(f"d{i}")
    return seconds, made, busy


def run(args: argparse.Namespace) -> Result:
    args = models.resolve(args)
    device = torch.device(args.device)
    if args.quick:
        args.batch_sizes, args.contexts, args.steps = "1,2", "32", 4
    batches = [int(b) for b in args.batch_sizes.split(",")]
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    wanted = [int(c) for c in args.contexts.split(",")]
    most_out = output_tokens(max(batches), max(wanted), args.steps) * (
        SPEC_K + 1 if any(m for m in args.methods.split(",")) else 1)
    if args.model in models.RANDOM_LLAMAS:  # (random weights: any context the shape allows)
        model.config.max_position_embeddings = max(wanted) + most_out + 8
    limit_len = model.config.max_position_embeddings
    contexts = sorted({min(c, limit_len - most_out - 8) for c in wanted})
    bandwidth = copy_bandwidth(device)
    weights, per_token = weight_bytes(model), kv_bytes_per_token(model)
    vocab = models.vocab_size(model)
    rows = []
    overlaps = {"default": None, "on": True, "off": False}
    runs = [(method, backend, overlap)
            for method in ["none", *[m for m in args.methods.split(",") if m]]
            for backend in args.attention_backends.split(",")
            for overlap in args.async_scheduling.split(",")]
    for method, backend, overlap in runs:
        max_len = max(contexts) + most_out + 8
        llm = LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=args.dtype,
                  speculative_config=speculative_config(method, SPEC_K,
                                                        adaptive=not args.fixed_k),
                  max_num_seqs=max(batches),
                  max_model_len=max_len, kv_cache_tokens=max(batches) * max_len,
                  max_num_batched_tokens=PREFILL_CHUNK,
                  attention_backend=backend, async_scheduling=overlaps[overlap])
        rng = random.Random(0)  # (every method and backend decodes the same prompts)
        for context in contexts:
            for b in batches:
                prompts = [[rng.randrange(2, vocab) for _ in range(context)] for _ in range(b)]
                # (a first pass captures every graph the timed steps meet: the key lengths
                # they grow into, the widths a controller picks, the head's layouts)
                decode_steps(llm, prompts, args.steps, device, 0,
                             1 if method == "none" else SPEC_K + 1)
                seconds, made, profiled = decode_steps(
                    llm, prompts, args.steps, device, PROFILE_STEPS if device.type == "cuda" else 0,
                    1 if method == "none" else SPEC_K + 1)
                busy, kernels, gaps = (None, None, None) if profiled is None else profiled
                step_s = seconds / args.steps
                row = {"method": method, "fixed_k": args.fixed_k, "attention_backend": backend,
                       "async_scheduling": llm.engine.overlap, "batch_size": b,
                       "context": context,
                       "tokens_per_s": made / seconds, "ms_per_step": 1e3 * step_s,
                       "tokens_per_step": made / args.steps,  # (batch: all decode each step)
                       "gpu_busy_ms_per_step": None if busy is None else 1e3 * busy,
                       "kernels_per_step": kernels,
                       "host_critical_ms_per_step": None if busy is None
                       else 1e3 * max(step_s - busy, 0.0),
                       # (of which the gaps between back-to-back kernels; the rest is the
                       # device waiting for the host)
                       "kernel_gaps_ms_per_step": None if gaps is None else 1e3 * gaps,
                       "host_wait_ms_per_step": None if busy is None
                       else 1e3 * max(step_s - busy - gaps, 0.0)}
                if bandwidth is not None:
                    read = weights + b * (context + args.steps) * per_token
                    limit_step = read / bandwidth
                    row.update(read_bytes=read, limit_ms_per_step=1e3 * limit_step,
                               limit_tokens_per_s=b / limit_step,
                               of_limit=(b / step_s) / (b / limit_step) if method == "none"
                               else None, step_over_limit=step_s / limit_step)
                rows.append(row)
                print_row(row)
        release(llm)
    return Result(rows, args.model, {"copy_bandwidth_bytes_per_s": bandwidth,
                                     "weight_bytes": weights, "kv_bytes_per_token": per_token})


def print_row(r: dict) -> None:
    def f(key: str, fmt: str) -> str:
        return "-" if r.get(key) is None else format(r[key], fmt)

    print(f"{r['method']:<8} {r['attention_backend']:<6} "
          f"{'overlap' if r.get('async_scheduling') else 'sync':<7} b={r['batch_size']:<3} "
          f"ctx={r['context']:<5} "
          f"{r['tokens_per_s']:9.1f} tok/s  {r['ms_per_step']:7.3f} ms/step  "
          f"limit {f('limit_ms_per_step', '.3f')} ms ({f('of_limit', '.0%')} of it)  "
          f"GPU busy {f('gpu_busy_ms_per_step', '.3f')} ms ({f('kernels_per_step', '.0f')} "
          f"kernels)  GPU idle {f('host_critical_ms_per_step', '.3f')} ms (gaps between "
          f"kernels {f('kernel_gaps_ms_per_step', '.3f')}, waiting for the host "
          f"{f('host_wait_ms_per_step', '.3f')})", flush=True)
