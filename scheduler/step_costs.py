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
for a new shape).

A trusted cell also leaves out a sample over ``OUTLIER`` times its answer, unless it left out
the ``SKIP_LIMIT`` before it too (then the cost moved, and such samples are taken until one
comes within the bound again): a slow stretch from outside the engine can last longer than a
quartile shrugs off (docs/history.md, "How the measurements were learned").

Samples expire (but the plain step's, which every cost is relative to: while drafting pays no
plain step comes to measure it again): one older than ``WINDOW`` recorded steps of its batch
size is dropped (the cells' ages are looked at every ``SWEEP`` steps), so a width that the
controller stopped choosing is measured again (it then reads as not measured: optimistic,
``scheduler.goodput``). Without it a width measured in one slow stretch keeps that cost for
good, and the controller never chooses it again (docs/design.md, "Measured reasons behind the
runner's choices").

Costs are read at one context. A step's time grows with its context (the keys every row
gathers), and while drafting pays no plain step comes: the plain step's samples would be a
batch's first ones, every later width's longer ones, and each width would read dearer than it
is. So every whole step's sample keeps its context (``kv``: its longest sequence's tokens), a
batch size has a *drift*: the median slope of log seconds over context between pairs of one
cell's samples ``MIN_KV_SPAN`` tokens apart or more (at least 0), and every answer is read at
the batch size's *reference* context, which follows the steps in bands of ``KV_BAND`` tokens:
each sample is scaled by ``exp(drift * (reference - its context))``. Only from
``DRIFT_MIN_BATCH`` sequences: where the keys' reads are a small part of a step, the drift is
small against the steps' noise, and its estimate is that noise (docs/design.md, "Measured
reasons behind the runner's choices").

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
KV_BAND = 32  # a batch size's reference context moves in steps of this many tokens ...
MIN_KV_SPAN = 16  # ... two samples of a cell this far apart in context give a slope ...
MIN_DRIFT_PAIRS = 8  # ... and this many pairs a drift ...
DRIFT_MIN_BATCH = 16  # ... at batch sizes (buckets) of at least this many sequences


def _plain(key: tuple[str, int, int]) -> bool:
    """Whether a cell is a plain step's (it never expires: see the module docstring)."""
    return key[0] == "step" and key[2] == 1


