"""The one result record every suite writes: what ran, where, on which code, and its rows.

A suite's ``run`` returns a :class:`Result` (its rows, the model it measured, a summary of what
is not a row); ``python -m benchmarks`` wraps it in a :class:`Record` with the suite, the
command, the commit, the machine, the arguments and the run's contention, and writes it as JSON
with ``--json PATH``.
"""

from __future__ import annotations

import json
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    """What a suite measured: one dict per row, the model (a name or path), and the rest."""

    rows: list[dict]
    model: str | None = None
    summary: dict = field(default_factory=dict)


@dataclass
class Record:
    """One run of one suite (see the module docstring)."""

    suite: str
    command: str
    commit: str | None  # short hash of HEAD; "+" appended when tracked files differ from it
    machine: dict
    model: str | None
    args: dict
    contention: dict  # timing.Contention: steal share and load over the run
    rows: list[dict]
    summary: dict

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1, default=str) + "\n")


def commit() -> str | None:
    """HEAD's short hash, with "+" when tracked files changed; None outside a git checkout."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT,
                                  timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if head is None:
        return None
    return head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine(device: str | None) -> dict:
    """The device (every visible GPU's name when it runs on CUDA, else the CPU's model), the
    host's cores and the library versions."""
    import transformers

    on_cuda = torch.cuda.is_available() and not (device or "").startswith("cpu")
    names = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
             if on_cuda else [cpu_name()])
    return {"device": "cuda" if on_cuda else "cpu", "names": names,
            "cpu": cpu_name(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def plain_args(args: Any) -> dict:
    """The parsed arguments as JSON values (functions, the suite's own hooks, left out)."""
    return {k: v for k, v in vars(args).items() if not callable(v)}
