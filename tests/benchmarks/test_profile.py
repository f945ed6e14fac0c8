"""The profile suite on a tiny model: one run under the profiler, its host table."""

from tests.benchmarks.suite_helpers import run_suite


def test_one_run_under_the_profiler(tiny_dir, capsys):
    record = run_suite("profile", "--model", tiny_dir, "--device", "cpu", "--batch-size", "2",
                       "--max-tokens", "6", "--method", "ngram", "--rows", "5")
    (row,) = record.rows
    assert row["tokens"] == 12 and row["seconds"] > 0
    assert "Self CPU" in record.summary["host"] and "device" not in record.summary
    assert "12 tokens in" in capsys.readouterr().out
