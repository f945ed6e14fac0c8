"""Writes the example notebooks from their cell sources, and optionally executes them in place.

    python examples/build_notebooks.py                 # write 01..03 without outputs
    python examples/build_notebooks.py --execute       # write, then run each top to bottom
    SPECDEC_QUICK=1 python examples/build_notebooks.py --execute 02_speedups
    python examples/build_notebooks.py --refresh-text 02_speedups  # new prose, outputs kept

The cell sources live in :mod:`notebook_sources`; edit them there, not in the ``.ipynb`` files.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import _repo_path  # noqa: F401  (the repository root on sys.path)
import nbformat
from notebook_sources import NOTEBOOKS

HERE = Path(__file__).resolve().parent


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` (e.g. ``01_quickstart``) from its cells, without outputs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, source in NOTEBOOKS[name]:
        cell = (nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell)
        nb.cells.append(cell(source.strip("\n")))
    return nb


def refresh_text(name: str) -> nbformat.NotebookNode:
    """The committed notebook ``name`` with its markdown cells taken from the sources: its code
    cells, and so its outputs, are kept; refused when a code cell changed (re-execute then)."""
    nb = nbformat.read(HERE / f"{name}.ipynb", as_version=4)
    fresh = build(name)
    if [(c.cell_type, c.source) for c in nb.cells if c.cell_type == "code"] != \
            [(c.cell_type, c.source) for c in fresh.cells if c.cell_type == "code"] or \
            [c.cell_type for c in nb.cells] != [c.cell_type for c in fresh.cells]:
        raise ValueError(f"{name}: code cells changed since it was executed; use --execute")
    for cell, new in zip(nb.cells, fresh.cells, strict=True):
        cell.source = new.source
    return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 3600) -> nbformat.NotebookNode:
    """Run every cell in order in a fresh kernel whose working directory is ``examples/``."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=sorted(NOTEBOOKS),
                        help=f"notebooks to build (default: all of {sorted(NOTEBOOKS)})")
    parser.add_argument("--execute", action="store_true", help="run each one and keep outputs")
    parser.add_argument("--refresh-text", action="store_true",
                        help="only update the markdown cells of the committed notebooks")
    args = parser.parse_args()
    for name in args.names:
        if name not in NOTEBOOKS:
            parser.error(f"unknown notebook {name!r}: allowed {sorted(NOTEBOOKS)}")
        nb = refresh_text(name) if args.refresh_text else build(name)
        if args.execute:
            start = time.perf_counter()
            execute(nb)
            print(f"{name}: executed in {time.perf_counter() - start:.0f} s", flush=True)
        nbformat.write(nb, HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main()
