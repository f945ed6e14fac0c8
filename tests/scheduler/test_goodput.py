"""The goodput controller's decisions on synthetic cost tables and acceptance streams."""

import numpy as np
import pytest

from scheduler.acceptance import AcceptanceModel
from scheduler.goodput import (
    MIN_PROBE_WAIT,
    GoodputController,
    best_width,
    expected_by_width,
    monotone_fit,
    probe_wait,
)
from scheduler.step_costs import SAMPLES, SKIP_LIMIT, SWEEP, WINDOW, StepCostTable


def leviathan(a: float, k: int) -> float:
    """Expected tokens of k drafts at acceptance a, written out term by term."""
    return sum(a ** j for j in range(k + 1))


def test_expected_tokens_by_width_sums_each_sequences_accepted_run():
    rates = np.array([[0.5] * 4, [0.9] * 4])  # two sequences, 4 positions
    got = expected_by_width(rates, np.array([4, 2]))  # the second can verify 2 drafts
    for w in range(5):
        want = leviathan(0.5, w) + leviathan(0.9, min(w, 2))
        assert got[w] == pytest.approx(want)
    per_position = expected_by_width(np.array([[0.9, 0.5, 0.0, 0.0]]), np.array([4]))
    assert per_position.tolist() == pytest.approx([1.0, 1.9, 2.35, 2.35, 2.35])


def table(cost_per_token: float, max_k: int = 4, batch: int = 8, plain_s: float = 0.01):
    """A controller whose step costs were measured: a plain step of ``plain_s`` seconds and
    ``cost_per_token`` of it per more token per sequence."""
    ctl = GoodputController(max_k, drafts_are_free=True, max_wait=16)
    for w in range(1, max_k + 2):
        for _ in range(4):  # (a cell's first step is its warm-up, not recorded)
            ctl.costs.record("step", batch, w, plain_s * (1 + cost_per_token * (w - 1)))
    return ctl


def measured(seconds: dict[int, float], batch: int = 1) -> GoodputController:
    """A controller whose step costs at ``batch`` were measured: ``seconds[w]`` for a step of
    width ``w`` (4 samples each; a cell's first is its warm-up)."""
    ctl = GoodputController(4, drafts_are_free=True, max_wait=16)
    for w, step_s in seconds.items():
        for _ in range(4):
            ctl.costs.record("step", batch, w, step_s)
    return ctl


def feed(ctl: GoodputController, accs, steps: int, accepted: int, drafted: int = 4,
         backed: int | None = None):
    """``steps`` verified steps of every request in ``accs``, one engine step each."""
    n = len(accs)
    for _ in range(steps):
        ctl.acceptance.tick()
        ctl.acceptance.update(accs, [drafted] * n, [accepted] * n, [backed] * n)


def test_chooses_no_drafts_when_they_lose_and_the_best_k_when_they_pay():
    cheap = table(0.05)  # a GPU at small batch: more tokens are nearly free
    accs = [cheap.acceptance.new_request() for _ in range(8)]
    feed(cheap, accs, 20, accepted=4)  # every draft accepted
    assert cheap.plan(accs, [4] * 8, 0) == 4  # a free proposer is asked for all of them
    assert cheap.choose_width(accs, [4] * 8, None, 0) == 4
    feed(cheap, accs, 20, accepted=0)  # every first draft rejected
    assert cheap.choose_width(accs, [4] * 8, None, 0) == 0
    dear = table(1.0)  # a compute-bound forward: every token costs a plain step
    accs = [dear.acceptance.new_request() for _ in range(8)]
    feed(dear, accs, 20, accepted=1, drafted=2)  # acceptance about 0.5
    assert dear.choose_width(accs, [4] * 8, None, 0) == 0


def test_no_drafts_when_only_a_minority_of_the_sequences_gains():
    """Two of eight sequences loop (every draft passes), six find nothing: the step's total
    would pay (16 tokens for 1.2 plain steps), yet six of eight sequences would get slower."""
    ctl = table(0.05)
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    looping, stuck = accs[:2], accs[2:]
    for _ in range(20):
        ctl.acceptance.tick()
        ctl.acceptance.update(looping, [4, 4], [4, 4], [4, 4])
        ctl.acceptance.update(stuck, [4] * 6, [0] * 6, [4] * 6)
    assert ctl.choose_width(accs, [4] * 8, [4] * 8, 0) == 0
    # a seeded sample verifies 2 drafts anyway: the step is paid, the best wider width wins
    assert ctl.choose_width(accs, [4] * 8, [4] * 8, 2) == 4
    more = accs[:5] + [ctl.acceptance.new_request() for _ in range(3)]
    for _ in range(20):  # five of eight loop now
        ctl.acceptance.tick()
        ctl.acceptance.update(more[2:5], [4] * 3, [4] * 3, [4] * 3)
        ctl.acceptance.update(looping, [4, 4], [4, 4], [4, 4])
        ctl.acceptance.update(more[5:], [4] * 3, [0] * 3, [4] * 3)
    assert ctl.choose_width(more, [4] * 8, [4] * 8, 0) == 4


def test_the_width_follows_per_position_acceptance_and_the_cost_table():
    ctl = table(0.3)
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    feed(ctl, accs, 30, accepted=1, drafted=4)  # the first draft always, the second never
    rates = ctl.acceptance.rates(accs)
    assert rates[0, 0] > 0.9 and rates[0, 1] < 0.1
    # one draft: 2 tokens for 1.3 plain steps beats 1 for 1; a second draft adds cost only
    assert ctl.choose_width(accs, [4] * 8, None, 0) == 1


