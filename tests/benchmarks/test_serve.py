"""The serve suite: its percentiles and TPOT by hand, then both cases against real server
processes of a tiny model on CPU (timings untested)."""


from benchmarks.suites.serve_arrivals import median_rounds, summarize
from benchmarks.suites.serve_client import pct, tpot
from tests.benchmarks.suite_helpers import run_suite


def test_tpot_leaves_out_the_first_token_and_requests_of_one():
    results = [{"sent": 0.0, "first": 1.0, "done": 3.0, "tokens": 5},   # 2 s over 4 tokens
               {"sent": 0.0, "first": 1.0, "done": 1.0, "tokens": 1},   # one token: none
               {"sent": 0.0, "first": None, "done": 2.0, "tokens": 0}]  # no token: none
    assert tpot(results) == [0.5]
    assert pct([3.0, 1.0, 2.0], 0.5) == 2.0 and pct([], 0.5) != pct([], 0.5)  # (nan)
    (row,) = summarize([{"rate": 2.0, "elapsed_s": 4.0, "results": results}])
    assert row["tokens_per_s"] == 6 / 4 and row["ttft_p50"] == 1.0 and row["tpot_p50"] == 0.5
    (merged,) = median_rounds([[dict(row, tpot_p50=0.4)], [row], [dict(row, tpot_p50=0.9)]])
    assert merged["tpot_p50"] == 0.5 and len(merged["rounds"]) == 3


def test_arrivals_serve_both_systems_the_same_schedule(tiny_dir):
    record = run_suite("serve", "arrivals", "--model", tiny_dir, "--device", "cpu", "--rates",
                       "4", "--num-requests", "2", "--max-tokens", "4", "--kind", "copy")
    assert [(r["system"], r["rate"]) for r in record.rows] == [("n-gram", 4.0),
                                                               ("no speculation", 4.0)]
    for r in record.rows:
        assert r["tokens_per_s"] > 0 and r["tpot_p50"] > 0
    assert record.rows[1]["tpot_p50_over_none"] == 1.0


def test_overhead_compares_the_server_with_generate_stream(tiny_dir):
    (row,) = run_suite("serve", "overhead", "--model", tiny_dir, "--device", "cpu", "--batch",
                       "2", "--max-tokens", "4", "--systems", "none").rows
    assert (row["batch"], row["system"]) == (2, "none")
    assert row["ratio"] == row["server_tpot_p50"] / row["in_process_tpot_p50"]
