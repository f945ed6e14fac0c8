"""The steps suite's summary of one timed run: time inside and outside ``step()``, each stage,
the steps the controller recorded (by width) and left out, percentiles, the slowest steps, the
controller's decisions, and every step in order."""

from __future__ import annotations

from collections import defaultdict

from benchmarks.suites.step_clock import LAUNCHES, STAGES, StepClock
from benchmarks.timing import percentiles


def timed(steps: list[dict]) -> dict:
    """How many steps, their seconds in all, their median in ms and each stage's mean in ms
    (a stage's own time, less the stages it calls; 0 where a step did not run it)."""
    seconds = sorted(s["s"] for s in steps)
    stages = defaultdict(float)
    for s in steps:
        for name, took in s["stages"].items():
            stages[name] += took
    return {"n": len(steps), "s": sum(seconds),
            "ms_median": 1e3 * seconds[len(seconds) // 2] if seconds else 0.0,
            "stages_ms_mean": {name: round(1e3 * took / len(steps), 3)
                               for name, took in sorted(stages.items(), key=lambda p: -p[1])}}


def decision_summary(decisions: list[dict]) -> dict:
    """Per kind of width choice (a probe, a step that chose drafts, one that chose none): how
    many, and the mean predicted token gain, realised gain and relative cost."""
    out = {}
    for name, picked in (("probe", [d for d in decisions if d["probe"]]),
                         ("drafted", [d for d in decisions if not d["probe"] and d["width"]]),
                         ("declined", [d for d in decisions
                                       if not d["probe"] and not d["width"]])):
        real = [d["real"] for d in picked if "real" in d]
        out[name] = {"n": len(picked),
                     "predicted": round(float(sum(d["predicted"] for d in picked))
                                        / max(len(picked), 1), 3),
                     "real": round(sum(real) / max(len(real), 1), 3),
                     "cost": round(sum(d["cost"] for d in picked) / max(len(picked), 1), 3)}
    return out


def summary(clock: StepClock, wall: float) -> dict:
    steps = clock.steps
    inside = sum(s["s"] for s in steps)
    recorded = [s for s in steps if s["recorded"] is not None]
    packed = [s["s"] for s in recorded if s.get("packed_rows")]
    by_width: dict[int, list[float]] = defaultdict(list)
    stages_by_width: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in recorded:
        by_width[s["recorded"][0]].append(s["recorded"][1])
        for name, took in s["stages"].items():
            stages_by_width[s["recorded"][0]][name] += took
    left_out = [s["s"] for s in steps if s["recorded"] is None]
    most = max((s["running"] for s in steps), default=0)  # (the run's whole batch)
    return {
        "wall_s": wall, "steps": len(steps), "ms_per_step": 1e3 * wall / max(len(steps), 1),
        "inside_step_s": inside, "outside_step_s": wall - inside,
        "stages_ms_per_step": {k.strip("_"): 1e3 * v / max(len(steps), 1)
                               for k, v in clock.stage_s.items()},
        "recorded_steps": len(recorded),
        "recorded_ms_mean": 1e3 * sum(s["s"] for s in recorded) / max(len(recorded), 1),
        "left_out_steps": len(left_out), "left_out_s": sum(left_out),
        "left_out_ms_max": 1e3 * max(left_out, default=0.0),
        "recorded_by_width": {w: {"n": len(v), "ms_median": 1e3 * sorted(v)[len(v) // 2],
                                  "stages_ms_mean": {k: round(1e3 * t / len(v), 3) for k, t
                                                     in stages_by_width[w].items()}}
                              for w, v in sorted(by_width.items())},
        "recorded_ms_percentiles": percentiles([s["s"] for s in recorded]),
        # steps the runner packed (one token a row: ModelRunner.packed_rows), their median
        "packed": {"n": len(packed), "ms_median": 1e3 * sorted(packed)[len(packed) // 2]
                   if packed else 0.0},
        # steps that only decode (or verify) against steps with a prompt's chunk in them
        "by_step_kind": {name: {"n": len(v), "s": sum(v),
                                "ms_median": 1e3 * sorted(v)[len(v) // 2] if v else 0.0}
                         for name, v in (("decode_only", [s["s"] for s in steps
                                                          if s.get("decode_only")]),
                                         ("with_prefill", [s["s"] for s in steps
                                                           if not s.get("decode_only")]))},
        # steps by how their next flight was launched (overlapped steps: step_clock.LAUNCHES)
        "by_launch": {name: timed([s for s in steps if s.get("launch") == name])
                      for name in LAUNCHES},
        # steps of the whole batch against those of fewer sequences (a closed batch's tail:
        # speculation ends its sequences at different steps)
        "by_batch": {"whole": timed([s for s in steps if s["running"] == most]),
                     "tail": timed([s for s in steps if s["running"] < most])},
        "stage_ms_percentiles": {name.strip("_"): percentiles(
            [s["stages"].get(name.strip("_"), 0.0) for s in recorded])
            for name in STAGES},
        # (where a mean and a median part: the slowest steps, whole)
        "slowest": [{**{k: v for k, v in s.items() if k not in ("start", "recorded", "stages")},
                     "index": i, "ms": round(1e3 * s["s"], 3),
                     "stages_ms": {k: round(1e3 * v, 3) for k, v in s["stages"].items()}}
                    for i, s in sorted(enumerate(recorded), key=lambda p: -p[1]["s"])[:6]],
        "decisions": decision_summary(clock.decisions),
        # every step in order: [width recorded (0: not recorded), ms, graphs captured so far]
        "trace": [[s["recorded"][0] if s["recorded"] else 0, round(1e3 * s["s"], 3),
                   s.get("graphs", 0)] for s in steps],
        # every step in order: how its next forward was launched, its unfinished sequences
        "launches": [s.get("launch") for s in steps],
        "running": [s["running"] for s in steps],
        "left_out": [{**{k: v for k, v in s.items() if k not in ("start", "recorded",
                                                                 "stages")},
                      "index": i, "ms": 1e3 * s["s"]}
                     for i, s in enumerate(steps) if s["recorded"] is None],
    }