def test_one_slow_first_step_does_not_rule_a_width_out():
    """4 drafts' first measured step was slow (a hiccup): until the width holds ``TRUSTED``
    samples it costs no more than 3 drafts, so it is tried again and judged on its samples."""
    ctl = GoodputController(4, drafts_are_free=True, max_wait=16)
    for w in range(1, 5):
        for _ in range(4):
            ctl.costs.record("step", 8, w, 0.010 * (1 + 0.05 * (w - 1)))
    ctl.costs.record("step", 8, 5, 0.0)  # (the cell's warm-up step: not recorded)
    ctl.costs.record("step", 8, 5, 0.030)  # one slow sample: 3 plain steps
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    feed(ctl, accs, 20, accepted=4)
    assert ctl.choose_width(accs, [4] * 8, None, 0) == 4
    for _ in range(2):  # then two steps at its true cost: its lower quartile is believed
        ctl.costs.record("step", 8, 5, 0.0120)
    assert ctl.step_cost(8)[5] == pytest.approx(1.2)
    assert ctl.choose_width(accs, [4] * 8, None, 0) == 4
    for _ in range(2):  # two more slow steps of 5 are a slow stretch (left out) ...
        ctl.costs.record("step", 8, 5, 0.030)
    assert ctl.choose_width(accs, [4] * 8, None, 0) == 4
    for _ in range(SKIP_LIMIT + 6):  # ... a width that stays slow loses
        ctl.costs.record("step", 8, 5, 0.030)
    assert ctl.choose_width(accs, [4] * 8, None, 0) == 3


def test_a_width_not_measured_yet_is_costed_between_its_measured_neighbours():
    """Only 1 and 4 drafts were measured (a probe's width and the one chosen since): 2 drafts
    sit on the line between them, and at acceptance 0.5 they are chosen (at the default cost,
    0.1 of a plain step a token, 2 drafts had lost to 1 and were never tried: seen in
    ``python -m benchmarks controller sim`` at batch 1, acceptance 0.3, with measured GPU cost
    ratios); past the widest measured width, its cost."""
    ctl = measured({1: 0.004, 2: 0.004 * 1.02, 5: 0.004 * 1.2})
    assert ctl.step_cost(1).tolist() == pytest.approx([1.0, 1.0, 1.02, 1.08, 1.14, 1.2])
    accs = [ctl.acceptance.new_request()]
    for _ in range(30):  # the first draft accepted in half the steps, the second likewise
        for accepted in (2, 0, 1, 0):
            feed(ctl, accs, 1, accepted=accepted, drafted=2)
    rates = ctl.acceptance.rates(accs)[0]
    assert 0.35 < rates[0] < 0.65 and 0.35 < rates[1] < 0.65
    # 1 draft: at most 1.65 tokens for 1.02 plain steps (1.62 a step); 2 drafts: at least
    # 1.35 + 0.35 * 0.35 = 1.47 for 1.08 (1.36): at these rates 2 drafts win where each
    # rate is at least about 0.45, which the pattern gives (1 draft wins below it)
    expected = 1 + rates[0] + rates[0] * rates[1]
    assert expected / 1.08 > (1 + rates[0]) / 1.02 > expected / 1.2  # (the premise)
    assert ctl.choose_width(accs, [2], None, 0) == 2
    wide = measured({1: 0.004, 3: 0.004 * 1.1})
    assert wide.step_cost(1).tolist() == pytest.approx([1.0, 1.0, 1.05, 1.1, 1.1, 1.1])
    untouched = measured({1: 0.004})
    assert untouched.step_cost(1).tolist() == pytest.approx([1.0, 1.0, 1.1, 1.2, 1.3, 1.4])


def test_best_width_needs_a_margin_over_plain_decoding_and_prefers_the_smaller_on_ties():
    tokens = np.array([8.0, 8.1, 8.15])
    assert best_width(tokens, np.array([1.0, 1.0, 1.0])) == 0  # under 2% more: no drafts
    assert best_width(np.array([8.0, 10.0, 10.0]), np.array([1.0, 1.0, 1.0])) == 1
    assert best_width(np.array([8.0, 10.0, 10.0]), np.ones(3), min_width=2) == 2


def test_evidence_separates_backed_drafts_from_guesses():
    ctl = table(0.1)
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    feed(ctl, accs, 20, accepted=2, backed=2)  # matches back 2 drafts, which pass; the
    # guesses after them fail
    assert ctl.choose_width(accs, [4] * 8, [2] * 8, 0) == 2
    assert ctl.choose_width(accs, [4] * 8, [0] * 8, 0) == 0  # nothing backed this step


def test_probes_come_within_the_bound_and_their_overhead_is_budgeted():
    assert probe_wait(0.1, 16) == 10  # a probe 10% dearer than a plain step: every 10 steps
    assert probe_wait(0.001, 16) == MIN_PROBE_WAIT
    assert probe_wait(0.9, 16) == 16  # never longer than the bound ...
    assert probe_wait(2.4, 16) == 48  # ... times a dear probe's cost in plain steps
    ctl = table(0.2)  # probes cost 80% of a plain step more: the longest wait
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    feed(ctl, accs, 20, accepted=0)
    probes = [step for step in range(200) if ctl.plan(accs, [4] * 8, 0)]
    assert probes and np.diff(probes).max() <= 16 and probes[0] < 16


