"""CUDA graphs of the runner's small forwards (decode and verification steps).

Why. At batch 1-32 a decode step of a 1B model is mostly host work: Python and one kernel launch
per op, a few hundred per step, while the GPU waits (docs/performance.md, end to end on the GPU).
A CUDA graph records the step's kernels once and replays them with one launch.

Static shapes. A graph replays fixed shapes at fixed addresses, so each one is captured for a
*bucket* ``(batch_size, num_new, kv_len)``:

- ``batch_size``: the step's sequences rounded up to 1, 2, 4, 8, then a multiple of 8 (the
  padding sequences are the cache's scratch slot: they write the scratch row and read nothing
  that counts);
- ``num_new``: the step's tokens per sequence (1: decode; up to ``max_num_new``, the engine's
  k + 1), the shorter sequences padded with scratch tokens. Each width gets its own graph,
  because padding is not free: on an H100, a random 1.24 B LLaMA at batch 32 ran a step of 2
  tokens per sequence at 1.06 plain steps and one of 5 at 1.23 (docs/performance.md, the oracle
  table), so a controller that chose one draft would pay for four. A width's bucket that is not
  captured yet replays its *widest twin* padded (same batch and key length, ``max_num_new``
  tokens) when that one is, instead of a cold eager step; such a step is not steady (its time is
  not the width's). While the device has less than ``WIDTH_GRAPH_RESERVE`` free, the twin serves
  such a width for good. Longer steps (prefills) run eager;
- ``kv_len``: rounded up to a multiple of ``max(128, next_power_of_two(kv_len) / 4)`` (at most
  a quarter more key columns, about four graphs per doubling of the context), capped at the
  slot table's width. Columns past a sequence's length are masked, as in an eager step.

Every graph reads its inputs from one static long tensor laid out as the runner's host plan
(input ids, positions, pool rows, slot-table cells, slots) and writes the last hidden states
``[batch_size * num_new, hidden_size]`` into a static output; ``lm_head`` runs after the replay on
the rows asked for only. Graphs are captured lazily, the *second* time a bucket is met, and share
one memory pool. A capture (one warm-up forward plus the capture) costs about three eager steps.
A decode bucket's capture
also captures its verification twin (same batch and key length, ``max_num_new`` tokens): decode
steps come back every step while adaptive-k probes are rare, so a probe would otherwise meet its
bucket cold (an eager step, then a capture inside a later step) long after the decode graph is
warm. Each graph also keeps memory of its own; capturing every bucket of an 8B model at batch 32 up
front ran out of memory, which is why nothing is captured before its decode bucket is met twice
(the measurements: docs/design.md, "Measured reasons behind the runner's choices"). Replays run in
stream order, so sharing is safe; each graph's output stays alive as long as the graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

KV_STEP = 128  # the smallest kv_len rounding
# Free device bytes below which a width that its widest twin can serve gets no graph of its own
# (each graph keeps tens of MB: docs/design.md, "CUDA graphs").
WIDTH_GRAPH_RESERVE = 2 << 30


def batch_bucket(batch_size: int) -> int:
    """1, 2, 4, 8, then the next multiple of 8."""
    if batch_size <= 8:
        return 1 << (batch_size - 1).bit_length()
    return -(-batch_size // 8) * 8


def kv_bucket(kv_len: int, limit: int) -> int:
    """``kv_len`` rounded up to a multiple of ``max(KV_STEP, next_power_of_two(kv_len) // 4)``,
    at most ``limit``."""
    step = max(KV_STEP, (1 << (kv_len - 1).bit_length()) // 4)
    return min(-(-kv_len // step) * step, limit)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor  # [4 * batch_size * num_new + batch_size] long: the host plan's layout
    hidden: torch.Tensor  # [batch_size * num_new, hidden_size]


# body(inputs, batch_size, num_new, kv_len) -> hidden [batch_size * num_new, hidden_size]
Body = Callable[[torch.Tensor, int, int, int], torch.Tensor]


class CudaGraphs:
    """Captured forwards by bucket; see the module docstring.

    ``scratch_inputs(batch_size, num_new)`` gives the input layout of a step of padding only
    (what the warm-up and the capture run on: it writes scratch rows only). ``capture=False``
    runs each bucket's padded layout eagerly instead of replaying a graph: the same shapes and
    padding, so that the bucketing is checked where CUDA graphs are not available (CPU tests).
    """

    def __init__(self, body: Body, scratch_inputs: Callable[[int, int], list[int]],
                 max_batch_size: int, max_num_new: int, max_kv_len: int,
                 device: torch.device, capture: bool = True) -> None:
        self.max_batch_size = batch_bucket(max_batch_size)
        self.max_num_new = max_num_new
        self.max_kv_len = max_kv_len
        self._body = body
        self._scratch_inputs = scratch_inputs
        self._device = device
        self._capture_graphs = capture
        self._graphs: dict[tuple[int, int, int], _Graph] = {}
        self._pool = None  # the memory pool all graphs share (made at the first capture)
        self._side: torch.cuda.Stream | None = None  # the captures' warm-up stream
        self._seen: set[tuple[int, int, int]] = set()  # buckets met once, run eager
        self.num_replays = 0  # steps run through a bucket
        self.steady = True  # the last step replayed its graph (or nothing is captured)
        self.padded = False  # the last bucket() answer was a wider twin
        self.capture_seconds = 0.0  # host time spent capturing (warm-up forward + capture)

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def bucket(self, batch_size: int, num_new: int, kv_len: int) -> tuple[int, int, int] | None:
        """The graph bucket of a step, or None when it runs eager (too many new tokens). A
        width met for the first time where its widest twin is captured gets the twin's bucket
        (the step is padded to it; see the module docstring)."""
        if num_new > self.max_num_new or batch_size > self.max_batch_size:
            return None
        key = (batch_bucket(batch_size), num_new, kv_bucket(kv_len, self.max_kv_len))
        self.padded = False
        if 1 < num_new < self.max_num_new and key not in self._graphs:
            twin = (key[0], self.max_num_new, key[2])
            if twin in self._graphs:
                if key not in self._seen:
                    self._seen.add(key)  # captured the next time it is met
                    self.padded = True
                    return twin
                if not self._room_for_another():
                    return twin  # (for good: steady)
        return key

    def _room_for_another(self) -> bool:
        """Whether the device keeps ``WIDTH_GRAPH_RESERVE`` bytes free for one more graph of a
        width that its widest twin can serve (a decode or widest bucket is captured anyway)."""
        if self._device.type != "cuda":
            return True
        return torch.cuda.mem_get_info(self._device)[0] >= WIDTH_GRAPH_RESERVE

    def replay(self, key: tuple[int, int, int], inputs: torch.Tensor) -> torch.Tensor:
        """Run bucket ``key`` on ``inputs`` (its layout, on the device); returns the static
        hidden states ``[batch_size * num_new, hidden_size]``, valid until the next replay.
        Sets :attr:`steady`: whether this step timed like every later step of its width."""
        self.num_replays += 1
        graph, captured = self._graph(key) if self._capture_graphs else (None, False)
        # a bucket's first step runs eager and its second captures, a padded step is another
        # width's: none of them times like the rest
        self.steady = not self._capture_graphs or (graph is not None and not captured
                                                   and not self.padded)
        if graph is None:  # (a bucket's first step, or no capture off-GPU)
            return self._body(inputs, *key)
        graph.inputs.copy_(inputs)
        graph.graph.replay()
        return graph.hidden

    def _graph(self, key: tuple[int, int, int]) -> tuple[_Graph | None, bool]:
        """The bucket's graph, and whether this call captured it; None the first time a bucket
        is met (that step runs eager)."""
        graph = self._graphs.get(key)
        if graph is not None:
            return graph, False
        if key not in self._seen:
            self._seen.add(key)
            return None, False
        batch_size, num_new, kv_len = key
        twin = (batch_size, self.max_num_new, kv_len)  # the widest verification steps' bucket
        start = time.perf_counter()
        graph = self._graphs[key] = self._capture(*key)
        if num_new == 1 and twin not in self._graphs:
            self._graphs[twin] = self._capture(*twin)
        self.capture_seconds += time.perf_counter() - start
        return graph, True

    def _capture(self, batch_size: int, num_new: int, kv_len: int) -> _Graph:
        inputs = torch.tensor(self._scratch_inputs(batch_size, num_new), dtype=torch.long,
                              device=self._device)
        if self._side is None:
            self._side = torch.cuda.Stream(self._device)
        # Warm-up off the main stream, as torch asks (one such stream for every capture: the
        # caching allocator keeps a stream's freed blocks for that stream).
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side):
            self._body(inputs, batch_size, num_new, kv_len)
        torch.cuda.current_stream(self._device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            hidden = self._body(inputs, batch_size, num_new, kv_len)
        return _Graph(graph, inputs, hidden)
