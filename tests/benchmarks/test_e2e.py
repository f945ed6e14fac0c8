"""The e2e suite on a tiny model: it runs, its greedy outputs agree, its rows add up."""

import sys

import pytest
import torch
import triton
import triton.language as tl

import benchmarks.engines as engines
from tests.benchmarks.suite_helpers import run_suite


def test_e2e_quick_on_a_tiny_model(tiny_dir, capsys):
    record = run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--quick", "--kinds",
                       "copy", "--batch-sizes", "1,2")
    rows = record.rows
    assert {(r["system"], r["batch_size"]) for r in rows} == {
        ("engine:none", 1), ("engine:ngram", 1), ("engine:early_exit", 1), ("hf:none", 1),
        ("hf:prompt_lookup", 1), ("engine:none", 2), ("engine:ngram", 2),
        ("engine:early_exit", 2), ("hf:none", 2)}
    for row in rows:
        assert row["num_tokens"] == 16 * row["batch_size"]
        if row["system"] != "hf:none":
            # Greedy decoding with or without speculation is HF's own greedy output (float32).
            assert row["same_as_hf"] == 1.0, row["system"]
        # the hypervisor's share of CPU time during the timed runs (Linux), a fraction
        assert (row["steal"] is None) != sys.platform.startswith("linux")
        assert row["steal"] is None or 0.0 <= row["steal"] <= 1.0
    assert any(t["target"].startswith("copy, batch 1, n-gram")
               for t in record.summary["targets"])
    printed = capsys.readouterr().out
    assert "tokens/s over the engine without speculation" in printed and "pos 1" in printed
    # what the controller decided from: costs by width (k + 1 widths, plain first) and the
    # engine's acceptance; none for the engine without speculation and for Hugging Face
    for r in rows:
        state = r["controller"]
        if r["system"] in ("engine:ngram", "engine:early_exit"):
            assert len(state["costs"]) == r["k"] + 1 and state["costs"][0] == 1.0
            assert len(state["acceptance"]) == r["k"] + 2
            # the payoff guard's view: its back-offs and, per batch bucket it judged, the
            # realised payoff of the drafting steps (a ratio to plain decoding)
            guard = state["guard"]
            assert guard["backoffs"] >= 0
            assert all(b["payoff"] > 0 and b["weight"] >= 0 for b in guard["buckets"].values())
        else:
            assert state is None, r["system"]
    # acceptance per draft position for the runs that drafted: k shares, whose mean weighted by
    # the drafts made at each position is the overall acceptance rate (so it lies between them)
    for r in rows:
        if r["system"].startswith("engine:") and r["method"] != "none" and r["mean_k"]:
            rates = r["acceptance_per_position"]
            assert len(rates) == r["k"] and all(0.0 <= x <= 1.0 for x in rates)
            assert min(rates) - 1e-3 <= r["acceptance_rate"] <= max(rates) + 1e-3
            assert 0.0 < r["mean_k"] <= r["k"]
        else:
            assert r["acceptance_per_position"] == [] and r["mean_k"] is None


def test_e2e_waves_run_every_prompt_with_at_most_b_at_once(tiny_dir, monkeypatch):
    from engine.llm_engine import LLMEngine

    widths = []
    step = LLMEngine.step

    def counting_step(self):
        widths.append((self.scheduler.max_num_seqs, len(self.scheduler.running)))
        return step(self)

    monkeypatch.setattr(LLMEngine, "step", counting_step)
    rows = run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--quick", "--kinds", "copy",
                     "--methods", "ngram", "--batch-sizes", "2,4", "--waves", "3",
                     "--warmup-rounds", "0").rows
    assert {r["system"] for r in rows} == {"engine:none", "engine:ngram", "hf:none"}
    for row in rows:
        assert row["num_tokens"] == 16 * row["batch_size"] * 3  # 3 waves of b prompts
        if row["system"] != "hf:none":
            assert row["same_as_hf"] == 1.0, row["system"]  # HF ran the prompts b at a time
    # Built for batch 4, the engines ran at most 2 sequences at once at batch 2 (and 4 at 4).
    assert {cap for cap, _ in widths} == {2, 4}
    assert all(running <= cap for cap, running in widths)
    assert max(running for cap, running in widths if cap == 4) == 4


def test_the_oracle_runs_each_fixed_k_and_judges_the_policy_against_the_best(tiny_dir):
    record = run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--quick", "--kinds",
                       "copy", "--methods", "ngram", "-k", "2", "--batch-sizes", "1", "--oracle",
                       "--warmup-rounds", "0")
    rows = {r["system"]: r for r in record.rows if r["system"].startswith("engine:")}
    assert set(rows) == {"engine:none", "engine:ngram", "engine:ngram@k1", "engine:ngram@k2"}
    assert [rows[f"engine:ngram@k{j}"]["k"] for j in (1, 2)] == [1, 2]
    assert all(r["same_as_hf"] == 1.0 for r in rows.values())  # every fixed k: HF's greedy
    (oracle,) = record.summary["oracle"]
    fixed = {0: rows["engine:none"], 1: rows["engine:ngram@k1"], 2: rows["engine:ngram@k2"]}
    best_k = max(fixed, key=lambda j: fixed[j]["tokens_per_s"])
    assert oracle["best_fixed_k"] == best_k
    assert oracle["vs_best_fixed"] == (rows["engine:ngram"]["tokens_per_s"]
                                       / fixed[best_k]["tokens_per_s"])
    assert any(t["target"].startswith("copy, batch 1, engine:ngram / its best fixed k")
               for t in record.summary["targets"])