def test_a_draft_step_measured_cheaper_than_a_plain_one_costs_a_plain_one():
    """At batch 1 on a GPU one draft's step costs about a plain step's, and a median below
    it is noise: it costs a plain step, so drafts that are never accepted stay off."""
    ctl = measured({1: 0.004, 2: 0.0039, 3: 0.0041, 4: 0.0040, 5: 0.0045})
    # (2 drafts measured at 1.025 and 3 at 1.0: pooled to their mean, not both at 1.025)
    assert ctl.step_cost(1).tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0125, 1.0125, 1.125])
    accs = [ctl.acceptance.new_request()]
    feed(ctl, accs, 20, accepted=0, drafted=1)
    assert ctl.choose_width(accs, [4], None, 0) == 0
    # a width not measured between them is not cheaper either (interpolated from the floor)
    gap = measured({1: 0.004, 2: 0.0038, 4: 0.0040, 5: 0.0044})
    assert gap.step_cost(1).tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0, 1.1])
    accs = [gap.acceptance.new_request()]
    feed(gap, accs, 20, accepted=0, drafted=2)
    assert gap.choose_width(accs, [4], None, 0) == 0


def test_monotone_fit_pools_what_falls_below_by_weight():
    assert monotone_fit([1.0, 1.2, 1.1, 1.3], [1, 1, 1, 1]) == pytest.approx(
        [1.0, 1.15, 1.15, 1.3])
    assert monotone_fit([1.2, 1.0, 1.0], [1, 1, 2]) == pytest.approx([1.05, 1.05, 1.05])
    assert monotone_fit([1.0, 1.1, 1.2], [5, 1, 1]) == [1.0, 1.1, 1.2]  # (already monotone)


def test_widths_of_about_equal_cost_are_not_made_dear_by_their_noise():
    """Batch 1 on an H100 with the fused kernels: 1 to 4 drafts cost within a few percent of a
    plain step, their medians in a noisy order. One noisy median (2 drafts at 1.10) raised
    every wider width to it: 4 drafts at acceptance 0.3 then looked worse than one (1.43 /
    1.10 against 1.3 / 1.0 tokens per plain step), and the controller kept to one. Pooled,
    the widths cost 1.057 and 4 drafts pay."""
    ctl = measured({1: 0.0025, 2: 0.00245, 3: 0.00275, 4: 0.002575, 5: 0.0026})
    assert ctl.step_cost(1).tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0567, 1.0567, 1.0567],
                                                      abs=1e-4)
    tokens = [leviathan(0.3, w) for w in range(5)]  # [5]: 1, 1.3, 1.39, 1.417, 1.425
    assert best_width(tokens, ctl.step_cost(1)[1:].tolist()) == 4
    raised = [1.0, 1.0, 1.10, 1.10, 1.10]  # (each width raised to the largest median below)
    assert best_width(tokens, raised) == 1


def test_a_request_in_a_freed_row_does_not_read_its_predecessors_estimates():
    """Estimates are cached by rows and the counts' version: a new request in the row of one
    that left reads its own (the engine's prior), not the cached ones of the row's last."""
    model = AcceptanceModel(4, capacity=1)
    gone = model.new_request()
    for _ in range(10):
        model.tick()
        model.update([gone], [4], [4], [4])
    assert model.estimates([gone])[0, 0] > 0.9
    model.release(gone)
    fresh = model.new_request()
    assert fresh.row == 0  # (the same row)
    assert model.estimates([fresh])[0, 0] == pytest.approx(model.engine_rates[0])


@pytest.mark.parametrize("cost_per_token", [0.05, 0.3])
def test_recovers_after_drift_within_its_bound(cost_per_token):
    """Acceptance 0 for long enough that drafting stops, then every draft passes: within one
    probe wait (at most 16 steps, times a probe's cost in plain steps when it is more than one:
    here 1.2, so 32) every step drafts again."""
    ctl = table(cost_per_token)
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    widths = []
    for _ in range(300):  # the zero-acceptance stretch, probes included
        width = ctl.choose_width(accs, [4] * 8, None, 0) if ctl.plan(accs, [4] * 8, 0) else 0
        feed(ctl, accs, 1, accepted=0, drafted=width)
        widths.append(width)
    assert sum(w > 0 for w in widths[-100:]) <= 100 // 5  # only probes draft
    drafting = []
    for _ in range(40):  # the text became predictable (the bound, 32 here, and some more)
        width = ctl.choose_width(accs, [4] * 8, None, 0) if ctl.plan(accs, [4] * 8, 0) else 0
        drafting.append(width)
        feed(ctl, accs, 1, accepted=width, drafted=width)
    first = next(i for i, w in enumerate(drafting) if w > 0)
    assert first < probe_wait(ctl.step_cost(8)[5] - 1.0, 16) <= 32  # the first probe
    assert all(w == 4 for w in drafting[first:])  # one probe was enough


def test_new_requests_after_drift_are_probed_within_a_fraction_of_the_wait():
    """A probe 1.3 plain steps dear waits the whole bound (16 here) while drafts lose. When the
    step's sequences are new requests, never tested (a new batch of prompts: the drift that
    comes with new text), the first probe comes within a quarter of that wait; where only one
    of them is new, the usual wait holds."""
    ctl = table(0.075)  # 4 drafts cost 1.3 plain steps: the wait is the bound
    wait = probe_wait(ctl.step_cost(8)[5] - 1.0, 16)
    assert wait == 16
    old = [ctl.acceptance.new_request() for _ in range(8)]
    for _ in range(40):  # the zero-acceptance stretch on the old requests
        width = ctl.choose_width(old, [4] * 8, None, 0) if ctl.plan(old, [4] * 8, 0) else 0
        feed(ctl, old, 1, accepted=0, drafted=width)

    def first_probe(accs) -> int:
        for step in range(3 * wait):
            if ctl.plan(accs, [4] * 8, 0):
                return step
            feed(ctl, accs, 1, accepted=0, drafted=0)
        raise AssertionError("no probe")

    ctl.idle = 0  # (the last probe just now)
    new = [ctl.acceptance.new_request() for _ in range(8)]
    assert ctl.acceptance.untested_share(new) == 1.0
    assert first_probe(new) < 4  # (a quarter of 16)
    feed(ctl, new, 1, accepted=0)  # the probe's drafts were rejected: tested now
    assert ctl.acceptance.untested_share(new) == 0.0
    ctl.idle = 0
    mixed = old[:7] + [ctl.acceptance.new_request()]
    assert ctl.acceptance.untested_share(mixed) == 1 / 8
    assert first_probe(mixed) >= wait - 1  # (the usual wait)