class StepCostTable:
    """Recent seconds per ``(kind, batch_size, width)``, their lower quartile (see the module
    docstring)."""

    def __init__(self, batch_bucket: Callable[[int], int] = int) -> None:
        self.batch_bucket = batch_bucket
        # (recorded step of its batch size, seconds, the step's context), oldest first
        self._samples: dict[tuple[str, int, int], deque[tuple[int, float, int]]] = {}
        self._kv_ref: dict[int, int] = {}  # bucket -> the context its answers are read at
        self._drift: dict[int, float] = {}  # bucket -> log seconds per token of context
        self._answer: dict[tuple[str, int, int], float] = {}  # each cell's answer
        self._clock: dict[int, int] = {}  # bucket -> its steps recorded
        self._skipped: dict[tuple[str, int, int], int] = {}  # outliers left out in a row
        self._plain_batches: list[int] = []  # buckets with a measured plain step
        self._nearest: dict[int, list[int]] = {}  # bucket -> _plain_batches nearest first
        self.version = 0  # bumped when an answer may change (moved, began or emptied)

    def record(self, kind: str, batch_size: int, width: int, seconds: float,
               kv: int = 0) -> None:
        """A sample of ``seconds``; ``kv``: the step's context (its longest sequence's cached
        and new tokens; 0 where unknown: no drift is then seen)."""
        bucket = self.batch_bucket(batch_size)
        key = (kind, bucket, width)
        if kind in STEPS:
            clock = self._clock[bucket] = self._clock.get(bucket, 0) + 1
            kv = kv if bucket >= DRIFT_MIN_BATCH else 0  # (see the module docstring)
            ref = self._kv_ref.get(bucket)
            moved = ref is not None and abs(kv - ref) >= KV_BAND
            if ref is None or moved:
                self._kv_ref[bucket] = kv
            if moved or clock % SWEEP == 0:  # (moved: every answer read at the new context)
                self._sweep(bucket, clock)
        else:
            clock, kv = self._clock.get(bucket, 0), 0
        samples = self._samples.get(key)
        if samples is None:  # a cell's first step is a warm-up: not recorded (see above)
            self._samples[key] = deque(maxlen=SAMPLES)
            return
        answer = self._answer.get(key)
        at_ref = self._at_ref(bucket, kv) if kind in STEPS else 1.0
        if answer is not None and len(samples) >= TRUSTED and seconds * at_ref > OUTLIER * answer:
            skipped = self._skipped.get(key, 0)
            if skipped < SKIP_LIMIT:  # (a slow stretch, left out: see above; past the limit
                self._skipped[key] = skipped + 1  # the cost moved, and every one is taken)
                return
        else:
            self._skipped[key] = 0
        samples.append((clock, seconds, kv))
        self._update(key, samples, clock)

    def drift(self, batch_size: int) -> float:
        """How a step's log seconds grow per token of context at this batch size's bucket (the
        estimate :meth:`plain_seconds` reads steps through; 0 where none is)."""
        return self._drift.get(self.batch_bucket(batch_size), 0.0)

    def _at_ref(self, bucket: int, kv: int) -> float:
        """The factor that takes a step's seconds at context ``kv`` to the bucket's reference
        context (see the module docstring)."""
        drift = self._drift.get(bucket, 0.0)
        return math.exp(drift * (self._kv_ref.get(bucket, kv) - kv)) if drift else 1.0

    def _sweep(self, bucket: int, clock: int) -> None:
        """Estimate ``bucket``'s drift again, then read its cells' answers again at its
        reference context, dropping samples older than ``WINDOW`` (not the plain step's: see
        the module docstring)."""
        self._drift[bucket] = self._estimate_drift(bucket)
        for key, samples in self._samples.items():
            if key[1] == bucket and samples:
                self._update(key, samples, clock)

    def _estimate_drift(self, bucket: int) -> float:
        """How a step's log seconds grow per token of context at ``bucket``: the median slope
        of the pairs of samples of one cell at least ``MIN_KV_SPAN`` tokens apart (whole steps
        only), at least 0; the last estimate while fewer than ``MIN_DRIFT_PAIRS`` pairs are."""
        if bucket < DRIFT_MIN_BATCH:
            return 0.0
        slopes = []
        for key, samples in self._samples.items():
            if key[1] != bucket or key[0] not in STEPS or len(samples) < 2:
                continue
            points = [(kv, math.log(seconds)) for _, seconds, kv in samples if seconds > 0]
            for i, (kv_i, log_i) in enumerate(points):
                for kv_j, log_j in points[i + 1:]:
                    if abs(kv_j - kv_i) >= MIN_KV_SPAN:
                        slopes.append((log_j - log_i) / (kv_j - kv_i))
        if len(slopes) < MIN_DRIFT_PAIRS:
            return self._drift.get(bucket, 0.0)
        slopes.sort()
        return max(0.0, slopes[len(slopes) // 2])

    def _update(self, key: tuple[str, int, int], samples: deque[tuple[int, float, int]],
                clock: int) -> None:
        """The cell's answer from its samples of the last ``WINDOW`` steps, each taken to its
        batch size's reference context (whole steps only)."""
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
        bucket = key[1]
        drift, ref = self._drift.get(bucket), self._kv_ref.get(bucket)
        if key[0] in STEPS and drift and ref is not None:
            # (:meth:`_at_ref` of each sample, the bucket's drift and reference read once: an
            # overlapped engine records a step's costs on the critical path)
            exp = math.exp
            ordered = sorted([seconds * exp(drift * (ref - kv)) for _, seconds, kv in samples])
        else:
            ordered = sorted(seconds for _, seconds, _ in samples)
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
        return [s for _, s, _ in self._samples.get((kind, self.batch_bucket(batch_size), width),
                                                   ())]

    def seconds(self, kind: str, batch_size: int, width: int) -> float | None:
        return self._answer.get((kind, self.batch_bucket(batch_size), width))

    def plain_seconds(self, batch_size: int, kv: int = 0) -> float | None:
        """The plain step's seconds at this batch size's bucket, read at context ``kv`` (the
        answer is at the bucket's reference context; None: no plain step measured there)."""
        bucket = self.batch_bucket(batch_size)
        answer = self._answer.get(("step", bucket, 1))
        if answer is None:
            return None
        return answer / self._at_ref(bucket, kv if bucket >= DRIFT_MIN_BATCH else 0)

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
