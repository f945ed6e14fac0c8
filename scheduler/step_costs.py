"""Measured step costs: seconds of an engine step by batch size and tokens per sequence.

The controller (:mod:`scheduler.goodput`) compares steps of one batch size ``b`` that score
``w`` tokens per sequence (``w = 1``: plain decoding; ``w = k + 1``: k drafts, the runner pads
every sequence to the step's longest). Nothing is fitted: each cell ``(kind, b, w)`` keeps the
last ``SAMPLES`` measured times and answers their median, which shrugs off the odd slow step (a
garbage collection, a page fault, a proposer's first look at a new prompt); until it holds
``TRUSTED`` samples it answers the fastest, so that one slow first sample does not keep a choice
from being tried again. The first step of every cell is not recorded at all: it pays one-time
costs that no later step pays (a Triton kernel compiled for a new shape: 40 ms on an H100).
Kinds: ``"step"``, the whole step less the proposer (schedule, forward, verification, appends,
rollback: the host work of the speculative path is in it), and ``"propose"``, the proposer's
time for ``w`` requested drafts.

Batch sizes are grouped by ``batch_bucket`` (the engine passes its runner's CUDA-graph buckets:
steps of one bucket replay one graph and cost the same; the identity otherwise).

Only steady steps are recorded (the engine leaves out a step whose CUDA-graph bucket ran eager
or was captured, and steps with prefill chunks). Costs are relative: ``relative(kind, b, w)`` is
the cell over the plain step ``("step", b, 1)`` of the same batch size; when a batch size lacks
either, the nearest batch size (by ratio) that has both answers, and None when none has.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

SAMPLES = 9  # recent measurements kept per cell
TRUSTED = 3  # below this many a cell answers its fastest sample (optimism: it is tried again)


class StepCostTable:
    """Median recent seconds per ``(kind, batch_size, width)`` (see the module docstring)."""

    def __init__(self, batch_bucket: Callable[[int], int] = int) -> None:
        self.batch_bucket = batch_bucket
        self._samples: dict[tuple[str, int, int], deque[float]] = {}
        self._median: dict[tuple[str, int, int], float] = {}
        self._plain_batches: list[int] = []  # buckets with a measured plain step
        self._nearest: dict[int, list[int]] = {}  # bucket -> _plain_batches nearest first
        self.version = 0  # bumped when an answer may change (a median moved, a cell began)

    def record(self, kind: str, batch_size: int, width: int, seconds: float) -> None:
        key = (kind, self.batch_bucket(batch_size), width)
        samples = self._samples.get(key)
        if samples is None:  # a cell's first step is a warm-up: not recorded (see above)
            self._samples[key] = deque(maxlen=SAMPLES)
            return
        if not samples and kind == "step" and width == 1:
            self._plain_batches.append(key[1])
            self._nearest.clear()
        samples.append(seconds)
        ordered = sorted(samples)
        median = ordered[len(ordered) // 2] if len(ordered) >= TRUSTED else ordered[0]
        if self._median.get(key) != median:
            self._median[key] = median
            self.version += 1

    def count(self, kind: str, batch_size: int, width: int) -> int:
        """Samples the cell holds (its warm-up step not counted)."""
        samples = self._samples.get((kind, self.batch_bucket(batch_size), width))
        return 0 if samples is None else len(samples)

    def samples(self, kind: str, batch_size: int, width: int) -> list[float]:
        """The cell's recent samples, oldest first (for benchmarks that show what a cost was
        made of)."""
        return list(self._samples.get((kind, self.batch_bucket(batch_size), width), ()))

    def seconds(self, kind: str, batch_size: int, width: int) -> float | None:
        return self._median.get((kind, self.batch_bucket(batch_size), width))

    def relative(self, kind: str, batch_size: int, width: int) -> float | None:
        """The cell over the plain step of its batch size, from the nearest batch size that
        has both (None: no batch size has both)."""
        bucket = self.batch_bucket(batch_size)
        nearest = self._nearest.get(bucket)
        if nearest is None:
            nearest = self._nearest[bucket] = sorted(
                self._plain_batches, key=lambda b: abs(math.log(b / bucket)))
        for b in nearest:
            cell = self._median.get((kind, b, width))
            if cell is not None:
                return cell / self._median[("step", b, 1)]
        return None
