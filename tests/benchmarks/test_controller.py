"""The controller suite: its simulation's cost model and closed batches worked out by hand, a
prepared decision the same as a fresh one, and the controller's host cost per step."""

import pytest

from benchmarks.suites.controller_sim import PLAIN_STEP_S, SimEngine
from benchmarks.suites.policy_cost import policy_step_seconds
from tests.benchmarks.suite_helpers import run_suite


def cells(*args) -> dict:
    record = run_suite("controller", "sim", "--batch-sizes", "2", "--ks", "4", "--noise", "0",
                       "--warmup", "1", "--runs", "1", "--seeds", "1", *args)
    return {c["alpha"]: c for c in record.rows}


def test_fixed_k_speedups_follow_the_cost_model():
    """Every draft right, k = 4, 64 tokens: after the prefill's token, 12 steps of 5 tokens
    (1 + 0.05 * 4 + 0.02 = 1.22 plain steps each) and one of 3 (2 drafts can still become
    output: 1.12), against 63 plain steps; the prefill counts 2 plain steps on both sides."""
    rows = cells("--alphas", "1,0")
    assert rows[1.0]["k=4"] == pytest.approx(65 / (2 + 12 * 1.22 + 1.12))
    # every draft wrong: 63 steps of one token each; the last four can verify 3, 2, 1 and 0
    # drafts (1.17, 1.12, 1.07, 1), the 59 before them 4 (1.22)
    assert rows[0.0]["k=4"] == pytest.approx(65 / (2 + 59 * 1.22 + 1.17 + 1.12 + 1.07 + 1))


def test_a_slow_stretch_adds_its_height_then_shrinks_by_its_decay():
    """``--bursts``: a stretch starts at a step with the given chance (1: every step restarts
    it; 0: never) and adds plain steps that shrink by the decay each step after."""
    engine = SimEngine(4, False, 0.05, 0.02, 0.0, seed=0, bursts=(1.0, 4.0, 0.5))
    assert [engine.cost(1) / PLAIN_STEP_S for _ in range(2)] == pytest.approx([5.0, 5.0])
    engine.bursts = (0.0, 4.0, 0.5)  # (no new stretch: the last one shrinks)
    assert [engine.cost(5) / PLAIN_STEP_S for _ in range(3)] == pytest.approx(
        [1.22 + 2.0, 1.22 + 1.0, 1.22 + 0.5])


def test_the_controller_drafts_when_drafts_pay_and_stops_when_they_do_not():
    rows = cells("--alphas", "1,0")
    assert rows[1.0]["controller"] > 0.9 * rows[1.0]["k=4"]
    assert rows[0.0]["controller"] > 0.95  # (of plain decoding: probes only)


def test_a_drift_is_reported_batch_by_batch():
    record = run_suite("controller", "sim", "--batch-sizes", "2", "--alphas", "0.9", "--ks", "4",
                       "--warmup", "0", "--runs", "1", "--seeds", "1", "--max-tokens", "16",
                       "--drift")
    drift = record.summary["drift"][2]
    assert drift["fresh"] > 0 and len(drift["after_drift"]) == 4


def test_a_prepared_decision_is_the_one_weighed_at_the_step(monkeypatch):
    """The controller prepares its next width while the forward runs (``prepare``) and
    ``choose_width`` takes it where its inputs are unchanged. Simulated closed batches with
    noisy costs and i.i.d. acceptance make exactly the same choices, step by step, whether the
    prepared decision is used or every step weighs its drafts again; and it is used."""
    from scheduler.goodput import GoodputController

    key, choose, decide = (GoodputController._choice_key, GoodputController.choose_width,
                           GoodputController._decide)

    def choices(use_prepared: bool) -> tuple[list[int], int]:
        made, weighed, calls = [], [0], [0]

        def counted_decide(self, *args):
            calls[0] += 1
            return decide(self, *args)

        def counted_choose(self, *args, **kwargs):
            before = calls[0]
            made.append(choose(self, *args, **kwargs))
            weighed[0] += calls[0] > before  # (no call: the prepared decision served)
            return made[-1]

        # (not used: a key that no prepared decision equals)
        monkeypatch.setattr(GoodputController, "_choice_key", key if use_prepared else
                            lambda self, *a: (object(), key(self, *a)))
        monkeypatch.setattr(GoodputController, "_decide", counted_decide)
        monkeypatch.setattr(GoodputController, "choose_width", counted_choose)
        sim = SimEngine(4, True, 0.05, 0.02, 0.1, seed=3)
        for alpha in (0.9, 0.5, 0.0, 0.7):
            sim.batch(8, alpha, 64)
        return made, len(made) - weighed[0]

    fresh, served = choices(use_prepared=False)
    assert served == 0  # (every choice weighed afresh: the comparison below means something)
    prepared, served = choices(use_prepared=True)
    assert prepared == fresh and len(fresh) > 60
    assert served > len(fresh) // 4  # (steady decoding: the prepared decision serves)


def test_policy_cost_times_steps_that_draft():
    seconds, drafted, learn = policy_step_seconds(4, 4, number=5)
    assert seconds > 0 and learn > 0
    assert drafted == 200  # measured costs where drafts pay: every warm-up step drafted
    # learning deferred (a GPU engine's): the same decisions, the learning timed apart
    seconds, drafted, learn = policy_step_seconds(4, 4, number=5, defer=True)
    assert seconds > 0 and learn > 0
    assert drafted == 200
