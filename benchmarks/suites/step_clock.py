"""The steps suite's instruments: a clock on one engine's step and its stages, the controller's
decisions, and the garbage collector's pauses.

The clock wraps methods on the instance (nothing of the engine changes for other engines). It
knows the engine's stage methods by name (:data:`STAGES`, the stages ``LLMEngine._run_step``
calls; ``_learn`` may run twice a step, both counted; an overlapped step's :data:`FLIGHT_STAGES`
and, in an engine that overlaps, its runner's and proposer's :data:`PART_STAGES`; while
:func:`reads_timed` is on, the read of a flight's tokens, the one class method it wraps) and
reads the values they return (the
``Proposed`` proposal, the ``Forwarded`` forward with its ``ForwardOutput``: steady, packed);
whether the controller timed a step it reads from the ``StepOutcome`` the controller learns
(``SpeculationController.learn``; on a GPU during the next step). When the step's stages change,
this file changes with them.
"""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine.overlap import InFlight, Pending
from scheduler import GoodputPolicy
from scheduler.goodput import expected_by_width

STAGES = ("_schedule", "_propose", "_forward", "_learn", "_verify", "_commit", "_record")
# How a step's forward was launched (overlapped steps, engine.overlap): from the host (the
# synchronous stages ran: a prefill, a plan that cannot overlap), ahead from a drafting flight's
# chains (a drafting flight, or a plain one), ahead as a drafting flight after a plain one, a
# plain flight after a plain one, a step sampled once the one before commits, or none (the step
# only committed the flight in flight: the next one starts from the host).
LAUNCHES = ("host", "chained", "chained_plain", "drafting", "plain", "pending", "none")
# An overlapped step's own stages (engine.flight_steps), timed as STAGES are: launching the next
# flight (from the one before, from its chains, as a drafting flight after a plain one; writing
# a plain flight's pairs into a draft head's cache), sampling or verifying it ahead, committing
# the one before; and ``_read``: the commit's read of that flight's tokens, the host waiting
# for the device (``InFlight.token_ids``, timed while :func:`reads_timed` is on).
FLIGHT_STAGES = ("_launch_next", "_launch_chained", "_launch_drafting", "_write_pairs",
                 "_sample_ahead", "_verify_ahead", "_commit_flight")
# Inside them, an overlapping engine's parts, timed the same way (the stages above then count
# their own time without these): the runner's forwards (their layout, graph replay and launch)
# and the proposer's work on the device (its drafts, its pairs written).
PART_STAGES = (("runner", ("forward", "forward_chains")),
               ("proposer", ("verify_and_draft", "draft_after", "write_after")))
READ = "_read"
_stepping: list[StepClock] = []  # the clock whose step is running (reads_timed's)


