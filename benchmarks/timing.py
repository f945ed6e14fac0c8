"""Timing shared by the suites: CUDA synchronisation, systems taking turns in one process, and
what else the machine did meanwhile (the hypervisor's steal, the load average).

On a shared machine a ratio holds only between runs close in time: every suite that compares
systems runs them in one process, taking turns, so that a change in the machine's load hits them
alike; :class:`Contention` notes how disturbed the whole run was.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA); nothing on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) CPU ticks of the machine since boot (``/proc/stat``), None off Linux."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (ticks[7], sum(ticks)) if len(ticks) > 7 else None


def tick_delta(before: tuple[int, int] | None,
               after: tuple[int, int] | None) -> tuple[int, int] | None:
    """(stolen, all) ticks between two :func:`cpu_ticks` readings, None off Linux."""
    if before is None or after is None:
        return None
    return after[0] - before[0], after[1] - before[1]


def steal_share(ticks: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time the hypervisor took: on a shared VM it slows
    everything by that much, unevenly in time."""
    return None if ticks is None else ticks[0] / max(ticks[1], 1)


def timed(fn: Callable[[], Any], device: torch.device | str
          ) -> tuple[Any, float, tuple[int, int] | None]:
    """(``fn()``, its seconds, the (stolen, all) CPU ticks meanwhile), synchronised on CUDA."""
    sync(device)
    before = cpu_ticks()
    start = time.perf_counter()
    out = fn()
    sync(device)
    seconds = time.perf_counter() - start
    return out, seconds, tick_delta(before, cpu_ticks())


def seconds_of(fn: Callable[[], Any], device: torch.device | str) -> float:
    """Seconds of one synchronised ``fn()``."""
    return timed(fn, device)[1]


def take_turns(step: Callable[[str], float], systems: Iterable[str], warmup: int,
               iters: int) -> dict[str, float]:
    """Each system's median of ``iters`` timed ``step(system)`` calls (``step`` returns what it
    measured), the systems taking turns after ``warmup`` untimed calls of each."""
    systems = list(systems)
    times: dict[str, list[float]] = {s: [] for s in systems}
    for system in systems:
        for _ in range(warmup):
            step(system)
    for _ in range(iters):
        for system in systems:
            times[system].append(step(system))
    return {s: statistics.median(t) for s, t in times.items()}


def percentiles(seconds: list[float]) -> dict[str, float]:
    """Median, 90th percentile and maximum of ``seconds``, in milliseconds."""
    if not seconds:
        return {}
    ordered = sorted(seconds)
    return {q: round(1e3 * ordered[min(int(f * len(ordered)), len(ordered) - 1)], 3)
            for q, f in (("p50", 0.5), ("p90", 0.9), ("max", 1.0))}


class Contention:
    """What else the machine did over a span: the steal share, the load average at both ends."""

    def __init__(self) -> None:
        self._ticks = cpu_ticks()
        self._load = _loadavg()

    def notes(self) -> dict:
        return {"steal": steal_share(tick_delta(self._ticks, cpu_ticks())),
                "load_before": self._load, "load_after": _loadavg(),
                "cpu_count": os.cpu_count()}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
