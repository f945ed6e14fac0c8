"""The parallel suite on CPU: a random checkpoint, the one-device layout and tensor parallelism
over two gloo processes launched as ``torchrun -m benchmarks``; the table finds the outputs
equal. The all-reduce and the session need GPUs: off them they say so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.__main__ import main
from tests.benchmarks.suite_helpers import run_suite

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--batch-sizes", "1,3", "--max-tokens", "12", "--repeats", "1"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="two CPU ranks: transformers' plan binds "
                    "each rank to cuda:LOCAL_RANK where CUDA is present")
def test_layouts_measure_and_agree(tmp_path):
    model = tmp_path / "tiny"
    assert main(["parallel", "save", "--model", "random-llama-tiny", "--dir", str(model)]) is None
    run_suite("parallel", "run", "--layout", "single", "--model", model, "--json",
              tmp_path / "single.json", *SMALL)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "benchmarks", "parallel", "run", "--layout", "tp", "--methods", "ngram",
         "--model", str(model), "--json", str(tmp_path / "tp.json"), *SMALL],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = run_suite("parallel", "table", tmp_path / "single.json", tmp_path / "tp.json").rows
    tp = [row for row in table if row["layout"] == "tp"]
    assert [(r["method"], r["batch_size"]) for r in tp] == [("ngram", 1), ("ngram", 3)]
    assert len(table) == 6 and all(row["outputs_equal_single"] for row in table)


def test_allreduce_runs_under_torchrun_only():
    with pytest.raises(SystemExit, match="torchrun"):
        main(["parallel", "allreduce"])


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="the CPU path: fewer than two GPUs")
def test_the_session_needs_two_gpus(tmp_path):
    with pytest.raises(SystemExit, match="two GPUs"):
        main(["parallel", "session", str(tmp_path / "out")])


def test_the_session_runs_each_step_as_a_benchmarks_command(tmp_path):
    import argparse

    from benchmarks.suites.parallel_session import command

    args = argparse.Namespace(out=tmp_path, ckpt=tmp_path / "ckpt", batch_sizes="1,32",
                              max_tokens=128, capped='{"0": "6GiB"}')
    tp = command("tp-ngram", args)
    assert tp[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       "-m"]
    assert tp[7:13] == ["benchmarks", "parallel", "run", "--layout", "tp", "--methods"]
    capped = command("capped", args)
    assert capped[capped.index("--max-memory") + 1] == '{"0": "6GiB"}'
    assert capped[-2:] == ["--json", str(tmp_path / "capped.json")]
    with pytest.raises(SystemExit, match="unknown step"):
        command("tp-everything", args)
