"""Plots of :func:`speedup_lib.run_sweep` results (matplotlib), for the notebook and the script."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from speedup_lib import LABELS, SPEC_METHODS, Measurement, find, measured_speedup

COLORS = {"none": "black", "ngram": "tab:blue", "early_exit": "tab:orange", "eagle": "tab:red",
          "ngram_eagle": "tab:purple", "hf": "grey", "hf_prompt_lookup": "tab:green"}
KIND_TITLES = {"copy": "prompts that copy (edit code, quote, reformat a list)",
               "open": "open-ended prompts"}


def _grid(results: list[Measurement]) -> tuple[list[int], list[str]]:
    batch_sizes = sorted({m.batch_size for m in results})
    kinds = [k for k in ("copy", "open") if any(m.kind == k for m in results)]
    return batch_sizes, kinds


def _panel_grid(results: list[Measurement]) -> tuple[Figure, list[tuple[object, int, str]]]:
    """A figure with one panel per (batch size, prompt kind), x axes shared, and its panels as
    ``(ax, batch_size, kind)``."""
    batch_sizes, kinds = _grid(results)
    fig, axes = plt.subplots(len(batch_sizes), len(kinds), squeeze=False, sharex=True,
                             figsize=(6 * len(kinds), 3.8 * len(batch_sizes)))
    return fig, [(axes[row][col], batch_size, kind) for row, batch_size in enumerate(batch_sizes)
                 for col, kind in enumerate(kinds)]


def plot_tokens_per_s(results: list[Measurement]) -> Figure:
    """tokens/s against k for each method; methods without k, and each proposer under the
    default policy (dotted, in its colour), are horizontal lines. One panel per (batch size,
    prompt kind)."""
    fig, panels = _panel_grid(results)
    for ax, batch_size, kind in panels:
        for method in (*SPEC_METHODS, "hf_prompt_lookup"):
            runs = find(results, method, kind, batch_size)
            if runs:
                ax.plot([m.k for m in runs], [m.tokens_per_s for m in runs], "o-",
                        color=COLORS[method], label=LABELS[method])
            for m in find(results, method, kind, batch_size, policy=True):
                ax.axhline(m.tokens_per_s, color=COLORS[method], linestyle=":",
                           label=f"{LABELS[method]}, default policy (k <= {m.k})")
        for method, style in (("none", "-"), ("hf", "--")):
            runs = find(results, method, kind, batch_size)
            if runs:
                ax.axhline(runs[0].tokens_per_s, color=COLORS[method], linestyle=style,
                           label=LABELS[method])
        _style(ax, batch_size, kind, "k (draft tokens per step)", "tokens/s")
    panels[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_acceptance_per_position(results: list[Measurement], batch_size: int = 1) -> Figure:
    """Acceptance rate at each draft position (drafts accepted at position i / drafts verified
    there, a draft after a rejected one counting as verified and not accepted), for the largest
    fixed k measured, per method and prompt kind."""
    _, kinds = _grid(results)
    fig, axes = plt.subplots(1, len(kinds), squeeze=False, figsize=(6 * len(kinds), 3.5))
    for col, kind in enumerate(kinds):
        ax = axes[0][col]
        for method in SPEC_METHODS:
            runs = find(results, method, kind, batch_size)
            if runs:
                m = runs[-1]
                positions = range(1, len(m.acceptance_per_position) + 1)
                ax.plot(positions, m.acceptance_per_position, "o-", color=COLORS[method],
                        label=f"{LABELS[method]}, k={m.k}")
        _style(ax, batch_size, kind, "draft position", "accepted / drafted", top=1.05)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_speedup_vs_theory(results: list[Measurement]) -> Figure:
    """Measured speedup over the engine without speculation (solid) against Leviathan's
    prediction from the same run's alpha and c (dashed), per k. One panel per (batch size,
    prompt kind)."""
    fig, panels = _panel_grid(results)
    for ax, batch_size, kind in panels:
        for method in SPEC_METHODS:
            runs = find(results, method, kind, batch_size)
            if not runs:
                continue
            ks = [m.k for m in runs]
            ax.plot(ks, [measured_speedup(m, results) for m in runs], "o-",
                    color=COLORS[method], label=f"{LABELS[method]}: measured")
            ax.plot(ks, [m.predicted_speedup for m in runs], "s--", color=COLORS[method],
                    alpha=0.6, label=f"{LABELS[method]}: Leviathan")
        ax.axhline(1.0, color="black", linewidth=0.8)
        _style(ax, batch_size, kind, "k (draft tokens per step)", "speedup over no speculation")
    panels[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _style(ax, batch_size: int, kind: str, xlabel: str, ylabel: str,
           top: float | None = None) -> None:
    """The panel title, axis labels, a y axis from 0, and a light grid, as every plot here uses."""
    ax.set_title(f"batch {batch_size}, {kind} prompts")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0, top=top)
    ax.grid(alpha=0.3)
