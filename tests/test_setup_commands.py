"""The README's two set-up commands, as ``make -n`` prints them (nothing runs, nothing is
downloaded): everything in a virtual environment of the repository, torch from the CPU index
unless told otherwise, the test tools only for ``make test``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE_VARIABLES = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON", "VENV", "TORCH_SPEC", "TORCH_INDEX",
                  "ARGS", "PYTEST_ARGS"}
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(target: str, *variables: str) -> list[str]:
    """The commands ``make -B target`` would run with an empty venv (``-B``: every phase)."""
    # The Makefile's defaults: without the variables a parent make exports (`make test
    # TORCH_INDEX=` exports TORCH_INDEX; its MAKEFLAGS would make this one print directories).
    env = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}
    proc = subprocess.run(["make", "--no-print-directory", "-n", "-B", target,
                           "VENV=/nonexistent/venv", *variables],
                          cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    return [line.strip() for line in proc.stdout.replace("\\\n", " ").splitlines()
            if not line.startswith("echo ")]


def test_make_run_installs_into_the_venv_without_the_test_tools():
    commands = dry_run("run")
    assert commands[0].startswith("python3 -m venv /nonexistent/venv")
    pip = [c for c in commands if " -m pip " in c]
    assert pip and all(c.startswith("/nonexistent/venv/bin/python -m pip install") for c in pip)
    assert not any("[dev]" in c for c in commands)
    assert commands[-1] == "/nonexistent/venv/bin/python -m engine.generate"
    (torch,) = [c for c in pip if "torch==" in c]
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch


def test_make_test_adds_the_test_tools_and_an_empty_index_means_pypi():
    commands = dry_run("test", "TORCH_INDEX=")
    assert any(c.endswith('-m pip install -q -e ".[dev]"') for c in commands)
    (torch,) = [c for c in commands if "torch==" in c]
    assert "--index-url" not in torch
    (pytest,) = [c for c in commands if " -m pytest " in c]
    # (the Triton kernels interpreted on CPU; the slowest tests named in CI's log)
    assert pytest.startswith("TRITON_INTERPRET=1 /nonexistent/venv/bin/python -m pytest")
    assert "--durations=25" in pytest
