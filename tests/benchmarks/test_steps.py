"""The steps suite on a tiny model: what it counts adds up, and it leaves the process as found."""

import gc

import pytest

from benchmarks.suites.step_clock import LAUNCHES, STAGES
from tests.benchmarks.suite_helpers import run_suite

STEPS = ("--device", "cpu", "--batch-size", "2", "--warmups", "1", "--repeats", "1")


def runs(record) -> dict[str, dict]:
    return {row["method"]: row for row in record.rows}


def test_steps_accounts_for_every_step(tiny_dir):
    results = runs(run_suite("steps", "--model", tiny_dir, *STEPS, "--kind", "copy",
                             "--max-tokens", "8", "--methods", "none,ngram,ngram-fixed"))
    assert set(results) == {"none", "ngram", "ngram-fixed"}
    for method, run in results.items():
        assert run["steps"] > 0
        assert run["recorded_steps"] + run["left_out_steps"] == run["steps"]
        assert len(run["left_out"]) == run["left_out_steps"]
        # the trace: every step in order, its recorded width 0 exactly where left out
        assert len(run["trace"]) == run["steps"]
        assert sum(1 for w, _, _ in run["trace"] if w == 0) == run["left_out_steps"]
        assert set(run["stages_ms_per_step"]) == {name.strip("_") for name in STAGES}
        # the stages run inside step(): their sum is at most the time inside it
        assert sum(run["stages_ms_per_step"].values()) * run["steps"] <= (
            1e3 * run["inside_step_s"] * (1 + 1e-6))
        if method == "none":  # no proposer: no width choices and one token per step
            assert all(d["n"] == 0 for d in run["decisions"].values())
            assert run["steps"] == 8 and set(run["recorded_by_width"]) == {1}
    # every fixed-k step after the prefill verifies drafts when the proposer has any
    assert max(results["ngram-fixed"]["recorded_by_width"]) > 1


def test_steps_percentiles_and_the_collector_left_as_found(tiny_dir):
    """Each run's step and stage percentiles and its slowest steps are the recorded steps';
    --gc-freeze and the pause counter leave the process's collector as they found it."""
    callbacks = list(gc.callbacks)
    run = runs(run_suite("steps", "--model", tiny_dir, *STEPS, "--kind", "copy",
                         "--max-tokens", "8", "--methods", "none", "--gc-freeze"))["none"]
    assert gc.callbacks == callbacks and gc.get_freeze_count() == 0
    ms = run["recorded_ms_percentiles"]
    assert 0 < ms["p50"] <= ms["p90"] <= ms["max"]
    assert len(run["slowest"]) == min(6, run["recorded_steps"])
    assert run["slowest"][0]["ms"] == ms["max"]
    assert set(run["stage_ms_percentiles"]) == set(run["stages_ms_per_step"])
    assert len(run["gc_collections"]) == 3 and run["gc_ms"] >= 0


def test_steps_oracle_keeps_in_sync_and_drafts_at_alpha_one(tiny_dir):
    """The oracle drafts the plain engine's own continuation (the suite checks every run's
    output against it); at alpha 1 every fixed-k step verifies its cap of drafts, all kept."""
    results = runs(run_suite("steps", "--model", tiny_dir, *STEPS, "--kind", "open",
                             "--max-tokens", "11", "-k", "4", "--alpha", "1",
                             "--methods", "none,oracle-fixed"))
    plain, fixed = results["none"], results["oracle-fixed"]
    assert plain["steps"] == 11
    # 11 tokens: the prefill step verifies 4 drafts (5 tokens, not timed by the controller),
    # a decode step 4 more (5), the last one none (one token was left: its cap is 0)
    assert [width for width, _, _ in fixed["trace"]] == [0, 5, 1]


def test_an_outcome_learnt_in_the_next_step_counts_for_the_step_that_made_it(tiny_dir):
    """On a GPU the controller learns a step's outcome during the next step's forward: the
    clock still gives each step its own (the same trace as learning at once, on CPU)."""
    from benchmarks.engines import engine_generate
    from benchmarks.suites.step_clock import StepClock
    from engine import LLM

    def trace(deferred: bool) -> list[int]:
        llm = LLM(model=str(tiny_dir), device="cpu", speculative_config={
            "method": "ngram", "num_speculative_tokens": 2, "adaptive_k": False})
        llm.engine.forward_is_async = deferred  # (what a GPU engine does: learn one step late)
        clock = StepClock(llm.engine)
        engine_generate(llm, [[5, 6, 7, 8] * 4, [9, 10, 11] * 5], 8)
        return [s["recorded"][0] if s["recorded"] else 0 for s in clock.steps]

    at_once = trace(False)
    assert trace(True) == at_once and max(at_once) == 3


