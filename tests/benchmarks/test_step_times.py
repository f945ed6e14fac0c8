"""Smoke tests of ``benchmarks/step_times.py`` and ``benchmarks/policy_cost.py``: they run on a
tiny model (or none), and what they count adds up."""

import gc
import json

from benchmarks.policy_cost import policy_step_seconds
from benchmarks.step_times import main
from tests.engine.cli.cli_helpers import save_tiny_model


def test_step_times_accounts_for_every_step(tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "steps.json"
    main(["--model", str(model_dir), "--device", "cpu", "--kind", "copy", "--batch-size", "2",
          "--max-tokens", "8", "--warmups", "1", "--repeats", "1",
          "--methods", "none,ngram,ngram-fixed", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"none", "ngram", "ngram-fixed"}
    for method, (run,) in results.items():
        assert run["steps"] > 0
        assert run["recorded_steps"] + run["left_out_steps"] == run["steps"]
        assert len(run["left_out"]) == run["left_out_steps"]
        # the trace: every step in order, its recorded width 0 exactly where left out
        assert len(run["trace"]) == run["steps"]
        assert sum(1 for w, _, _ in run["trace"] if w == 0) == run["left_out_steps"]
        assert set(run["stages_ms_per_step"]) == {
            "schedule", "propose", "forward", "flush", "observe", "adjust", "verify",
            "append_and_stop", "rollback", "hand_features", "record"}
        if method == "none":  # no proposer: no width choices and one token per step
            assert all(d["n"] == 0 for d in run["decisions"].values())
            assert run["steps"] == 8 and set(run["recorded_by_width"]) == {"1"}
    # every fixed-k step after the prefill verifies drafts when the proposer has any
    assert max(map(int, results["ngram-fixed"][0]["recorded_by_width"])) > 1


def test_step_times_percentiles_and_the_collector_left_as_found(tmp_path):
    """Each run's step and stage percentiles and its slowest steps are the recorded steps';
    --gc-freeze and the pause counter leave the process's collector as they found it."""
    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "steps.json"
    callbacks = list(gc.callbacks)
    main(["--model", str(model_dir), "--device", "cpu", "--kind", "copy", "--batch-size", "2",
          "--max-tokens", "8", "--warmups", "1", "--repeats", "1", "--methods", "none",
          "--gc-freeze", "--json", str(out)])
    assert gc.callbacks == callbacks and gc.get_freeze_count() == 0
    (run,) = json.loads(out.read_text())["results"]["none"]
    ms = run["recorded_ms_percentiles"]
    assert 0 < ms["p50"] <= ms["p90"] <= ms["max"]
    assert len(run["slowest"]) == min(6, run["recorded_steps"])
    assert run["slowest"][0]["ms"] == ms["max"]
    assert set(run["stage_ms_percentiles"]) == set(run["stages_ms_per_step"])
    assert len(run["gc_collections"]) == 3 and run["gc_ms"] >= 0


def test_step_times_oracle_keeps_in_sync_and_drafts_at_alpha_one(tmp_path):
    """The oracle drafts the plain engine's own continuation (main() checks every run's output
    against it); at alpha 1 every fixed-k step after the prefill verifies k drafts, all kept."""
    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "steps.json"
    main(["--model", str(model_dir), "--device", "cpu", "--kind", "open", "--batch-size", "2",
          "--max-tokens", "11", "--warmups", "1", "--repeats", "1", "-k", "4", "--alpha", "1",
          "--methods", "none,oracle-fixed", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    plain, fixed = results["none"][0], results["oracle-fixed"][0]
    assert plain["steps"] == 11
    # (a prefill step gives the first token, then 10 tokens in two steps of 5)
    assert fixed["steps"] == 3 and set(fixed["recorded_by_width"]) <= {"5"}


def test_policy_cost_times_steps_that_draft():
    seconds, drafted, flush = policy_step_seconds(4, 4, number=5)
    assert seconds > 0 and flush >= 0
    assert drafted == 200  # measured costs where drafts pay: every warm-up step drafted
    # learning deferred (a GPU engine's): the same decisions, the learning timed apart
    seconds, drafted, flush = policy_step_seconds(4, 4, number=5, defer=True)
    assert seconds > 0 and flush > 0
    assert drafted == 200
