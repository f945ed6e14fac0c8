"""The parallel suite's table: measured layouts (their records) against one GPU's.

    python -m benchmarks parallel table single.json pipeline.json tp-none.json tp-ngram.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.record import Result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, help="records of `parallel run`")


def run(args: argparse.Namespace) -> Result:
    return Result(table(args.files))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(files: list[Path]) -> list[dict]:
    """Every layout's rows against one GPU's (the ``single`` rows), printed."""
    rows = [row for f in files for row in json.loads(f.read_text())["rows"]]
    base = {(r["batch_size"], r["method"]): r for r in rows if r["layout"] == "single"}
    print(f"{'layout':<16} {'method':<6} {'batch':>5} {'tok/s':>9} {'vs 1 GPU':>8} "
          f"{'vs 1 GPU none':>13} {'accept':>6} {'=1 GPU':>6}")
    out = []
    for r in rows:
        same = base.get((r["batch_size"], r["method"]))
        plain = base.get((r["batch_size"], "none"))
        entry = {"layout": r["layout"], "method": r["method"], "batch_size": r["batch_size"],
                 "tokens_per_s": r["tokens_per_s"],
                 "vs_single": r["tokens_per_s"] / same["tokens_per_s"] if same else None,
                 "vs_single_none": r["tokens_per_s"] / plain["tokens_per_s"] if plain else None,
                 "acceptance_rate": r["acceptance_rate"],
                 "outputs_equal_single": None if same is None else r["outputs"] == same[
                     "outputs"]}
        out.append(entry)
        print(f"{r['layout']:<16} {r['method']:<6} {r['batch_size']:>5} {r['tokens_per_s']:>9.1f} "
              f"{_fmt(entry['vs_single']):>8} {_fmt(entry['vs_single_none']):>13} "
              f"{_fmt(entry['acceptance_rate']):>6} {str(entry['outputs_equal_single']):>6}")
    return out
