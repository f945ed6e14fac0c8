"""The attention of one step, every layer: the gather backend against paged reads.

For each model shape (its heads, kv heads, head dim and layers; no weights), batch size, context
and tokens per sequence, one KV pool per layer is filled with random keys and values, and each
sequence owns shuffled pool rows (as after preemptions and rollbacks). What a step's attention
costs is then timed the way a graph-replayed step runs it, captured as one CUDA graph:

- ``gather``: the cache's ``prepare_step`` (the slot-table write and the read rows), the
  runner's 4-D mask (``Executor.mask``), then per layer the cache's ``update`` (write the new
  keys and values, gather every sequence's rows padded to the bucket's key length) and the
  runner's masked GQA SDPA;
- ``paged``: ``prepare_step`` (the write only), then per layer ``update`` (the write; it returns
  the pool) and the paged kernel (:mod:`engine.runner.paged_attention`, split-K as the runner
  chooses it).

The key length is the CUDA-graph bucket's (``kv_bucket``), as in the engine. Each row also
records the largest difference between the two backends' outputs of the last layer (a sanity
check, not a test). Timings: ``triton.testing.do_bench``'s median of graph replays (L2 flushed
between them); on CPU (the smoke run) the bodies run eagerly.

    python -m benchmarks attention --device cuda --json attention.json
    python -m benchmarks attention --device cpu --quick
"""

from __future__ import annotations

import argparse
import types

import torch
from torch import nn

from benchmarks import models
from benchmarks.record import Result
from benchmarks.suites.samplers import graph_us, time_us
from engine.runner.attention_backend import (
    PagedStep,
    gqa_attention,
    gqa_sdpa_attention,
    paged_attention_step,
    without_cudnn_attention,
)
from engine.runner.cuda_graphs import kv_bucket
from engine.runner.executor import Executor
from engine.runner.kv_cache import PagedKVCache
from engine.runner.paged_attention import split_plan
from engine.runner.step_inputs import LAYOUT_ROWS, Scratch, lay_out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default="random-llama-1b,random-smollm2-135m",
                   help=f"comma list of {sorted(models.RANDOM_LLAMAS)}")
    p.add_argument("--device", default=models.default_device())
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bf16 on CUDA")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--contexts", default="256,2048,8192", help="cached tokens per sequence")
    p.add_argument("--num-new", default="1,4",
                   help="new tokens per sequence: 1 a decode step, k + 1 a verification")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: batch 1, 2; context 32; 2 layers")


class _Shape:
    """A model shape's attention sizes: query heads, kv heads, head dim, layers, scale."""

    def __init__(self, name: str, quick: bool):
        config = models.random_config(name)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.layers = 2 if quick else config.num_hidden_layers
        self.scale = self.head_dim ** -0.5


class _Attention(nn.Module):
    """What ``gqa_sdpa_attention`` reads of an attention module (transformers' sdpa path)."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def fill_cache(shape: _Shape, max_batch: int, max_len: int, dtype: torch.dtype,
               device: torch.device) -> PagedKVCache:
    """A cache for ``max_batch`` sequences of ``max_len`` tokens, every layer's pool random."""
    cache = PagedKVCache({i: device for i in range(shape.layers)}, shape.kv_heads,
                         shape.head_dim, max_batch * max_len, max_batch, max_len, dtype, device)
    g = torch.Generator(device=device).manual_seed(0)
    for pool in cache.pools.values():
        pool.normal_(generator=g)
    return cache


def step_inputs(cache: PagedKVCache, batch: int, context: int, num_new: int,
                device: torch.device) -> torch.Tensor:
    """The layout of a step of ``batch`` sequences of ``context`` cached tokens, each bringing
    ``num_new`` (chains), their rows a random share of the pool; the context's rows are
    written into the slot table here."""
    g = torch.Generator().manual_seed(batch * 7919 + context)
    perm = torch.randperm(cache.scratch_row, generator=g)  # every pool row but the scratch one
    per_seq = context + num_new
    rows = perm[:batch * per_seq].view(batch, per_seq)
    cache.slot_table[:batch, :context] = rows[:, :context].to(device)
    scratch = Scratch(cache.scratch_slot, cache.scratch_row, cache.slot_table.shape[1])
    layout = lay_out(list(range(batch)), [[5] * num_new] * batch, [context] * batch,
                     rows[:, context:].tolist(), [None] * batch, batch, num_new, scratch)
    return torch.tensor(layout.host, dtype=torch.long, device=device)


