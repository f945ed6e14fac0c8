"""A non-editable install (a built wheel in a fresh virtual environment) ships the presets: the
``specdec`` script finds ``--config default`` outside the repository."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.engine.cli.cli_helpers import save_tiny_model

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    had_build = (ROOT / "build").exists()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(ROOT)], check=True)
    if not had_build:  # (setuptools builds in the source tree; leave it as it was)
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    return next(out.glob("specdec-*.whl"))


def test_the_wheel_holds_every_preset(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert presets and all(f"engine/configs/{name}" in names for name in presets)
    assert "engine/cli/main.py" in names and "engine/runner/model_runner.py" in names


def test_specdec_from_a_wheel_runs_the_default_preset(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    # the venv sees this interpreter's torch and transformers (also when it is itself a venv,
    # whose packages --system-site-packages would miss); specdec itself comes from the wheel
    inner = subprocess.run([str(bin_dir / "python"), "-c", "import site; "
                            "print(site.getsitepackages()[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path(inner, "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True)
    model = save_tiny_model(tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": ""}
    where = subprocess.run(
        [str(bin_dir / "python"), "-c",
         "import engine.presets as p; print(p.load_config_file('default').path)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv) and Path(where).name == "default.yaml"
    run = subprocess.run(
        [str(bin_dir / "specdec"), "--config", "default", "--model", str(model),
         "--prompt", "w5 w6 w7 w5 w6 w7 w5 w6", "--max-tokens", "4", "--no-progress",
         "--no-chat", "--ignore-eos"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "tokens/s" in run.stdout and "(no speculation)" not in run.stdout  # the preset's n-gram