def test_steps_on_a_real_text_kind(tiny_dir, capsys):
    results = runs(run_suite("steps", "--model", tiny_dir, *STEPS, "--prompt-set", "real",
                             "--kind", "code_edit", "--max-tokens", "8", "--methods", "none"))
    assert results["none"]["steps"] == 8  # (no proposer: one token a step for both prompts)
    assert "code_edit prompts (real)" in capsys.readouterr().out


def test_overlapped_steps_by_launch_and_the_closed_batchs_tail(tiny_dir):
    """Overlapped steps (--async-scheduling on): each step is counted under how its next
    forward was launched, and under the whole batch or its tail. Plain decoding launches from
    the host once (the prefill), then each plain flight from the one before, and its last step
    only commits; its sequences all end at the last step (no tail). n-gram at fixed k launches
    drafting flights from the chains of the one before (its lookup on the device), and one of
    its two sequences ends steps before the other (a tail)."""
    results = runs(run_suite("steps", "--model", tiny_dir, *STEPS, "--kind", "open",
                             "--max-tokens", "24", "--methods", "none,ngram-fixed",
                             "--async-scheduling", "on"))
    plain, fixed = results["none"], results["ngram-fixed"]
    assert plain["launches"] == ["host"] + ["plain"] * 22 + ["none"]
    assert plain["running"] == [2] * 24 and plain["by_batch"]["tail"]["n"] == 0
    for run in results.values():
        launches, running = run["launches"], run["running"]
        assert set(run["by_launch"]) == set(LAUNCHES) and set(launches) <= set(LAUNCHES)
        assert max(running) == 2  # (at most the batch)
        assert run["by_batch"]["whole"]["n"] + run["by_batch"]["tail"]["n"] == run["steps"]
        assert abs(sum(t["s"] for t in run["by_launch"].values()) - run["inside_step_s"]) < 1e-9
    assert fixed["launches"][0] == "host" and fixed["by_launch"]["chained"]["n"] > 0
    assert fixed["by_batch"]["tail"]["n"] > 0 and fixed["running"][-1] == 1
    # each kind's stages: an overlapped step's own (its launch, the flight's sampling or
    # verification, the commit and its read of the flight's tokens) and its parts' (the
    # runner's forward, the proposer's drafts), their own times within the step's
    for run, kind, stages in ((plain, "plain", {"launch_next", "runner.forward",
                                                "sample_ahead", "commit_flight", "read"}),
                              (fixed, "chained", {"launch_chained", "runner.forward_chains",
                                                  "verify_ahead", "proposer.draft_after",
                                                  "commit_flight", "read"})):
        timed = run["by_launch"][kind]
        assert stages <= set(timed["stages_ms_mean"])
        assert sum(timed["stages_ms_mean"].values()) <= 1e3 * timed["s"] / timed["n"] + 0.01


def test_a_refilled_batch_is_whole_until_its_queue_is_empty(tiny_dir):
    """With --waves 2 a finished request's place is refilled from the queue: the batch stays
    whole (the plain engine's never shrinks), though more requests than a batch are unfinished
    at the start."""
    plain = runs(run_suite("steps", "--model", tiny_dir, *STEPS, "--kind", "open",
                           "--max-tokens", "6", "--methods", "none", "--waves", "2",
                           "--async-scheduling", "on"))["none"]
    assert plain["running"] == [2] * plain["steps"] and plain["by_batch"]["tail"]["n"] == 0


def test_the_token_read_is_timed_only_inside_a_clocked_run():
    """``reads_timed`` puts the flight's token read back as it found it, raise or not."""
    from benchmarks.suites.step_clock import reads_timed
    from engine.overlap import InFlight

    read = InFlight.token_ids
    with reads_timed():
        assert InFlight.token_ids is not read
    assert InFlight.token_ids is read
    with pytest.raises(RuntimeError), reads_timed():
        raise RuntimeError("a run that failed")
    assert InFlight.token_ids is read