def test_requests_the_proposer_finds_nothing_for_are_not_new_for_good():
    """Found in review: five of eight requests whose n-gram proposals never match had no draft
    verified, so the batch stayed "mostly untested" and probed every 4 steps instead of 16. A
    request the proposer was asked for is tested, matched or not."""
    ctl = table(0.075)  # a probe costs 1.3 plain steps: the wait is the bound, 16
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    avail = [0] * 5 + [4] * 3  # (five never matched)
    probes = []
    for step in range(100):
        width = ctl.choose_width(accs, avail, None, 0) if ctl.plan(accs, [4] * 8, 0) else 0
        if ctl.probing:
            probes.append(step)
        ctl.acceptance.tick()
        ctl.acceptance.update(accs, [min(a, width) for a in avail], [0] * 8, [None] * 8)
    assert ctl.acceptance.untested_share(accs) == 0.0
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert probes and min(gaps) >= 15  # (the full wait, not a quarter of it)


def test_a_costly_proposers_first_probe_after_it_stopped_comes_sooner():
    """The same for a proposer whose k is chosen before it runs (a draft head on CPU, a draft
    model): drafting stops in ``plan``; its first probe comes within a quarter of the wait,
    the next one after the whole wait."""
    ctl = GoodputController(4, drafts_are_free=False, max_wait=16)
    for w in range(1, 6):
        for _ in range(4):
            ctl.costs.record("step", 1, w, 0.01 * (1 + 0.03 * (w - 1)))
    for k in range(1, 5):
        for _ in range(4):
            ctl.costs.record("propose", 1, k, 0.01 * 0.25 * k)  # a draft: 0.25 plain steps
    accs = [ctl.acceptance.new_request()]
    widths, probes = [], []
    for step in range(80):
        width = ctl.plan(accs, [4], 0, measured_draft_cost=0.25)
        widths.append(width)
        if ctl.probing:
            probes.append(step)
        ctl.acceptance.tick()
        accepted = width if step < 8 else 0  # (then the text changes)
        ctl.acceptance.update(accs, [width], [accepted], [None])
    stopped = widths.index(0)
    assert 0 < stopped and len(probes) >= 2
    assert probes[0] - stopped <= 4  # (a quarter of 16)
    assert probes[1] - probes[0] == 16


def test_the_first_probe_after_drafting_stops_comes_sooner_then_the_wait_holds():
    """Drafting paid, then stopped (rejected steps: at batch 1 that may be noise): the first
    probe comes within a quarter of the wait; when it finds the drafts rejected again, the
    next one waits in full."""
    ctl = table(0.075)  # a probe of 4 drafts costs 1.3 plain steps: the wait is the bound, 16
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    feed(ctl, accs, 10, accepted=4)
    widths, probes = [], []
    for step in range(60):
        width = ctl.choose_width(accs, [4] * 8, None, 0) if ctl.plan(accs, [4] * 8, 0) else 0
        widths.append(width)
        if ctl.probing:
            probes.append(step)
        feed(ctl, accs, 1, accepted=4 if step < 5 else 0, drafted=width)  # then no longer
    stopped = widths.index(0)
    assert widths[:5] == [4] * 5 and len(probes) >= 2
    assert probes[0] - stopped <= 4  # (16 / 4)
    assert probes[1] - probes[0] == 16  # then the usual wait


def prepared_controller(monkeypatch):
    """A free proposer's controller at batch 8 that drafted (two critical sequences weighed,
    then all eight by ``plan``), and a counter of the decisions weighed afresh (``_decide``
    calls)."""
    calls = [0]
    decide = GoodputController._decide

    def counted(self, *args):
        calls[0] += 1
        return decide(self, *args)

    monkeypatch.setattr(GoodputController, "_decide", counted)
    ctl = table(0.05)
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    feed(ctl, accs, 10, accepted=3)
    critical = [True, True] + [False] * 6
    assert ctl.plan(accs, [4] * 8, 0, critical=critical) == 4
    ctl.choose_width(accs, [4] * 8, None, 0, critical=critical)
    ctl._keep_asking = False  # (weighed in full: as when the last step did not pay its
    # proposal too)
    assert ctl.plan(accs, [4] * 8, 0) == 4  # (all of them weighed now)
    assert ctl._last_accs == accs
    ctl.prepare(8)  # (raised a ValueError: 8 sequences against 2 drafts' counts)
    return ctl, accs, critical, calls


def test_the_prepared_decision_is_for_the_sequences_that_choice_weighed(monkeypatch):
    """``prepare`` decides the next width ahead for the sequences and drafts of the last
    ``choose_width``, even when ``plan`` weighed others since (a closed batch's critical ones
    at one step, all of them at the next); ``choose_width`` then takes it without weighing,
    and it is what a controller that prepared nothing chooses."""
    ctl, accs, critical, calls = prepared_controller(monkeypatch)
    before = calls[0]
    width = ctl.choose_width(accs, [4] * 8, None, 0, critical=critical)
    assert calls[0] == before  # (served by the prepared decision)
    ctl._decided = None
    assert ctl.choose_width(accs, [4] * 8, None, 0, critical=critical) == width
    assert calls[0] == before + 1


