"""Bar chart of end-to-end tokens/s from ``benchmarks/e2e.py --json`` files, one panel per file.

    python benchmarks/plot_e2e.py docs/perf/e2e_h200_llama1b_594b852.json \
        docs/perf/e2e_h200_llama8b_9679cdb.json --kind copy --out docs/img/e2e_h200.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def panel(ax, result: dict, kind: str) -> None:
    """Grouped bars: one group per batch size, one bar per system, log tokens/s."""
    rows = [r for r in result["results"] if r["kind"] == kind]
    batches = sorted({r["batch_size"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        xs, ys = [], []
        for j, b in enumerate(batches):
            for r in rows:
                if r["system"] == system and r["batch_size"] == b:
                    xs.append(j + (i - (len(systems) - 1) / 2) * width)
                    ys.append(r["tokens_per_s"])
        ax.bar(xs, ys, width, label=system)
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s (log)")
    args = result["args"]
    ax.set_title(f"{args['model']}, {args['dtype']}, {result['machine']['device_name']}, "
                 f"{kind} prompts, k={args['k']}", fontsize=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, nargs="+")
    parser.add_argument("--kind", default="copy", help="copy or open")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    fig, axes = plt.subplots(1, len(args.json), figsize=(5 * len(args.json), 3.6), squeeze=False)
    for ax, path in zip(axes[0], args.json, strict=True):
        panel(ax, json.loads(path.read_text()), args.kind)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
