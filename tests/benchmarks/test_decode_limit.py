"""The decode-limit suite on a tiny random LLaMA on the CPU: its cells, plain decoding's one token
per sequence per step, and the bytes a step reads, counted by hand from the shape."""

from benchmarks import models
from benchmarks.suites.decode_limit import kv_bytes_per_token, weight_bytes
from tests.benchmarks.suite_helpers import run_suite


def test_every_cell_runs_and_plain_decoding_makes_a_token_per_sequence_per_step():
    record = run_suite("decode_limit", "--device", "cpu", "--model", "random-llama-tiny",
                       "--quick", "--methods", "ngram", "--attention-backends", "gather,paged")
    cells = {(r["method"], r["attention_backend"], r["batch_size"], r["context"])
             for r in record.rows}
    assert cells == {(m, a, b, 32) for m in ("none", "ngram") for a in ("gather", "paged")
                     for b in (1, 2)}
    for r in record.rows:
        tokens_per_step = r["tokens_per_s"] * r["ms_per_step"] / 1e3
        if r["method"] == "none":
            assert abs(tokens_per_step - r["batch_size"]) < 1e-6
        else:  # (speculation: at least the plain token per sequence per step)
            assert tokens_per_step >= r["batch_size"] - 1e-6
        # no GPU: neither the bandwidth limit nor the profiler's busy time
        assert r["gpu_busy_ms_per_step"] is None and "limit_ms_per_step" not in r
    assert record.summary["copy_bandwidth_bytes_per_s"] is None
    assert not any(r["fixed_k"] for r in record.rows)


def test_fixed_k_runs_without_a_controller(monkeypatch):
    """``--fixed-k``: the engines are built without the controller (``adaptive_k`` False), the
    rows say so, and n-gram, asking for k = 4 drafts at every step, gets some accepted on the
    tiny model's greedy output (more than a token a sequence a step in some cell)."""
    import benchmarks.suites.decode_limit as suite

    specs = []

    def recorded(method, k, *args, _make=suite.speculative_config, **kwargs):
        specs.append(_make(method, k, *args, **kwargs))
        return specs[-1]

    monkeypatch.setattr(suite, "speculative_config", recorded)
    record = run_suite("decode_limit", "--device", "cpu", "--model", "random-llama-tiny",
                       "--quick", "--methods", "ngram", "--fixed-k")
    assert [s and s["adaptive_k"] for s in specs] == [None, False]
    spec = [r for r in record.rows if r["method"] == "ngram"]
    assert spec and all(r["fixed_k"] for r in record.rows)
    assert any(r["tokens_per_s"] * r["ms_per_step"] / 1e3 > r["batch_size"] + 0.5 for r in spec)


def test_the_bytes_a_step_reads_counted_by_hand():
    """random-llama-tiny: hidden 64, MLP 128, 2 layers, 4 heads of 16, 2 KV heads, vocabulary
    512, untied. A layer: q 64x64, k and v 64x32, o 64x64, MLP 3 x 64x128, two norms of 64 =
    36,992; two layers, the final norm (64) and the output head (512 x 64), not the input
    embedding: 106,816 float32 parameters. KV: keys and values, 2 layers x 2 heads x 16."""
    model, _ = models.build_model("random-llama-tiny", "cpu", "float32")
    assert weight_bytes(model) == 106_816 * 4
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 16 * 4
    tied, _ = models.build_model("random-llama-tiny", "cpu", "float32")
    tied.get_output_embeddings().weight = tied.get_input_embeddings().weight
    # tied: the one matrix is the output head, read every step (counted once, not left out)
    assert weight_bytes(tied) == 106_816 * 4


def test_short_gaps_count_launch_gaps_not_the_host():
    """Device activities in µs, out of order: kernels 0.4 apart, a copy overlapping one and a
    kernel inside another's span (no gap: the end so far is the latest), the next kernel 0.4
    after the copy's end, the device idle 27.6 µs (waiting for the host), a last kernel 0.9
    after the one before: short gaps 0.4 + 0.4 + 0.9 µs; the wait is not counted."""
    from benchmarks.suites.decode_limit import SHORT_GAP_US, short_gaps

    spans = [(10.0, 12.0), (0.0, 5.0), (5.4, 9.0), (8.0, 9.6), (6.0, 7.5), (39.6, 41.0),
             (41.9, 43.0)]
    assert SHORT_GAP_US == 1.0
    assert abs(short_gaps(spans) - (0.4 + 0.4 + 0.9) / 1e6) < 1e-12
    assert short_gaps([]) == 0.0 and short_gaps([(0.0, 1.0)]) == 0.0