@pytest.mark.parametrize("change", ["drafting", "cost", "acceptance", "drafts"])
def test_a_prepared_decision_is_weighed_again_when_an_input_changed(monkeypatch, change):
    """Each input of the decision is part of its key: the drafting state (the confidence
    spread), a step cost recorded, an acceptance update, the drafts proposed."""
    ctl, accs, critical, calls = prepared_controller(monkeypatch)
    avail = [4] * 8
    if change == "drafting":
        ctl.drafting = False
    elif change == "cost":
        for _ in range(SKIP_LIMIT + 12):  # (its lower quartile moves)
            ctl.costs.record("step", 8, 5, 0.02)
    elif change == "acceptance":
        feed(ctl, accs, 1, accepted=0)
    else:
        avail = [3] * 8
    before = calls[0]
    ctl.choose_width(accs, avail, None, 0, critical=critical)
    assert calls[0] == before + 1


def test_a_costly_proposer_gets_k_before_proposing_with_its_measured_cost():
    ctl = GoodputController(4, drafts_are_free=False, max_wait=16)
    for w in range(1, 6):
        for _ in range(4):
            ctl.costs.record("step", 1, w, 0.01)  # scoring more tokens is free ...
    for k in range(1, 5):
        for _ in range(4):
            ctl.costs.record("propose", 1, k, 0.004 * k)  # ... each draft costs 0.4 steps
    acc = ctl.acceptance.new_request()
    feed(ctl, [acc], 30, accepted=4)
    # all accepted: (k + 1) / (1 + 0.4 k) grows with k: 4 drafts
    assert ctl.plan([acc], [4], 0) == 4
    feed(ctl, [acc], 30, accepted=1, drafted=2)  # about 0.5
    assert ctl.plan([acc], [4], 0) == 1  # 1.5 / 1.4 pays; a second draft (1.75 / 1.8) does not
    assert ctl.plan([acc], [0], 0) == 0  # capped at 0: nothing


def test_a_batch_size_without_plain_steps_measures_some_before_trusting_its_costs():
    ctl = GoodputController(4, drafts_are_free=True, max_wait=16)
    for _ in range(4):
        ctl.costs.record("step", 4, 5, 0.01)
    assert ctl.costs.relative("step", 4, 5) is None
    accs = [ctl.acceptance.new_request() for _ in range(4)]
    plans = [ctl.plan(accs, [4] * 4, 0) for _ in range(8)]
    assert plans.count(0) == 2  # every 4th step, until two plain steps are measured
    for _ in range(3):
        ctl.costs.record("step", 4, 1, 0.008)
    assert ctl.costs.relative("step", 4, 5) == pytest.approx(1.25)
    assert 0 not in [ctl.plan(accs, [4] * 4, 0) for _ in range(8)]


def test_step_costs_take_the_lower_quartile_and_borrow_from_the_nearest_batch_size():
    costs = StepCostTable()
    costs.record("step", 8, 1, 0.9)  # a cell's first step (a kernel compiled): left out
    assert costs.count("step", 8, 1) == 0
    # half of the samples slower (by less than OUTLIER: none left out)
    for seconds in [0.010, 0.014, 0.010, 0.014, 0.014, 0.010, 0.014, 0.010]:
        costs.record("step", 8, 1, seconds)
    for _ in range(3):
        costs.record("step", 8, 5, 0.015)
        costs.record("step", 32, 1, 0.02)
        costs.record("step", 32, 5, 0.06)
    assert costs.count("step", 8, 1) == 8
    assert costs.seconds("step", 8, 1) == pytest.approx(0.010)
    assert costs.relative("step", 8, 5) == pytest.approx(1.5)
    assert costs.relative("step", 10, 5) == pytest.approx(1.5)  # nearest: 8
    assert costs.relative("step", 24, 5) == pytest.approx(3.0)  # nearest: 32
    assert costs.relative("step", 8, 3) is None


def test_acceptance_of_a_new_request_starts_at_the_engines_and_follows_its_own():
    model = AcceptanceModel(4, capacity=1)
    old = model.new_request()
    for _ in range(50):
        model.tick()
        model.update([old], [4], [0], [None])  # the engine learns that drafts fail
    new = model.new_request()  # (the pool grows)
    assert model.rates([new])[0, 0] < 0.05
    for _ in range(5):
        model.tick()
        model.update([new], [4], [4], [None])
    assert model.rates([new])[0, 0] > 0.7  # its own evidence outweighs the prior
    row = old.row
    model.release(old)
    assert old.row == -1 and model.new_request().row == row  # the row is reused


def test_a_private_step_teaches_its_own_request_and_not_the_engine():
    """A draft tree's acceptance (``private``) stays with its request: a new request starts
    from the chains' rate."""
    model = AcceptanceModel(4)
    chain, tree = model.new_request(), model.new_request()
    for _ in range(30):
        model.tick()
        model.update([chain, tree], [4, 4], [0, 4], [None, None], private=[False, True])
    assert model.rates([tree])[0, 0] > 0.8  # its own, all accepted
    assert model.rates([model.new_request()])[0, 0] < 0.05  # the engine's: the chain's
    shared = AcceptanceModel(4)
    a, b = shared.new_request(), shared.new_request()
    for _ in range(30):
        shared.tick()
        shared.update([a, b], [4, 4], [0, 4], [None, None])
    assert 0.3 < shared.rates([shared.new_request()])[0, 0] < 0.7  # (both counted)


