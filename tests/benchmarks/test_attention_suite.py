"""The attention suite on the CPU (smoke): every cell runs, and the two backends agree there
(paged reads through the PyTorch reference against the gather backend's masked SDPA)."""

from tests.benchmarks.suite_helpers import run_suite


def test_every_cell_runs_and_the_backends_agree():
    record = run_suite("attention", "--device", "cpu", "--quick", "--shapes",
                       "random-smollm2-135m")
    cells = {(r["batch_size"], r["context"], r["num_new"]) for r in record.rows}
    assert cells == {(b, 32, n) for b in (1, 2) for n in (1, 3)}
    for r in record.rows:
        assert r["max_abs_diff"] < 1e-5
        # (the bucket: 128, capped at the table's 32 + 3 + 1 columns; no split off CUDA)
        assert r["kv_len"] == 36 and r["num_splits"] == 1
        assert r["gather_us"] > 0 and r["paged_us"] > 0
