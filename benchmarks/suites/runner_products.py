"""A few rows through a weight: cuBLAS (``torch.nn.functional.linear``) against the few-rows
product kernel (``engine.runner.gemv``), by weight shape and row count.

What ``linear`` routes where comes from this: for each weight shape ``[N, K]`` (``--shapes``;
the default: the four stacked products of a layer of the default model, then of the 1B LLaMA)
and each row count (``--rows``), ``--layers`` distinct weights of that shape (so the weights
are read from memory, as a forward's layers are, not from the cache) are multiplied by
``x [rows, K]`` one after another inside one CUDA graph, and the graph's replay is timed (the
best of ``--repeats`` medians of ``--iters`` replays between device events). A row: the shape,
the rows, microseconds a product for each, and the kernel's over cuBLAS's. CUDA, bf16 only.

    python -m benchmarks runner products --rows 1,2,3,4
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.record import Result
from engine.runner.gemv import GEMV_MAX_ROWS, gemv

DEFAULT_SHAPES = ("960x576,576x576,3072x576,576x1536,"  # the default model's layer
                  "3072x2048,2048x2048,16384x2048,2048x8192")  # the 1B LLaMA's


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of NxK weight shapes")
    p.add_argument("--rows", default="1,2,3,4",
                   help=f"comma list of row counts (the kernel takes up to {GEMV_MAX_ROWS})")
    p.add_argument("--layers", type=int, default=16, help="distinct weights a graph multiplies")
    p.add_argument("--iters", type=int, default=50, help="replays a timing")
    p.add_argument("--repeats", type=int, default=5, help="timings; the best median counts")


def graph_us(product, x: torch.Tensor, weights: list[torch.Tensor], iters: int,
             repeats: int) -> float:
    """Microseconds a product: ``product(x, w)`` for every one of ``weights`` in turn, captured
    in one CUDA graph, its replays timed between device events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in weights:  # (warm-up: Triton compiles, cuBLAS picks its kernels)
            product(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            product(x, w)
    best = float("inf")
    for _ in range(repeats):
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / len(weights))
        best = min(best, statistics.median(times))
    return best


def run(args: argparse.Namespace) -> Result:
    if not torch.cuda.is_available():
        raise SystemExit("runner products times CUDA graphs: it needs a CUDA device")
    rows_list = [int(r) for r in args.rows.split(",")]
    if max(rows_list) > GEMV_MAX_ROWS or min(rows_list) < 1:
        raise SystemExit(f"--rows {args.rows}: allowed 1 .. {GEMV_MAX_ROWS}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows_out = []
    for shape in args.shapes.split(","):
        n_out, n_in = (int(v) for v in shape.split("x"))
        weights = [torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16,
                               generator=gen) * 0.02 for _ in range(args.layers)]
        for rows in rows_list:
            x = torch.randn(rows, n_in, device="cuda", dtype=torch.bfloat16, generator=gen)

            cublas = graph_us(torch.nn.functional.linear, x, weights, args.iters,
                              args.repeats)
            kernel = graph_us(gemv, x, weights, args.iters, args.repeats)
            rows_out.append({"shape": shape, "rows": rows, "cublas_us": round(cublas, 3),
                             "kernel_us": round(kernel, 3), "ratio": round(kernel / cublas, 3)})
            print(f"{shape:>11} rows {rows}: cuBLAS {cublas:6.2f} us, kernel {kernel:6.2f} us "
                  f"({kernel / cublas:.2f}x)", flush=True)
        del weights
    return Result(rows_out, None)