def run_iid(ctl: GoodputController, rates: list[float], steps: int, seed: int = 0) -> float:
    """One request at batch 1 whose draft ``j`` is accepted with probability ``rates[j]``
    (given the ones before), each step decided as the engine does (plan, the free proposer's
    drafts, choose_width); returns the fraction of steps that verified drafts."""
    rng = np.random.default_rng(seed)
    accs = [ctl.acceptance.new_request()]
    drafted = 0
    for _ in range(steps):
        width = ctl.choose_width(accs, [4], None, 0) if ctl.plan(accs, [4], 0) else 0
        accepted = 0
        while accepted < width and rng.random() < rates[accepted]:
            accepted += 1
        ctl.acceptance.update(accs, [width], [accepted], [None])
        drafted += width > 0
    return drafted / steps


def head_like_table(proposal: float) -> GoodputController:
    """Batch 1 on a GPU: more tokens per sequence nearly free (3% of a plain step each), a
    proposal of 4 drafts costing ``proposal`` plain steps."""
    ctl = table(0.03, batch=1)
    for _ in range(4):
        ctl.costs.record("propose", 1, 4, 0.01 * proposal)
    return ctl


@pytest.mark.parametrize("rates, proposal, at_least", [
    ([0.45, 0.5, 0.55, 0.6], 0.27, 0.9),  # (59-68% of the steps without the bound)
    ([0.35, 0.45, 0.5, 0.55], 0.27, 0.75),  # (26-31%)
    ([0.35, 0.45, 0.5, 0.55], 0.08, 0.9),  # (77-87%)
])
def test_noise_in_an_acceptance_that_pays_does_not_stop_the_drafts(rates, proposal, at_least):
    """A draft head's acceptance does not come in bursts, but at batch 1 its estimate rests on a
    few decayed steps. Drafting pays in each case (with 4 drafts: 1.9 or 1.6 expected tokens
    for 1.39 plain steps, proposal included, or 1.6 for 1.2); read at face value, a few
    rejected steps in a row stopped the drafts until a probe found otherwise (the fractions of
    drafting steps without the confidence bound are in the comments, seeds 0 and 1)."""
    for seed in (0, 1):
        assert run_iid(head_like_table(proposal), rates, 3000, seed) >= at_least


@pytest.mark.parametrize("proposal", [0.27, 0.08, 0.0])
def test_drafts_that_are_never_accepted_stop_whatever_the_proposal_costs(proposal):
    """Acceptance 0: only probes draft (the confidence bound must not keep a cheap proposer
    drafting on the optimistic start of positions never tested)."""
    assert run_iid(head_like_table(proposal), [0.0] * 4, 3000) <= 0.2


def test_a_closed_batch_weighs_only_its_critical_sequences():
    """Seven sequences loop (every draft passes), one finds nothing. Counted all together the
    step pays; in a closed batch where the one that finds nothing has the most tokens left,
    drafting would not bring the batch's end closer, so the step stays plain; where the looping
    ones are the critical ones, it drafts. Every sequence learns from the proposal either way."""
    ctl = table(0.05)
    accs = [ctl.acceptance.new_request() for _ in range(8)]
    looping, stuck = accs[:7], accs[7:]
    backed = [4] * 7 + [0]
    for _ in range(20):  # the n-gram proposer backs the looping ones' drafts, never the other's
        ctl.acceptance.tick()
        ctl.acceptance.record_proposals(accs, backed)
        ctl.acceptance.update(looping, [4] * 7, [4] * 7, [4] * 7)
        ctl.acceptance.update(stuck, [4], [0], [0])
    assert ctl.choose_width(accs, [4] * 8, backed, 0) == 4  # open batch: the total counts
    only_stuck = [False] * 7 + [True]
    assert ctl.choose_width(accs, [4] * 8, backed, 0, only_stuck, 8) == 0
    looping_first = [True] * 7 + [False]
    assert ctl.choose_width(accs, [4] * 8, backed, 0, looping_first, 8) == 4
    assert ctl.plan(accs, [4] * 8, 0, 0.0, looping_first, 8) == 4
    # a seeded sample's width is verified whatever the critical sequences gain
    assert ctl.choose_width(accs, [4] * 8, backed, 2, only_stuck, 8) == 2


def test_a_released_request_cannot_be_updated():
    """A finished request's row goes back to the pool: updating it would write another
    request's counts, so it is refused by name."""
    model = AcceptanceModel(4)
    done, live = model.new_request(), model.new_request()
    model.release(done)
    with pytest.raises(ValueError, match="released"):
        model.update([live, done], [4, 4], [2, 2], [4, 4])