def test_e2e_on_the_real_text_heldout_split(tiny_dir):
    record = run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--quick", "--prompt-set",
                       "real", "--kinds", "open,multi_turn", "--methods", "ngram",
                       "--batch-sizes", "1", "--warmup-rounds", "0")
    assert record.summary["prompt_set"] == "real"
    assert {(r["kind"], r["system"]) for r in record.rows} == {
        (kind, system) for kind in ("open", "multi_turn")
        for system in ("engine:none", "engine:ngram", "hf:none", "hf:prompt_lookup")}
    for row in record.rows:
        assert row["num_tokens"] == 16
        if row["system"] != "hf:none":
            assert row["same_as_hf"] == 1.0, row["system"]


def test_e2e_rejects_a_kind_outside_its_prompt_set(tiny_dir):
    with pytest.raises(SystemExit, match="multi_turn"):
        run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--kinds", "multi_turn")
    with pytest.raises(SystemExit, match="copy_short"):
        run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--prompt-set", "real",
                  "--kinds", "copy_short")


def test_e2e_runs_an_eagle3_head_and_needs_its_directory(tiny_dir, tmp_path):
    import pytest
    from transformers import AutoConfig

    from tests.proposers.speculators_helpers import write_eagle3_dir

    write_eagle3_dir(tmp_path, AutoConfig.from_pretrained(tiny_dir), list(range(4, 128, 2)),
                     aux=[0, 1, 1])
    record = run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--quick", "--kinds",
                       "copy", "--batch-sizes", "1", "--methods", "eagle3", "--eagle3-head",
                       str(tmp_path), "--no-hf", "--fixed-k")
    (row,) = [r for r in record.rows if r["system"] == "engine:eagle3"]
    assert row["num_tokens"] == 16 and row["mean_k"] > 0
    assert len(row["acceptance_per_position"]) == 4
    with pytest.raises(SystemExit, match="--eagle3-head"):
        run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--quick", "--methods",
                  "eagle3")


def test_one_off_costs_count_every_graph_capture_of_the_process(monkeypatch):
    """Every ``torch.cuda.CUDAGraph`` capture counts, whoever makes it (a stand-in graph class
    here: no GPU on CI), and only from the first call on."""
    class FakeGraph:
        def capture_begin(self, *args, **kwargs):
            pass

        def capture_end(self):
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(engines, "_CAPTURES", [0, 0.0, None])
    graph = FakeGraph()
    graph.capture_begin()  # (before counting began: not counted)
    graph.capture_end()
    assert engines.one_off_costs()[:2] == (0, 0.0)
    for _ in range(3):
        graph.capture_begin(pool=None)
        graph.capture_end()
    count, seconds = engines.one_off_costs()[:2]
    assert count == 3 and seconds >= 0.0
    engines.one_off_costs()  # (counting is set up once: a second call wraps nothing again)
    graph.capture_begin()
    graph.capture_end()
    assert engines.one_off_costs()[0] == 4


def test_one_off_costs_count_triton_compiles():
    """A Triton kernel compiled for new arguments counts once (under the interpreter here,
    which compiles nothing: then the count must stay, not fail)."""
    @triton.jit
    def _double(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

    before = engines.one_off_costs()
    if not torch.cuda.is_available():
        assert engines.one_off_costs()[2:] == before[2:]
        return
    x = torch.ones(8, device="cuda")
    _double[(1,)](x, 8, BLOCK=8)
    _double[(1,)](x, 8, BLOCK=8)  # (compiled already)
    assert engines.one_off_costs()[2] == before[2] + 1


def test_e2e_reports_each_rounds_ratio(tiny_dir, capsys):
    """With ``--repeats 2`` every run keeps each round's seconds (their sum its seconds), and a
    row's per-round ratios are the engine without speculation's round seconds over its own."""
    record = run_suite("e2e", "--model", tiny_dir, "--device", "cpu", "--quick", "--kinds",
                       "copy", "--batch-sizes", "2", "--methods", "ngram", "--no-hf",
                       "--repeats", "2")
    rows = {r["system"]: r for r in record.rows}
    base, ngram = rows["engine:none"], rows["engine:ngram"]
    for row in (base, ngram):
        assert len(row["round_seconds"]) == 2
        assert sum(row["round_seconds"]) == pytest.approx(row["seconds"])
    assert base["vs_engine_none_rounds"] == pytest.approx([1.0, 1.0])
    want = [b / s for b, s in zip(base["round_seconds"], ngram["round_seconds"], strict=True)]
    assert ngram["vs_engine_none_rounds"] == pytest.approx(want)
    assert min(want) <= ngram["vs_engine_none"] * (1 + 1e-9) and \
        ngram["vs_engine_none"] <= max(want) * (1 + 1e-9)
    assert "rounds " in capsys.readouterr().out
