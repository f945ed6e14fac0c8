"""CUDA graphs of the runner's small forwards (decode and verification steps).

Why. At batch 1-32 a decode step of a 1B model is mostly host work: Python and one kernel launch
per op, a few hundred per step, while the GPU waits (docs/performance.md, end to end on the GPU).
A CUDA graph records the step's kernels once and replays them with one launch.

Static shapes. A graph replays fixed shapes at fixed addresses, so each one is captured for a
*bucket* ``(batch_size, num_new, kv_len)``:

- ``batch_size``: the step's sequences rounded up to 1, 2, 4, 8, then a multiple of 8 (the
  padding sequences are the cache's scratch slot: they write the scratch row and read nothing
  that counts); a *folded* step's rows, where a prompt chunk takes several rows of the step's
  width (``engine.runner.step_layout``), up to ``max_batch_size`` (the runner's ``fold_rows``);
- ``num_new``: the step's tokens per sequence (1: decode; up to ``max_num_new``, the engine's
  k + 1), the shorter sequences padded with scratch tokens. Each width has its own buckets,
  because padding is not free: padded to the widest width, one draft would cost what four do
  (docs/design.md, "Measured reasons behind the runner's choices"). Longer steps
  (prompt chunks) of at most ``PREFILL_MAX_BATCH`` sequences have *prefill* buckets: their
  tokens per sequence rounded up by at most a quarter past 64 (at least ``PREFILL_MIN_NEW``; at
  most ``PREFILL_MAX_TOKENS`` in all and ``PREFILL_MAX_CELLS`` mask cells, the mask being what
  a capture's pool keeps), covered only by prefill buckets, and covering none of the others;
  one is captured only while the device keeps ``COVERED_GRAPH_RESERVE`` free, and its captures
  are priced apart from the others' (``capture_cost``). Without them a prompt admitted while
  others decode costs an eager step, about ten graph steps (docs/design.md, "Measured reasons
  behind the runner's choices"; the runner splits such a step into its decoding and its
  prefilling sequences, ``engine.runner.step_layout``), and under continuous batching, where
  speculation makes requests end and be replaced at different steps, such steps would take most
  of what speculation gains. Larger prefills run eager;
- ``kv_len``: rounded up to a multiple of ``max(128, next_power_of_two(kv_len) / 4)`` (at most
  a quarter more key columns, about four graphs per doubling of the context), capped at the
  slot table's width. Columns past a sequence's length are masked, as in an eager step. Paged
  attention reads each row's own length on the device, so its key length only picks the split
  count: the executor passes ``paged_attention.split_bucket`` as ``kv_rounding`` (six key
  lengths up to 8,192 columns, then the table's width).

Every graph reads its inputs from one static long tensor laid out as the runner's host plan
(input ids, positions, pool rows, slot-table cells, mask limits, tree ancestors, slots) and
writes the last hidden states ``[batch_size * num_new, hidden_size]`` into a static output; a
decode bucket's body also runs the output head and the greedy argmax on every row (the
executor's ``_graph_body``), other buckets' ``lm_head`` runs after the replay on the rows asked
for only. All graphs share one memory pool; replays run in stream order, so sharing is safe
while a graph's output is read before the next replay (another graph's scratch may lie where it
does), and each graph's output stays alive as long as the graph.

When a bucket is captured. A capture (a warm-up forward plus the capture) costs about three
eager steps, and each graph keeps memory of its own: capturing every bucket of an 8B model at
batch 32 up front runs out of memory (docs/design.md, "Measured reasons behind the runner's
choices"). So graphs are captured lazily:

- a bucket that no captured graph *covers* (larger or equal batch, tokens per sequence and key
  length; a decode bucket only by a decode bucket: decode steps are the most frequent, and a
  verification graph would multiply their tokens) runs eager the first time it is met and is
  captured the second;
- a bucket that one covers replays the smallest such graph, padded (scratch sequences and
  tokens, masked key columns), and is captured once the padding it has cost reaches what a
  capture costs (the ski-rental rule: the padding paid is then at most one capture, and the
  captures made at most twice what the best choice in hindsight costs), if the device keeps
  ``COVERED_GRAPH_RESERVE`` free (else the cover serves it for good). Both sides are measured:
  every capture's host time, and every captured graph's replay (timed on its scratch inputs
  right after the capture). What one padded step costs is bounded above by the cover's replay
  less the slowest captured graph that the bucket itself covers (its own replay cannot be
  faster), or the cover's whole replay when none is. On a small model, where a wider graph
  replays in about the time of a narrower one, a covered bucket is then almost never captured
  (a capture costs tens of milliseconds, inside someone's request); on a large one, where
  padding costs, within a few dozen steps. The batch sizes at the end of a batch of requests
  (each met a few times as sequences finish) and a width the controller tries once cost a padded
  replay, not an eager step and a capture each (which take a third to a half of a short warm
  run: docs/design.md, "Measured reasons behind the runner's choices");
- a decode bucket's capture also captures its widest verification twin (same batch and key
  length, ``max_num_new`` tokens, or ``twin_width(batch)`` where the engine's widest steps
  narrow with the batch, as draft trees do), which covers every width of its batch and key
  length; not past ``twin_max_batch`` (the runner's sequences: more rows than that are a
  packed verification's or a folded prompt's, one token a row).

Under tensor parallelism every rank must capture and replay the same graphs at the same steps
(a graph holds the model's collectives, which meet only when every rank runs them). The
decisions above read each rank's own timings and free memory, so only one rank makes them: each
step's :attr:`CudaGraphs.decision` (the bucket, and the buckets captured first, in order) is what
the leader sends with the step, and a follower runs exactly that (:meth:`CudaGraphs.dictate`).

A step padded to a cover is *steady* (:attr:`CudaGraphs.steady`): it times like every later
step of its bucket until the bucket gets a graph of its own, so its time is what the
speculation controller pays for that width now, and the controller records it as such (else a
width served by its twin would read as cheap as a narrower graph, and the controller would
choose it for the wider one's cost: docs/history.md, "CUDA graphs"). An eager first step and a
capture are not steady: their costs are one-time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from samplers.graph_capture import gc_paused

KV_STEP = 128  # the smallest kv_len rounding
TIMED_REPLAYS = 3  # replays of a new graph timed right after its capture
# Free device bytes below which a covered bucket gets no graph of its own (each graph keeps tens
# of MB: docs/design.md, "CUDA graphs").
COVERED_GRAPH_RESERVE = 2 << 30
PREFILL_MAX_BATCH = 8  # prefill buckets: at most this many sequences ...
PREFILL_MAX_TOKENS = 1024  # ... of at most this many padded tokens in all ...
PREFILL_MIN_NEW = 16  # ... each sequence's tokens rounded up (new_bucket), at least this ...
PREFILL_MAX_CELLS = 1 << 22  # ... and at most this many mask cells (padded tokens * key length)


def batch_bucket(batch_size: int) -> int:
    """1, 2, 4, 8, then the next multiple of 8."""
    if batch_size <= 8:
        return 1 << (batch_size - 1).bit_length()
    return -(-batch_size // 8) * 8


def new_bucket(num_new: int, max_num_new: int) -> int:
    """A step's tokens per sequence in its bucket: as they are up to ``max_num_new`` (decode and
    verification), else (a prefill bucket) rounded up to a multiple of
    ``max(PREFILL_MIN_NEW, next_power_of_two(num_new) / 4)`` (at most a quarter more tokens past
    64, as key lengths round)."""
    if num_new <= max_num_new:
        return num_new
    step = max(PREFILL_MIN_NEW, (1 << (num_new - 1).bit_length()) // 4)
    return -(-num_new // step) * step


def kv_bucket(kv_len: int, limit: int) -> int:
    """``kv_len`` rounded up to a multiple of ``max(KV_STEP, next_power_of_two(kv_len) // 4)``,
    at most ``limit``."""
    step = max(KV_STEP, (1 << (kv_len - 1).bit_length()) // 4)
    return min(-(-kv_len // step) * step, limit)


Key = tuple[int, int, int]  # (batch_size, num_new, kv_len) of a bucket
# A step's decision: the bucket it runs in (None: eager, unbucketed) and the buckets captured
# before it runs, in order (its own first; empty when it replays a graph or runs eager).
Decision = tuple[Key | None, tuple[Key, ...]]
NO_DECISION: Decision = (None, ())


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor  # [6 * batch_size * num_new + batch_size] long: the host plan's layout
    output: Any  # the body's static output (the executor's: hidden states, logits, argmax)


# body(inputs, batch_size, num_new, kv_len) -> its output (tensors, or a tuple of them and None)
Body = Callable[[torch.Tensor, int, int, int], Any]


class CudaGraphs:
    """Captured forwards by bucket; see the module docstring.

    ``scratch_inputs(batch_size, num_new)`` gives the input layout of a step of padding only
    (what the warm-up and the capture run on: it writes scratch rows only). ``capture=False``
    runs each bucket's padded layout eagerly instead of replaying a graph: the same shapes and
    padding, so that the bucketing is checked where CUDA graphs are not available (CPU tests).
    """

    def __init__(self, body: Body, scratch_inputs: Callable[[int, int], list[int]],
                 max_batch_size: int, max_num_new: int, max_kv_len: int,
                 device: torch.device, capture: bool = True,
                 twin_width: Callable[[int], int] | None = None,
                 kv_rounding: Callable[[int, int], int] = kv_bucket) -> None:
        self.max_batch_size = batch_bucket(max_batch_size)
        self.max_num_new = max_num_new
        # twin_width(batch bucket): the widest verification of that batch (a decode bucket's
        # twin): max_num_new unless the engine's widest steps shrink with the batch, as draft
        # trees do (the runner's twin_width)
        self.twin_width: Callable[[int], int] = twin_width or (lambda batch_size: max_num_new)
        # decode buckets past this batch get no twin (the rows of a packed verification or a
        # folded prompt: engine.runner.step_layout; steps of that many sequences never
        # come, and the twin would hold max_num_new times the rows)
        self.twin_max_batch = self.max_batch_size
        self.max_kv_len = max_kv_len
        # kv_rounding(kv_len, max_kv_len): a bucket's key length (module docstring)
        self._kv_rounding = kv_rounding
        self._body = body
        self._scratch_inputs = scratch_inputs
        self._device = device
        self._capture_graphs = capture
        self._graphs: dict[Key, _Graph] = {}
        self._pool = None  # the memory pool all graphs share (made at the first capture)
        self._side: torch.cuda.Stream | None = None  # the captures' warm-up stream
        self._met: dict[Key, int] = {}  # steps of each bucket without a graph of its own so far
        self._padding_s: dict[Key, float] = {}  # what padding has cost each covered bucket
        self._replay_s: dict[Key, float] = {}  # each captured graph's replay, measured
        self._num_captures = 0  # graphs captured (their host time: capture_seconds)
        self._prefill_captures = (0.0, 0)  # (seconds, count) of the prefill buckets' captures
        self._covers: dict[Key, Key | None] = {}  # the smallest captured bucket covering one
        self._bounds: dict[Key, float] = {}  # a padded step's cost bound, per covered bucket
        self._room = True  # the device kept COVERED_GRAPH_RESERVE free when last asked
        self.num_replays = 0  # steps run through a bucket
        self.steady = True  # the last step replayed a graph it did not capture (its own or a
        # cover), or nothing is captured
        self.capture_seconds = 0.0  # host time spent capturing (warm-up forward + capture)
        self.decision: Decision = NO_DECISION  # the last bucket() call's
        self._dictated: Decision | None = None  # the next bucket() call's, from the leader

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    @property
    def replay_seconds(self) -> dict[Key, float]:
        """Each captured bucket's replay, as timed on the device when it was captured."""
        return dict(self._replay_s)

    def release(self) -> None:
        """Free every captured graph (their memory pool too) once the device is done with
        them; later steps run eager until buckets are captured again. Under tensor parallelism
        this must come before the process group is destroyed: NCCL does not tear down a
        communicator that a live graph's collectives still hold (pytorch/pytorch#115388; every
        rank hung in ``destroy_process_group`` on the first two-GPU run with graphs)."""
        if self._graphs and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        for graph in self._graphs.values():
            graph.graph.reset()
        self._graphs.clear()
        self._replay_s.clear()
        self._covers.clear()
        self._bounds.clear()
        self._met.clear()
        self._padding_s.clear()
        self._pool = None

    def bucket(self, batch_size: int, num_new: int, kv_len: int) -> Key | None:
        """The graph bucket a step runs in, or None when it runs eager (too many new tokens or
        sequences). A bucket without a graph of its own is served by the smallest captured one
        that covers it until the padding has cost it a capture (then it is captured; see the
        module docstring). Sets :attr:`decision`; after :meth:`dictate`, returns the dictated
        bucket instead."""
        if self._dictated is not None:
            self.decision, self._dictated = self._dictated, None
            return self.decision[0]
        key = self._bucket(batch_size, num_new, kv_len)
        self.decision = (key, self._planned_captures(key))
        return key

    def ready(self, batch_size: int, num_new: int, kv_len: int) -> bool:
        """Whether a step of these sizes would replay a graph now (its bucket's own or a
        cover), without counting it as met."""
        key = self._key(batch_size, num_new, kv_len)
        return key is not None and (key in self._graphs or self._cover(key) is not None)

    def _key(self, batch_size: int, num_new: int, kv_len: int) -> Key | None:
        """The bucket of a step of these sizes, None when it has none (eager)."""
        if batch_size > self.max_batch_size:
            return None
        batch, num_new = batch_bucket(batch_size), new_bucket(num_new, self.max_num_new)
        if num_new > self.max_num_new and (
                batch > PREFILL_MAX_BATCH or batch * num_new > PREFILL_MAX_TOKENS
                or batch * num_new * kv_bucket(kv_len, self.max_kv_len) > PREFILL_MAX_CELLS):
            return None  # a large prefill: eager
        return batch, num_new, self._kv_rounding(kv_len, self.max_kv_len)

    def dictate(self, decision: Decision) -> None:
        """The next step runs in ``decision``'s bucket and captures its buckets first, whatever
        this object would decide (a tensor-parallel follower, told by the leader: see the
        module docstring)."""
        self._dictated = decision

    def _planned_captures(self, key: Key | None) -> tuple[Key, ...]:
        """The buckets that a step in ``key`` captures before it runs: ``key`` at its second
        step without a graph, with a decode bucket's widest verification twin."""
        if (key is None or not self._capture_graphs or key in self._graphs
                or self._met.get(key, 0) < 2):
            return ()
        batch_size, num_new, kv_len = key
        twin = (batch_size, self.twin_width(batch_size), kv_len)  # the widest verifications
        if (num_new == 1 and twin != key and twin not in self._graphs
                and batch_size <= self.twin_max_batch):
            return key, twin
        return (key,)

    def _bucket(self, batch_size: int, num_new: int, kv_len: int) -> Key | None:
        key = self._key(batch_size, num_new, kv_len)
        if key is None or key in self._graphs or not self._capture_graphs:
            return key
        prefill = key[1] > self.max_num_new
        self._met[key] = self._met.get(key, 0) + 1
        cover = self._cover(key)
        if cover is None:
            if prefill and self._met[key] >= 2 and not self._room_for_another():
                self._met[key] = 1  # (no room for its graph: eager, for good)
                return None
            return key  # eager the first time, captured the next (replay)
        paid = self._padding_s[key] = self._padding_s.get(key, 0.0) + self._padding(key, cover)
        if paid >= self.capture_cost(prefill):
            self._met[key] = 2  # (captured at this replay)
            if self._room_for_another():
                return key  # captured now
            return cover  # for good: what its steps cost (steady)
        return cover

    def _cover(self, key: Key) -> Key | None:
        """The captured bucket of fewest padded tokens (then shortest key length) whose batch,
        new tokens and key length all reach ``key``'s, a decode step's only among decode
        buckets, a prefill's only among prefill buckets and a verification's among neither;
        None when there is none."""
        if key not in self._covers:
            batch, num_new, kv_len = key
            prefill = num_new > self.max_num_new
            fits = [k for k in self._graphs
                    if k[0] >= batch and k[2] >= kv_len
                    and (k[1] >= num_new if num_new > 1 else k[1] == 1)
                    and (k[1] > self.max_num_new) == prefill]
            self._covers[key] = min(fits, key=lambda k: (k[0] * k[1], k[2]), default=None)
        return self._covers[key]

    def _padding(self, key: Key, cover: Key) -> float:
        """An upper bound on what replaying ``cover`` for a step of ``key`` costs over ``key``'s
        own graph: the cover's replay less the slowest captured graph inside ``key`` (smaller
        or equal in every size, a decode graph only for a decode step: its body runs more,
        the output head), which ``key``'s own replay cannot beat. Kept until the next
        capture."""
        bound = self._bounds.get(key)
        if bound is None:
            batch, num_new, kv_len = key
            inside = max((t for k, t in self._replay_s.items()
                          if k[0] <= batch and k[1] <= num_new and k[2] <= kv_len
                          and (k[1] == 1) == (num_new == 1)), default=0.0)
            bound = self._bounds[key] = max(self._replay_s.get(cover, 0.0) - inside, 0.0)
        return bound

    def capture_cost(self, prefill: bool = False) -> float:
        """Seconds a capture costs, the mean of those measured (the first one's when only one),
        of prefill buckets or of the others (a prefill's capture runs a larger forward)."""
        seconds, count = self._prefill_captures
        if not prefill:
            seconds, count = self.capture_seconds - seconds, self._num_captures - count
        return seconds / count if count else 0.0

    def _room_for_another(self) -> bool:
        """Whether the device keeps ``COVERED_GRAPH_RESERVE`` bytes free for one more graph of
        a bucket that a captured one covers."""
        if self._device.type != "cuda" or not self._room:
            return self._room
        # (asked once per such step until the answer is no: graphs never give memory back)
        self._room = torch.cuda.mem_get_info(self._device)[0] >= COVERED_GRAPH_RESERVE
        return self._room

    def replay(self, key: Key, inputs: torch.Tensor) -> Any:
        """Run bucket ``key`` (:meth:`bucket`'s answer) on ``inputs`` (its layout, on the
        device); returns the body's static output (the executor's: the hidden states
        ``[batch_size * num_new, hidden_size]``, a decode bucket's logits and argmax), valid
        until the next replay of any of these graphs (they share one memory pool: a graph's
        static output may lie in another's scratch). Sets :attr:`steady`: whether this step
        timed like every later step of its bucket."""
        self.num_replays += 1
        graph, captured = self._graph(key) if self._capture_graphs else (None, False)
        # an eager first step and a capture time like no other step (a padded replay does:
        # see the module docstring)
        self.steady = not self._capture_graphs or (graph is not None and not captured)
        if graph is None:  # (a bucket's first step, or no capture off-GPU)
            return self._body(inputs, *key)
        graph.inputs.copy_(inputs)
        graph.graph.replay()
        return graph.output

    def _graph(self, key: Key) -> tuple[_Graph | None, bool]:
        """The bucket's graph, and whether this call captured it; None the first time a bucket
        is met (that step runs eager)."""
        graph = self._graphs.get(key)
        if graph is not None:
            return graph, False
        captures = (self.decision[1] if self.decision[0] == key
                    else self._planned_captures(key))
        if not captures:
            return None, False
        for bucket in captures:
            start = time.perf_counter()
            graph = self._graphs[bucket] = self._capture(*bucket)
            self._replay_s[bucket] = self._time_replays(graph)
            took = time.perf_counter() - start
            self.capture_seconds += took
            self._num_captures += 1
            if bucket[1] > self.max_num_new:
                seconds, count = self._prefill_captures
                self._prefill_captures = (seconds + took, count + 1)
        self._met.pop(key, None)
        self._padding_s.pop(key, None)
        self._covers.clear()
        self._bounds.clear()
        return self._graphs[key], True

    def _time_replays(self, graph: _Graph) -> float:
        """Seconds of one replay of a new graph (on its scratch inputs: it writes scratch rows
        only), the mean of ``TIMED_REPLAYS``, on the device's clock."""
        if self._device.type != "cuda":
            start = time.perf_counter()
            for _ in range(TIMED_REPLAYS):
                graph.graph.replay()
            return (time.perf_counter() - start) / TIMED_REPLAYS
        begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        begin.record()
        for _ in range(TIMED_REPLAYS):
            graph.graph.replay()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3 / TIMED_REPLAYS

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
        with gc_paused(), torch.cuda.graph(graph, pool=self._pool):
            output = self._body(inputs, batch_size, num_new, kv_len)
        return _Graph(graph, inputs, output)
