"""Latency of one small all-reduce on the GPUs of one host, as tensor parallelism does two per
decoder layer: NCCL (``dist.all_reduce``, what transformers' plans call) against PyTorch's
symmetric-memory kernels (``torch.ops.symm_mem``: one-shot and two-shot, peer-to-peer loads over
NVLink, no multicast), each captured ``--per-graph`` times in a row in one CUDA graph, as a
decode step replays them. One row per (method, message size: a batch's hidden states in bf16):
microseconds per all-reduce, and whether the result is the sum. A method the installed PyTorch
lacks, or that fails on this machine, is reported with its error, not timed. One process per
GPU::

    torchrun --standalone --nproc-per-node 2 -m benchmarks parallel allreduce --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from benchmarks.record import Result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", default="1,8,32,160", help="tokens per message (x HIDDEN bf16)")
    p.add_argument("--per-graph", type=int, default=64, help="all-reduces per captured graph")
    p.add_argument("--replays", type=int, default=50)


HIDDEN = 4096  # the 8B shape's hidden size


def methods(group_name: str, numel_max: int, device: torch.device) -> dict[str, Callable]:
    """name -> (x [n] bf16 -> the sum over ranks, [n]); symmetric-memory ones where they set up."""
    out: dict[str, Callable] = {}

    def nccl(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()  # (out of place, like the staged copies below: x keeps its value)
        dist.all_reduce(y)
        return y

    out["nccl"] = nccl
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group_name)
        buf = symm_mem.empty(numel_max, dtype=torch.bfloat16, device=device)  # [numel_max]
        symm_mem.rendezvous(buf, group_name)
    except Exception as exc:  # (reported, not timed)
        print(f"symmetric memory unavailable: {exc!r}", flush=True)
        return out

    def one_shot(x: torch.Tensor) -> torch.Tensor:
        staged = buf[:x.numel()]
        staged.copy_(x)
        return torch.ops.symm_mem.one_shot_all_reduce(staged, "sum", group_name)

    def two_shot(x: torch.Tensor) -> torch.Tensor:
        staged = buf[:x.numel()]
        staged.copy_(x)
        torch.ops.symm_mem.two_shot_all_reduce_(staged, "sum", group_name)
        return staged.clone()

    out["symm_one_shot"] = one_shot
    out["symm_two_shot"] = two_shot
    return out


def time_graph(fn: Callable, x: torch.Tensor, per_graph: int, replays: int) -> tuple[float, bool]:
    """Microseconds per all-reduce replayed in a graph of ``per_graph``, and whether the result
    is right (each rank's x is rank + 1 everywhere: the sum is world (world + 1) / 2)."""
    world = dist.get_world_size()
    want = world * (world + 1) / 2
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # (warm-up outside the capture: NCCL's and symm's set-up)
        for _ in range(3):
            x.fill_(dist.get_rank() + 1)
            y = fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    ok = bool(torch.all(y == want))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(per_graph):
            y = fn(x)
    x.fill_(dist.get_rank() + 1)
    graph.replay()
    torch.cuda.synchronize()
    ok = ok and bool(torch.all(y == want))
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / (replays * per_graph), ok


def run(args: argparse.Namespace) -> Result | None:
    """Rank 0's rows (None on the other ranks)."""
    if "RANK" not in os.environ:
        raise SystemExit("parallel allreduce runs one process per GPU: launch it with torchrun "
                         "(see the module docstring)")
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rows = [int(r) for r in args.rows.split(",")]
    group_name = dist.group.WORLD.group_name
    fns = methods(group_name, max(rows) * HIDDEN, device)
    results = []
    for name, fn in fns.items():  # (NCCL first: a method that fails in capture goes last)
        for n in rows:
            x = torch.empty(n * HIDDEN, dtype=torch.bfloat16, device=device)  # [n * HIDDEN]
            try:
                us, ok = time_graph(fn, x, args.per_graph, args.replays)
                row = {"method": name, "rows": n, "bytes": x.numel() * 2, "us": us, "ok": ok}
            except Exception as exc:
                row = {"method": name, "rows": n, "bytes": x.numel() * 2, "error": repr(exc)}
            results.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    dist.destroy_process_group()
    return Result(results) if rank == 0 else None
