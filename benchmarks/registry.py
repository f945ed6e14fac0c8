"""The suites of ``python -m benchmarks``: name -> module and what it measures.

A suite module defines ``add_arguments(parser)`` and ``run(args) -> Result | None``, or, when
it measures several things, ``CASES``: case name -> :class:`Case` (``python -m benchmarks
<suite> <case> [options]``). Modules are imported only when their suite runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

SUITES: dict[str, tuple[str, str]] = {
    "e2e": ("benchmarks.suites.e2e",
            "tokens/s of the engine with and without speculation, beside HF generate"),
    "steps": ("benchmarks.suites.steps",
              "where a run's time goes: each stage of every engine step, the controller's view"),
    "runner": ("benchmarks.suites.runner",
               "one runner step: against HF (vs-hf), mixed-step and packed-step layouts"),
    "efficiency": ("benchmarks.suites.efficiency",
                   "an oracle proposer of set acceptance: speedup against the ideal, drift"),
    "proposers": ("benchmarks.suites.proposers",
                  "proposer cost and acceptance, n-gram at scale, early exit, the draft head"),
    "draft_trees": ("benchmarks.suites.draft_trees",
                    "tokens per step of draft-tree shapes, counted offline from the head"),
    "controller": ("benchmarks.suites.controller",
                   "the speculation controller: simulated against fixed k, its host cost"),
    "serve": ("benchmarks.suites.serve",
              "the server: Poisson arrivals (arrivals), its TPOT over LLM.generate (overhead)"),
    "parallel": ("benchmarks.suites.parallel",
                 "one GPU, layers over GPUs, tensor parallel; all-reduce latency; the session"),
    "samplers": ("benchmarks.suites.samplers",
                 "microseconds per verification call against the memory floor"),
    "attention": ("benchmarks.suites.attention",
                  "a step's attention over all layers: gather + SDPA against paged reads"),
    "decode_limit": ("benchmarks.suites.decode_limit",
                     "plain decoding beside the weight-plus-KV read limit; host time per step"),
    "overlap": ("benchmarks.suites.overlap",
                "speculative steps overlapped against synchronous ones, fixed k and controller"),
    "structured": ("benchmarks.suites.structured",
                   "JSON Schema output with and without speculation, forced tokens as drafts"),
    "profile": ("benchmarks.suites.profile",
                "one LLM.generate under the torch profiler: host operators and kernels"),
    "deterministic": ("benchmarks.suites.deterministic",
                      "deterministic mode: greedy speculation equal to plain decoding, its cost"),
    "reuse": ("benchmarks.suites.reuse",
              "prefix caching (TTFT, multi-turn chat) and suffix decoding (an agent's stream)"),
}


@dataclass(frozen=True)
class Case:
    """One thing a suite measures: its help line, its arguments and its run."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Any]


def load(name: str) -> ModuleType:
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}: allowed {', '.join(SUITES)}")
    return importlib.import_module(SUITES[name][0])
