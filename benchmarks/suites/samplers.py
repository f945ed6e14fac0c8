"""Microseconds per verification call, logits-to-probabilities included, against the memory floor.

The floor is the time to read the target logits (and the draft probs, when given) once at the
copy bandwidth measured in the same run (a device-to-device ``copy_`` of 1 GiB, read + write).
On CUDA each call is timed with ``triton.testing.do_bench`` (median, L2 flushed between calls),
both eagerly (host launch overhead included) and as a replayed CUDA graph. ``--seeded``: every
request seeded (keyed sampling, ``samplers.keyed_random``). One row per (vocab, batch, draft
probs or not).

    python -m benchmarks samplers --device cuda --json samplers.json
    python -m benchmarks samplers --device cpu --quick [--seeded]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.models import default_device
from benchmarks.record import Result
from samplers import SamplingTensors, SpecDecodeMetadata, get_sampler
from samplers.sampling_params import SamplingParams

GIB = 1 << 30


def time_us(fn, device: torch.device, repeats: int = 5) -> float:
    """Median microseconds of ``fn()``."""
    if device.type == "cuda":
        import triton.testing

        return 1000.0 * triton.testing.do_bench(fn, return_mode="median")
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1e6 * statistics.median(samples)


def graph_us(fn, device: torch.device) -> float | None:
    """Median microseconds of one replay of ``fn`` captured as a CUDA graph."""
    if device.type != "cuda":
        return None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_us(graph.replay, device)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return 2 * nbytes / (time_us(lambda: dst.copy_(src), device) * 1e-6)


def build_case(batch: int, vocab: int, k: int, with_probs: bool, device: torch.device,
               seeded: bool = False):
    gen = torch.Generator(device="cpu").manual_seed(0)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen).tolist()
    metadata = SpecDecodeMetadata.from_lists(drafts, device)
    logits = torch.randn(metadata.num_rows, vocab, device=device)  # [num_tokens + batch, vocab]
    draft_probs = None
    if with_probs:
        draft_probs = torch.softmax(torch.randn(metadata.num_tokens, vocab, device=device), -1)
    seeds = list(range(batch)) if seeded else None
    sampling = SamplingTensors.from_params([SamplingParams(temperature=1.0)] * batch, None,
                                           device, seeds=seeds,
                                           positions=[100] * batch if seeded else None)
    return metadata, logits, draft_probs, sampling


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--sampler", default="rejection", help="registered sampler name")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 49152, 128256, 151936])
    parser.add_argument("-k", "--k", type=int, default=4, help="drafts per request")
    parser.add_argument("--quick", action="store_true", help="a few small shapes (CPU smoke run)")
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timing")
    parser.add_argument("--seeded", action="store_true",
                        help="every request seeded (keyed sampling, samplers.keyed_random)")


def run(args: argparse.Namespace) -> Result:
    device = torch.device(args.device)
    if args.quick:
        args.batch, args.vocab = [1, 8], [32000]
    bandwidth = copy_bandwidth(device, GIB if device.type == "cuda" else 64 << 20)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sampler = get_sampler(args.sampler)
    rows = []
    header = (f"{'batch':>5} {'vocab':>6} {'k':>2} {'draft_probs':>11} {'eager_us':>9} "
              f"{'graph_us':>9} {'floor_us':>9} {'floor/best':>10}")
    print(f"device: {name}; copy bandwidth {bandwidth / 1e9:.0f} GB/s; sampler {args.sampler}"
          f"{'; seeded requests' if args.seeded else ''}")
    print(header)
    for vocab in args.vocab:
        for batch in args.batch:
            for with_probs in (False, True):
                metadata, logits, draft_probs, sampling = build_case(
                    batch, vocab, args.k, with_probs, device, args.seeded)

                def call(metadata=metadata, logits=logits, draft_probs=draft_probs,
                         sampling=sampling):
                    return sampler.verify(logits, metadata, sampling, draft_probs)

                eager = time_us(call, device)
                graph = None if args.no_graph else graph_us(call, device)
                nbytes = logits.numel() * logits.element_size()
                if draft_probs is not None:
                    nbytes += draft_probs.numel() * draft_probs.element_size()
                floor = 1e6 * nbytes / bandwidth
                best = min(eager, graph) if graph is not None else eager
                row = dict(batch=batch, vocab=vocab, k=args.k, draft_probs=with_probs,
                           eager_us=round(eager, 2),
                           graph_us=None if graph is None else round(graph, 2),
                           floor_us=round(floor, 2), floor_fraction=round(floor / best, 3),
                           bytes_read_floor=nbytes)
                rows.append(row)
                graph_s = "-" if graph is None else f"{graph:9.1f}"
                print(f"{batch:>5} {vocab:>6} {args.k:>2} {str(with_probs):>11} {eager:9.1f} "
                      f"{graph_s:>9} {floor:9.1f} {floor / best:10.3f}")
                del metadata, logits, draft_probs, sampling
    return Result(rows, None, {"sampler": args.sampler, "seeded": args.seeded,
                               "copy_bandwidth_bytes_per_s": bandwidth})
