"""Measured step costs: seconds of an engine step by batch size and tokens per sequence.

The controller (:mod:`scheduler.goodput`) compares steps of one batch size ``b`` that score
``w`` tokens per sequence (``w = 1``: plain decoding; ``w = k + 1``: k drafts, the runner pads
every sequence to the step's longest). Nothing is fitted: each cell ``(kind, b, w)`` keeps the
last ``SAMPLES`` measured times and answers their lower quartile, which shrugs off slow steps
(a garbage collection, a page fault, a proposer's first look at a new prompt, and stretches of
slow steps that come from outside the engine: below) as long as they are fewer than three
quarters of the cell's samples; until it holds ``TRUSTED`` samples it answers the fastest, so
that one slow first sample does not keep a choice from being tried again. (Slowness from
outside only adds time, so the low samples are the cost; every width's cell is read the same
way, and the ratios between them are what the controller uses.) The first step of every cell is
not recorded at all: it pays one-time costs that no later step pays (a Triton kernel compiled
for a new shape: 40 ms on an H100).

A trusted cell also leaves out a sample over ``OUTLIER`` times its answer, unless it left out
the ``SKIP_LIMIT`` before it too (then the cost moved, and such samples are taken until one
comes within the bound again): a slow stretch of the machine came 13 steps long at times, more
than a quartile can shrug off.

Samples expire (but the plain step's, which every cost is relative to: while drafting pays no
plain step comes to measure it again): one older than ``WINDOW`` recorded steps of its batch
size is dropped (the cells' ages are looked at every ``SWEEP`` steps), so a width that the
controller stopped choosing is measured again (it then reads as not measured:
optimistic, ``scheduler.goodput``). Without it a width measured in one slow stretch kept its
cost for good: on the H100 machine, batch 1 of the random 1B, stretches of 5-10 steps came
slow (12-14 ms, then 5.9, 4.6, 3.9, 3.3 against 2.5), whichever width they had, and a width
whose samples fell there read 1.5-1.8 plain steps where it costs 1.02-1.04; the controller
never chose it again (0.53 of the best fixed k in one cell, docs/performance.md). Simulated
with such stretches (``benchmarks/controller_sim.py --bursts 0.01``, batch 1, the H100's cost
ratios, decisions timed without the noise: ``--score-clean``, stretches of 5 plain steps
decaying by 0.8), the controller kept 0.90 / 0.82 / 0.93 of the best fixed k at acceptance
0.3 / 0.5 / 0.9 before, 0.96 / 0.97 / 0.99 with the window, the quartile, the bound on
outliers and the two changes that came with them (``scheduler.goodput``'s interpolation
between trusted widths only, and ``scheduler.acceptance``'s ``POSITION_PRIOR``); without the
stretches, as before (docs/performance.md, "Efficiency against an oracle").

Kinds: ``"step"``, the whole step less the proposer (schedule, forward, verification, appends,
rollback: the host work of the speculative path is in it), ``"packed"``, the same for a step
that the runner packed into ``w`` rows of one token (by their batch bucket: ``ModelRunner.
packed_rows``), ``"propose"``, the proposer's time for ``w`` requested drafts, and
``"probe"``, the same for a proposal that follows steps without one (a probe's: it catches up
on those steps, and is never a typical proposal).

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

SAMPLES = 15  # recent measurements kept per cell
TRUSTED = 3  # below this many a cell answers its fastest sample (optimism: it is tried again)
WINDOW = 128  # a sample older than this many recorded steps of its batch size is dropped
SWEEP = 16  # recorded steps of a batch size between looks at its cells' ages
OUTLIER = 1.5  # a trusted cell leaves out a sample over this many times its answer ...
SKIP_LIMIT = 8  # ... unless it left out this many in a row (then its cost moved)
STEPS = ("step", "packed")  # the kinds that are whole steps (a batch size's clock counts them)


def _plain(key: tuple[str, int, int]) -> bool:
    """Whether a cell is a plain step's (it never expires: see the module docstring)."""
    return key[0] == "step" and key[2] == 1