class StepClock:
    """Times ``engine.step`` and its stages, and notes what decided whether the controller
    timed each step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.stage_s: dict[str, float] = defaultdict(float)
        self.steps: list[dict] = []  # per step: start, seconds, recorded width or None
        self.decisions: list[dict] = []  # the controller's width choices, predicted and real
        self._now: dict = {}  # the step being run
        self._cur: dict[str, float] = {}  # its stage times
        self._values: dict[str, Any] = {}  # what its stages returned
        self._nested = 0.0  # seconds of the stages inside the running one
        self._started: set[str] = set()  # the stages this step has begun
        for name in STAGES:
            setattr(engine, name, self._timed(name, getattr(engine, name)))
        self._step, engine.step = engine.step, self._timed_step
        self._launched: str | None = None  # how the step's next flight was launched
        for name in FLIGHT_STAGES:  # (an engine that overlaps steps)
            if hasattr(engine, name):
                fn = getattr(engine, name)
                if name.startswith("_launch_"):
                    fn = self._noted(name, fn)
                setattr(engine, name, self._timed(name, fn))
        for part, names in PART_STAGES if getattr(engine, "overlap", False) else ():
            owner = getattr(engine, part, None)
            for name in names if owner is not None else ():
                if hasattr(owner, name):
                    setattr(owner, name, self._timed(f"{part}.{name}", getattr(owner, name)))
        controller = engine.controller
        self._learn, controller.learn = controller.learn, self._on_learn
        if isinstance(controller, GoodputPolicy):
            ctl = controller.controller
            self._choose_width, ctl.choose_width = ctl.choose_width, self._on_choose_width

    def _timed(self, name, fn):
        """``fn`` timed as stage ``name``: its own time, less the stages it calls (``_record``
        may call ``_learn``), so that a step's stages add up to at most the step."""
        def run(*args, **kwargs):
            start, outer = time.perf_counter(), self._nested
            self._nested = 0.0
            self._started.add(name)
            try:
                self._values[name] = out = fn(*args, **kwargs)
                return out
            finally:
                took = time.perf_counter() - start
                own, self._nested = took - self._nested, outer + took
                self.stage_s[name] += own
                key = name.strip("_")
                self._cur[key] = self._cur.get(key, 0.0) + own
        return run

    def _noted(self, name, fn):
        """``fn``, noting the kind of flight it launched (:data:`LAUNCHES`): the innermost
        launch names it (``_launch_next`` calls the other two)."""
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            if name == "_launch_next" and self._launched is None:
                self._launched = ("none" if out is None else "pending"
                                  if isinstance(out, Pending) else "plain")
            elif out is not None and name != "_launch_next":
                self._launched = ("drafting" if name == "_launch_drafting"
                                  else "chained" if out.chain is not None else "chained_plain")
            return out
        return run

    def _on_choose_width(self, accs, avail, backed, min_width, critical=None, batch_size=None,
                         *args, **kwargs):
        """``GoodputController.choose_width``, and what it weighed: the predicted token gain and
        relative cost of the width it chose."""
        ctl = self.engine.controller.controller
        probing = ctl.probing
        width = self._choose_width(accs, avail, backed, min_width, critical, batch_size, *args,
                                   **kwargs)
        if accs:
            tokens = expected_by_width(ctl.acceptance.rates(accs, backed), avail)
            cost = ctl.step_cost(len(accs) if batch_size is None else batch_size)[1:]
            self.decisions.append({"probe": probing, "width": width, "n": len(accs),
                                   "critical": len(accs) if critical is None else sum(critical),
                                   "predicted": float(tokens[width] / tokens[0]),
                                   "cost": float(cost[width])})
        return width

    def _on_learn(self, outcome, defer: bool = False) -> None:
        """A step's outcome: this step's once its ``_record`` began, else the last step's."""
        step = (self._now if "_record" in self._started else
                self.steps[-1] if self.steps else None)
        if step is not None and outcome.timing is not None:
            step["recorded"] = (outcome.timing.width, outcome.timing.step_s)
        last = self.decisions[-1] if self.decisions else None
        if last is not None and "real" not in last and any(outcome.drafted):
            n = len(outcome.seqs)
            kept = sum(min(a, d) for a, d in zip(outcome.accepted, outcome.drafted, strict=True))
            last["real"] = (n + kept) / max(n, 1)
        return self._learn(outcome, defer)

    def _info(self) -> dict:
        """The step's values: what decides whether the controller times it."""
        forwarded, proposed = self._values.get("_forward"), self._values.get("_propose")
        items = forwarded.items if forwarded is not None else []
        graphs = self.engine.runner.graphs
        return {
            "items": len(items), "width": 1 + max((item.depth for item in items), default=0),
            "verified": bool(self._values.get("_verify")),
            "steady": forwarded is not None and forwarded.output.steady,
            "packed_rows": forwarded.output.packed_rows if forwarded is not None else None,
            "decode_only": all(i.samples and i.num_context_tokens == 1 for i in items),
            "propose_ms": 1e3 * proposed.seconds if proposed is not None else 0.0,
            "typical_proposal": proposed is not None and proposed.typical,
            "after_idle": proposed is not None and proposed.after_idle,
            "graphs": 0 if graphs is None else graphs.num_graphs,
            "head_graphs": head_graphs(self.engine.proposer),
            "launch": "host" if "_forward" in self._started else self._launched or "none"}

    def read_timed(self, read, flight):
        """A flight's token read, timed as stage :data:`READ` of this clock's step."""
        return self._timed(READ, read)(flight)

    def _timed_step(self):
        self._now, self._cur, self._values, self._started = {"recorded": None}, {}, {}, set()
        self._launched = None
        # the sequences the step can run: those not finished when it starts, at most a batch
        # (fewer: a closed batch's tail)
        scheduler = self.engine.scheduler
        self._now["running"] = min(len(scheduler.running) + len(scheduler.waiting),
                                   scheduler.max_num_seqs)
        start = time.perf_counter()
        _stepping.append(self)
        try:
            out = self._step()
        finally:
            _stepping.pop()
        self._now.update(start=start, s=time.perf_counter() - start, stages=self._cur,
                         **self._info())
        self.steps.append(self._now)
        return out

    def reset(self) -> None:
        self._values = {}  # (the last step's outputs: device tensors, let go)
        self.stage_s.clear()
        self.steps.clear()
        self.decisions.clear()


@contextmanager
def reads_timed() -> Iterator[None]:
    """While on, a flight's token read (``InFlight.token_ids``: the wait for the device and the
    list) inside a clocked step is that step's :data:`READ` stage; off, the class is as found
    (the read is a class's method: every engine of the process shares it)."""
    read = InFlight.token_ids

    def timed_read(flight: InFlight) -> list[int]:
        return _stepping[-1].read_timed(read, flight) if _stepping else read(flight)

    InFlight.token_ids = timed_read
    try:
        yield
    finally:
        InFlight.token_ids = read


def head_graphs(proposer: Any) -> int | None:
    """The CUDA graphs a draft head's proposals captured so far (None: no head, or eager): a
    slow step where it grows captured one."""
    graphs = getattr(proposer, "graphs", None) or getattr(getattr(proposer, "head", None),
                                                          "graphs", None)
    return None if graphs is None else graphs.num_graphs


class GcPauses:
    """The garbage collector's pauses during a timed run (``gc.callbacks``): host time that
    no stage owns."""

    def __init__(self) -> None:
        self._start = 0.0
        self.counts = [0, 0, 0]  # collections by generation
        self.seconds = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.counts[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._start

    def reset(self) -> None:
        self.counts, self.seconds = [0, 0, 0], 0.0

    def close(self) -> None:
        """Stop listening (the callback is process-wide)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def summary(self) -> dict:
        return {"gc_collections": list(self.counts), "gc_ms": round(1e3 * self.seconds, 3)}