def bodies(cache: PagedKVCache, shape: _Shape, inputs: torch.Tensor, batch: int, num_new: int,
           kv_len: int, dtype: torch.dtype, device: torch.device):
    """The two backends' step attention as functions of no arguments (their last layer's
    output ``[batch, num_new, heads, head_dim]`` each)."""
    g = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(batch, shape.heads, num_new, shape.head_dim, generator=g, device=device,
                    dtype=dtype)  # [batch, heads, num_new, head_dim]
    new_kv = torch.randn(batch, shape.kv_heads, num_new, shape.head_dim, generator=g,
                         device=device, dtype=dtype)  # [batch, kv_heads, num_new, head_dim]
    padded = batch * num_new
    _, _, write_rows, cells, limits, ancestors = inputs[:LAYOUT_ROWS * padded].view(
        LAYOUT_ROWS, batch, num_new)
    slots = inputs[LAYOUT_ROWS * padded:]
    module = _Attention(shape.heads // shape.kv_heads)
    # Executor.mask reads these three of its executor
    mask_owner = types.SimpleNamespace(
        _positions=torch.arange(cache.slot_table.shape[1] + 16, device=device),
        _zero=torch.zeros((), dtype=dtype, device=device),
        _min=torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device))
    plan = split_plan(batch, shape.heads, shape.kv_heads, num_new, kv_len, device)

    def gather() -> torch.Tensor:
        cache.read_in_place = False
        cache.prepare_step(slots, write_rows, cells.reshape(-1), kv_len)
        mask = Executor.mask(mask_owner, limits, ancestors, kv_len)
        with without_cudnn_attention(device), gqa_attention(True):
            for layer in range(shape.layers):
                keys, values = cache.update(new_kv, new_kv, layer)
                out, _ = gqa_sdpa_attention(module, q, keys, values, mask, scaling=shape.scale)
        return out

    def paged() -> torch.Tensor:
        cache.read_in_place = True
        cache.prepare_step(slots, write_rows, cells.reshape(-1), kv_len)
        step = PagedStep(cache.slot_table, slots, limits, ancestors, kv_len, plan)
        with paged_attention_step(step):
            for layer in range(shape.layers):
                keys, values = cache.update(new_kv, new_kv, layer)
                out, _ = gqa_sdpa_attention(module, q, keys, values, None, scaling=shape.scale)
        return out

    return gather, paged, plan


def step_us(fn, device: torch.device) -> float:
    """Microseconds of one call: a replayed CUDA graph on CUDA, eager on CPU."""
    us = graph_us(fn, device)
    return time_us(fn, device) if us is None else us


def run(args: argparse.Namespace) -> Result:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or models.default_dtype(args.device))
    if args.quick:
        args.batch_sizes, args.contexts, args.num_new = "1,2", "32", "1,3"
    batches = [int(b) for b in args.batch_sizes.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    widths = [int(n) for n in args.num_new.split(",")]
    rows = []
    for name in args.shapes.split(","):
        shape = _Shape(name, args.quick)
        max_len = max(contexts) + max(widths)
        cache = fill_cache(shape, max(batches), max_len, dtype, device)
        for context in contexts:
            for batch in batches:
                for num_new in widths:
                    inputs = step_inputs(cache, batch, context, num_new, device)
                    kv_len = kv_bucket(context + num_new, cache.slot_table.shape[1])
                    gather, paged, plan = bodies(cache, shape, inputs, batch, num_new, kv_len,
                                                   dtype, device)
                    diff = (gather().float() - paged().float()).abs().max().item()
                    gather_us, paged_us = step_us(gather, device), step_us(paged, device)
                    row = {"shape": name, "layers": shape.layers, "batch_size": batch,
                           "context": context, "num_new": num_new, "kv_len": kv_len,
                           "num_splits": plan.num_splits, "block_n": plan.block_n,
                           "prefetch": plan.prefetch, "gather_us": gather_us, "paged_us": paged_us,
                           "speedup": gather_us / paged_us, "max_abs_diff": diff}
                    rows.append(row)
                    print(f"{name:<20} b={batch:<3} ctx={context:<5} new={num_new} "
                          f"splits={plan.num_splits:<2} gather {gather_us:9.1f} us  paged "
                          f"{paged_us:9.1f} us  x{row['speedup']:.2f}  diff {diff:.2e}",
                          flush=True)
        del cache
    return Result(rows, args.shapes, {"dtype": str(dtype)})