class StepCostTable:
    """Recent seconds per ``(kind, batch_size, width)``, their lower quartile (see the module
    docstring)."""

    def __init__(self, batch_bucket: Callable[[int], int] = int) -> None:
        self.batch_bucket = batch_bucket
        # (recorded step of its batch size, seconds), oldest first
        self._samples: dict[tuple[str, int, int], deque[tuple[int, float]]] = {}
        self._answer: dict[tuple[str, int, int], float] = {}  # each cell's answer
        self._clock: dict[int, int] = {}  # bucket -> its steps recorded
        self._skipped: dict[tuple[str, int, int], int] = {}  # outliers left out in a row
        self._plain_batches: list[int] = []  # buckets with a measured plain step
        self._nearest: dict[int, list[int]] = {}  # bucket -> _plain_batches nearest first
        self.version = 0  # bumped when an answer may change (moved, began or emptied)

    def record(self, kind: str, batch_size: int, width: int, seconds: float) -> None:
        bucket = self.batch_bucket(batch_size)
        key = (kind, bucket, width)
        if kind in STEPS:
            clock = self._clock[bucket] = self._clock.get(bucket, 0) + 1
            if clock % SWEEP == 0:
                self._sweep(bucket, clock)
        else:
            clock = self._clock.get(bucket, 0)
        samples = self._samples.get(key)
        if samples is None:  # a cell's first step is a warm-up: not recorded (see above)
            self._samples[key] = deque(maxlen=SAMPLES)
            return
        answer = self._answer.get(key)
        if answer is not None and len(samples) >= TRUSTED and seconds > OUTLIER * answer:
            skipped = self._skipped.get(key, 0)
            if skipped < SKIP_LIMIT:  # (a slow stretch, left out: see above; past the limit
                self._skipped[key] = skipped + 1  # the cost moved, and every one is taken)
                return
        else:
            self._skipped[key] = 0
        samples.append((clock, seconds))
        self._update(key, samples, clock)

    def _sweep(self, bucket: int, clock: int) -> None:
        """Drop the samples of ``bucket``'s cells that are older than ``WINDOW`` (not the plain
        step's: see the module docstring)."""
        for key, samples in self._samples.items():
            if (key[1] == bucket and not _plain(key) and samples
                    and samples[0][0] <= clock - WINDOW):
                self._update(key, samples, clock)

    def _update(self, key: tuple[str, int, int], samples: deque[tuple[int, float]],
                clock: int) -> None:
        """The cell's answer from its samples of the last ``WINDOW`` steps."""
        plain = _plain(key)
        while not plain and samples and samples[0][0] <= clock - WINDOW:
            samples.popleft()
        if not samples:
            if self._answer.pop(key, None) is not None:
                self.version += 1
            return
        if plain and key not in self._answer:
            self._plain_batches.append(key[1])
            self._nearest.clear()
        ordered = sorted(seconds for _, seconds in samples)
        answer = ordered[len(ordered) // 4] if len(ordered) >= TRUSTED else ordered[0]
        if self._answer.get(key) != answer:
            self._answer[key] = answer
            self.version += 1

    def count(self, kind: str, batch_size: int, width: int) -> int:
        """Samples the cell holds (its warm-up step not counted)."""
        samples = self._samples.get((kind, self.batch_bucket(batch_size), width))
        return 0 if samples is None else len(samples)

    def samples(self, kind: str, batch_size: int, width: int) -> list[float]:
        """The cell's recent samples, oldest first (for benchmarks that show what a cost was
        made of)."""
        return [s for _, s in self._samples.get((kind, self.batch_bucket(batch_size), width),
                                                ())]

    def seconds(self, kind: str, batch_size: int, width: int) -> float | None:
        return self._answer.get((kind, self.batch_bucket(batch_size), width))

    def relative(self, kind: str, batch_size: int, width: int) -> float | None:
        """The cell over the plain step of its batch size, from the nearest batch size that
        has both (None: no batch size has both)."""
        bucket = self.batch_bucket(batch_size)
        nearest = self._nearest.get(bucket)
        if nearest is None:
            nearest = self._nearest[bucket] = sorted(
                self._plain_batches, key=lambda b: abs(math.log(b / bucket)))
        for b in nearest:
            cell = self._answer.get((kind, b, width))
            if cell is not None:
                return cell / self._answer[("step", b, 1)]
        return None