def test_the_prepared_table_answers_what_the_direct_computation_does():
    """``prepare`` (run where the forward hides it) tabulates each sequence's expected tokens
    for every (backed, available) drafts; ``choose_width`` looks them up. The lookup equals
    the direct computation (rates with the unbacked positions pooled, then the sums), and a
    decision after it equals one without it, for random estimates and proposals."""
    from scheduler.goodput import sequence_tokens, tokens_table

    rng = np.random.default_rng(0)
    estimates = rng.random((6, 6))  # [n, max_k + 2], max_k = 4
    table = tokens_table(estimates, 4)
    for _ in range(50):
        avail = rng.integers(0, 5, 6)
        backed = np.minimum(rng.integers(0, 5, 6), avail)
        unbacked = np.arange(4)[None, :] >= backed[:, None]
        rates = np.where(unbacked, estimates[:, 4:5], estimates[:, :4])
        assert table[np.arange(6), backed, avail] == pytest.approx(
            sequence_tokens(rates, avail))
    plain, prepared = (table_controller() for _ in range(2))
    for ctl in (plain, prepared):
        accs = [ctl.acceptance.new_request() for _ in range(8)]
        ctl.accs = accs
        feed(ctl, accs[:4], 10, accepted=2)
        feed(ctl, accs[4:], 10, accepted=0, backed=1)
    for step in range(40):
        avail = [int(x) for x in rng.integers(0, 5, 8)]
        backed = [min(int(x), a) for x, a in zip(rng.integers(0, 5, 8), avail, strict=True)]
        widths = []
        for ctl in (plain, prepared):
            if ctl is prepared and step:  # (after a first decision: its sequences)
                ctl.prepare(8)
                assert ctl._prepared_tokens(ctl.accs, avail, backed) is not None
            widths.append((ctl.choose_width(ctl.accs, avail, backed, 0), ctl._keep_asking))
            feed(ctl, ctl.accs, 1, accepted=step % 3, drafted=2, backed=1)
        assert widths[0] == widths[1]


def table_controller():
    return table(0.1)


def test_step_costs_shrug_off_a_stretch_of_slow_steps():
    """The H100 machine's slow stretches at batch 1: a step of 5 plain steps' time, then 3.5,
    2.5, 1.9, 1.6, 1.4, 1.3, 1.2 (whatever the width). Those over ``OUTLIER`` times the cell's
    answer are left out, and the lower quartile shrugs off the rest: the cell still answers
    its width's own cost (the median of all of them: 1.6)."""
    costs = StepCostTable()
    stretch = [5.0, 3.5, 2.5, 1.9, 1.6, 1.4, 1.3, 1.2]
    for seconds in [0.0, 1.02, 1.03, 1.04, *stretch]:  # (the first: the warm-up)
        costs.record("step", 1, 5, 0.0025 * seconds)
    assert costs.samples("step", 1, 5) == pytest.approx([0.0025 * s for s in
                                                         [1.02, 1.03, 1.04, 1.4, 1.3, 1.2]])
    assert costs.seconds("step", 1, 5) == pytest.approx(0.0025 * 1.03)


def test_step_cost_samples_expire_so_an_unused_width_is_measured_again():
    """A sample older than ``WINDOW`` recorded steps of its batch size is dropped: the cell
    reads as not measured (the controller then costs it optimistically and tries it), and
    its next step is a sample at once (its warm-up was long ago). The plain cell does not
    expire (while drafting pays, nothing would measure it again)."""
    costs = StepCostTable()
    for _ in range(4):
        costs.record("step", 8, 1, 0.010)
        costs.record("step", 8, 5, 0.012)
    version = costs.version
    for _ in range(WINDOW + SWEEP):  # the engine settles on 2 drafts at batch 8 (cells' ages
        # are looked at every SWEEP steps)
        costs.record("step", 8, 3, 0.011)
    assert costs.version > version
    assert costs.count("step", 8, 5) == 0 and costs.seconds("step", 8, 5) is None
    assert costs.count("step", 8, 1) == 3 and costs.relative("step", 8, 3) == pytest.approx(1.1)
    assert costs.count("step", 8, 3) == SAMPLES
    costs.record("step", 8, 5, 0.013)
    assert costs.samples("step", 8, 5) == [0.013]
    assert costs.relative("step", 8, 5) == pytest.approx(1.3)  # (untrusted: its fastest)


def test_a_width_not_measured_is_not_read_off_an_untrusted_one():
    """Steps of 1 and 2 drafts were never measured and of 3 drafts once, in a slow stretch (5
    plain steps): the line to that one sample made 1 and 2 drafts cost 2.3 and 3.7 plain steps,
    and the controller stopped drafting (seen in simulation with slow stretches). Untrusted,
    it is no end of the line: 1 and 2 drafts cost the default, 3 drafts what 2 do until
    measured."""
    ctl = measured({1: 0.004})
    ctl.costs.record("step", 1, 4, 0.0)  # (the warm-up)
    ctl.costs.record("step", 1, 4, 0.020)
    cost = ctl.step_cost(1)
    assert cost[2:5].tolist() == pytest.approx([1.1, 1.2, 1.2])  # DEFAULT_VERIFY_COST a token


def test_a_deep_position_tried_rarely_reads_near_the_one_before_it():
    """With 2 drafts verified nearly always, the third position was tested once and rejected:
    on its own it read near 0, and the controller never verified 3 drafts again (the engine
    rates by position at acceptance 0.5 on the H100: 0.57, 0.52, 0.48, 0.002). Shrunk toward
    the position before it by ``POSITION_PRIOR`` tries, it reads near half of it; evidence
    outweighs that prior: a position rejected in every step reads low."""
    model = AcceptanceModel(4, capacity=1)
    acc = model.new_request()
    for _ in range(30):
        model.tick()
        model.update([acc], [2], [2], [None])
    model.tick()
    model.update([acc], [4], [2], [None])  # the third draft tested once: rejected
    rates = model.engine_rates
    assert rates[1] > 0.9
    assert 0.35 < rates[2] < 0.6 and rates[3] > 0.35
    for _ in range(30):
        model.tick()
        model.update([acc], [4], [2], [None])
    assert model.engine_rates[2] < 0.1


