"""The controller simulation: its cost model and closed batches, worked out by hand."""

import pytest

from benchmarks.controller_sim import main


def run(tmp_path, *args):
    import json

    out = tmp_path / "sim.json"
    main(["--batch-sizes", "2", "--ks", "4", "--noise", "0", "--warmup", "1", "--runs", "1",
          "--seeds", "1", "--json", str(out), *args])
    return {c["alpha"]: c for c in json.loads(out.read_text())["cells"]}


def test_fixed_k_speedups_follow_the_cost_model(tmp_path):
    """Every draft right, k = 4, 64 tokens: after the prefill's token, 12 steps of 5 tokens
    (1 + 0.05 * 4 + 0.02 = 1.22 plain steps each) and one of 3 (2 drafts can still become
    output: 1.12), against 63 plain steps; the prefill counts 2 plain steps on both sides."""
    cells = run(tmp_path, "--alphas", "1,0")
    assert cells[1.0]["k=4"] == pytest.approx(65 / (2 + 12 * 1.22 + 1.12))
    # every draft wrong: 63 steps of one token each; the last four can verify 3, 2, 1 and 0
    # drafts (1.17, 1.12, 1.07, 1), the 59 before them 4 (1.22)
    assert cells[0.0]["k=4"] == pytest.approx(65 / (2 + 59 * 1.22 + 1.17 + 1.12 + 1.07 + 1))


def test_the_controller_drafts_when_drafts_pay_and_stops_when_they_do_not(tmp_path):
    cells = run(tmp_path, "--alphas", "1,0")
    assert cells[1.0]["controller"] > 0.9 * cells[1.0]["k=4"]
    assert cells[0.0]["controller"] > 0.95  # (of plain decoding: probes only)
