"""benchmarks/parallel.py on CPU: a random checkpoint, the one-device layout and tensor
parallelism over two gloo processes; the table finds the outputs equal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import parallel

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--batch-sizes", "1,3", "--max-tokens", "12", "--repeats", "1"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="two CPU ranks: transformers' plan binds "
                    "each rank to cuda:LOCAL_RANK where CUDA is present")
def test_layouts_measure_and_agree(tmp_path, capsys):
    model = tmp_path / "tiny"
    parallel.main(["save", "--model", "random-llama-tiny", "--dir", str(model)])
    parallel.main(["run", "--layout", "single", "--model", str(model), "--json",
                   str(tmp_path / "single.json"), *SMALL])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(REPO / "benchmarks" / "parallel.py"), "run", "--layout", "tp", "--methods", "ngram",
         "--model", str(model), "--json", str(tmp_path / "tp.json"), *SMALL],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tp = json.loads((tmp_path / "tp.json").read_text())["rows"]
    assert [(r["layout"], r["method"], r["batch_size"]) for r in tp] == [
        ("tp", "ngram", 1), ("tp", "ngram", 3)]
    assert all(r["placement"] == "tensor parallel over 2 ranks" for r in tp)
    table = parallel.print_table([tmp_path / "single.json", tmp_path / "tp.json"])
    assert len(table) == 6
    assert all(row["outputs_equal_single"] for row in table)
    assert all(len(o) == 12 for row in tp for o in row["outputs"])