def test_a_trusted_cell_leaves_out_a_slow_stretch_but_follows_a_cost_that_moved():
    """Samples over ``OUTLIER`` times a trusted cell's answer are left out (a slow stretch of
    13 steps is more than three quarters of a cell's recent samples), unless ``SKIP_LIMIT``
    came in a row: then the cost moved and the cell takes them."""
    costs = StepCostTable()
    for seconds in [0.0, 0.010, 0.010, 0.010]:  # (the first: the warm-up)
        costs.record("step", 1, 5, seconds)
    for seconds in [0.05, 0.04, 0.03, 0.025, 0.02, 0.018, 0.017, 0.016][:SKIP_LIMIT]:
        costs.record("step", 1, 5, seconds)
    assert costs.samples("step", 1, 5) == [0.010] * 3
    assert costs.seconds("step", 1, 5) == pytest.approx(0.010)
    costs.record("step", 1, 5, 0.011)  # (within the bound: the count of left out restarts)
    for _ in range(SKIP_LIMIT + 12):  # twice the cost for good: each taken after SKIP_LIMIT
        costs.record("step", 1, 5, 0.020)
    assert costs.count("step", 1, 5) == SAMPLES
    assert costs.seconds("step", 1, 5) == pytest.approx(0.020)


def test_a_probes_proposal_after_plain_steps_counts_in_the_probes_cost():
    """A probe's proposal follows plain steps, so it is never a typical one and its time was
    left out: a probe read as cheap as its forward (1% over a plain step here) and came every
    2 steps where drafts fail (the 8B at batch 1 on the H100: 0.95 of plain decoding). Its
    time after plain steps (kind "probe") now counts: at 0.2 plain steps, a probe every 21."""

    def probes(after_idle_s: float | None) -> int:
        ctl = measured({1: 0.010, 5: 0.0101})
        if after_idle_s is not None:
            for _ in range(4):  # (the first: the cell's warm-up)
                ctl.record(1, 5, 0.0101, 4, None, after_idle_s)
        acc = ctl.acceptance.new_request()
        feed(ctl, [acc], 30, accepted=0)  # every draft fails
        return sum(ctl.plan([acc], [4], 0) > 0 for _ in range(105))

    assert probes(None) >= 40
    assert 4 <= probes(0.002) <= 6


def pack_unequal(n: int, longest: int, total: int) -> int | None:
    """A packing rule (``ModelRunner.packed_rows``'s shape): every step of unequal rows."""
    return total if longest > 1 and total < n * longest else None


def test_a_packed_step_is_priced_by_its_rows_and_then_by_its_measured_cost():
    """16 sequences, 9 with 4 drafts that always pass, 7 with none, where padding every
    sequence to 5 tokens costs 4 plain steps (a compute-bound forward): padded, drafting does
    not pay. Packed (52 rows of one token) it is priced at its rows until measured, chosen,
    and dropped again once its measured cost loses too. A packed step's time is recorded as
    such, not as its width's."""
    widths = {1: 0.01, 2: 0.02, 3: 0.025, 4: 0.03, 5: 0.04}
    avail = [4] * 9 + [0] * 7
    layout = (16, 1, 16)  # (16 decoding sequences, before their drafts)
    padded = measured(widths, batch=16)
    accs = [padded.acceptance.new_request() for _ in range(16)]
    feed(padded, accs, 20, accepted=4)
    assert padded.choose_width(accs, avail, None, 0, layout=layout) == 0
    ctl = measured(widths, batch=16)
    ctl.packed_rows = pack_unequal
    accs = [ctl.acceptance.new_request() for _ in range(16)]
    feed(ctl, accs, 20, accepted=4)
    # 52 rows: DEFAULT_VERIFY_COST for each of the 36 rows past 16, over 16: 1.225 plain steps
    assert ctl.packed_cost(16, 52) == pytest.approx(1.225)
    assert ctl.choose_width(accs, avail, None, 0, layout=layout) == 4
    before = ctl.costs.samples("step", 16, 5)
    for _ in range(4):  # measured: 5 plain steps (a cell's first sample is its warm-up)
        ctl.record(16, 5, 0.05, 0, None, packed_rows=52)
    assert ctl.costs.samples("packed", 16, 52) == [0.05] * 3
    assert ctl.costs.samples("step", 16, 5) == before
    assert ctl.packed_cost(16, 52) == pytest.approx(5.0)
    # 3 drafts a sequence pack 43 rows, not measured: tried next; once dear too, no drafts
    assert ctl.choose_width(accs, avail, None, 0, layout=layout) == 3
    for rows in (43, 34, 25):
        for _ in range(4):
            ctl.record(16, 5, 0.05, 0, None, packed_rows=rows)
    assert ctl.choose_width(accs, avail, None, 0, layout=layout) == 0
    # no layout (a prompt chunk in the step): priced padded
    ctl.record(16, 5, 0.001, 0, None, packed_rows=52)
    assert ctl.choose_width(accs, avail, None, 0) == 0


def test_plan_prices_a_costly_proposers_packed_step_for_capped_requests():
    """A costly proposer's drafts: 16 of 32 sequences may draft 4 (all pass), 16 are capped at
    0 (opted out). Padded, every sequence would pay 5 tokens (3.5 plain steps): no drafts;
    packed (96 rows of one token, priced at their rows until measured): drafts."""
    widths = {1: 0.01, 2: 0.0165, 3: 0.023, 4: 0.029, 5: 0.035}
    for packing, want in ((None, 0), (pack_unequal, 4)):
        ctl = GoodputController(4, drafts_are_free=False, max_wait=16, draft_cost=0.05)
        ctl.packed_rows = packing
        for w, step_s in widths.items():
            for _ in range(4):
                ctl.costs.record("step", 32, w, step_s)
        accs = [ctl.acceptance.new_request() for _ in range(32)]
        feed(ctl, accs[:16], 20, accepted=4)
        caps = [4] * 16 + [0] * 16
        assert ctl.plan(accs, caps, 0, layout=(32, 1, 32)) == want
