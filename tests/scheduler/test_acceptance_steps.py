"""Several steps learnt together (``AcceptanceModel.update_steps``, an overlapped engine's) give
what learning them one at a time gives (``record_proposals`` then ``update``, each at its
engine step)."""

import numpy as np
import pytest

from scheduler.acceptance import AcceptanceModel, RequestAcceptance, StepUpdate


def _new_requests(models: list[AcceptanceModel], n: int) -> list[RequestAcceptance]:
    """``n`` requests allocated in every one of ``models`` (at the same rows: the models are
    alike); the first one's objects."""
    reqs = [models[0].new_request() for _ in range(n)]
    for other in models[1:]:
        assert [other.new_row() for _ in reqs] == [r.row for r in reqs]
    return reqs


def _random_steps(rng: np.random.Generator, reqs: list[RequestAcceptance], clock: int, k: int,
                  num_steps: int) -> list[StepUpdate]:
    """Steps after engine step ``clock`` of ``reqs`` (some in every step, some skipping steps),
    with drafts accepted, rejected or none, backed or not, private trees, proposals and gaps
    of engine steps between them (the evidence ages over a gap)."""
    steps = []
    for _ in range(num_steps):
        clock += int(rng.choice([1, 1, 1, 2, 7]))
        chosen = [r for r in reqs if rng.random() < 0.7] if rng.random() < 0.9 else []
        drafted = [int(rng.integers(0, k + 1)) for _ in chosen]
        accepted = [int(rng.integers(0, d + 1)) for d in drafted]
        backed = [None if rng.random() < 0.3 else int(rng.integers(0, d + 1)) for d in drafted]
        private = [bool(rng.random() < 0.2) for _ in chosen] if rng.random() < 0.5 else None
        proposals = None
        if rng.random() < 0.5:
            asked = [r for r in reqs if rng.random() < 0.6]
            proposals = (asked, [int(rng.integers(0, k + 1)) for _ in asked])
        steps.append(StepUpdate(chosen, drafted, accepted, backed, private, proposals, clock))
    return steps


def _one_at_a_time(model: AcceptanceModel, steps: list[StepUpdate]) -> None:
    for step in steps:
        model.clock = step.clock
        if step.proposals is not None:
            model.record_proposals(*step.proposals)
        model.update(step.reqs, step.drafted, step.accepted, step.backed, step.private)


def _state(model: AcceptanceModel) -> list[np.ndarray]:
    return [model.counts, model.stamps, model.found, model.engine, model.engine_rates,
            np.array([model.stamp])]


@pytest.mark.parametrize("seed", range(40))
def test_steps_learnt_together_equal_steps_learnt_one_at_a_time(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    alone, together = AcceptanceModel(k), AcceptanceModel(k)
    # (the same history first, so that both start from learnt counts and aged stamps; then
    # steps of those requests and of new ones)
    old = _new_requests([alone, together], 4)
    history = _random_steps(np.random.default_rng(1000 + seed), old, 0, k, 5)
    _one_at_a_time(alone, history)
    _one_at_a_time(together, history)
    reqs = old + _new_requests([alone, together], 3)
    steps = _random_steps(rng, reqs, history[-1].clock, k, int(rng.integers(1, 9)))
    _one_at_a_time(alone, steps)
    together.update_steps(steps)
    for a, b in zip(_state(alone), _state(together), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_a_request_in_two_steps_decays_between_them():
    # Worked by hand: one request, k = 1, drafts accepted at engine steps 1 and 2 (no gap:
    # no ageing). Its backed hits go 0 -> 0 * 0.8 + 1 = 1 -> 1 * 0.8 + 1 = 1.8.
    model = AcceptanceModel(1)
    req = model.new_request()
    model.update_steps([StepUpdate([req], [1], [1], [None], None, None, 1),
                        StepUpdate([req], [1], [1], [None], None, None, 2)])
    assert model.counts[req.row, 0, 0] == pytest.approx(1.8)
    assert model.counts[req.row, 1, 0] == pytest.approx(1.8)
    assert model.stamps[req.row] == 2


def test_a_released_request_cannot_be_learnt_with_others():
    model = AcceptanceModel(2)
    kept, gone = model.new_request(), model.new_request()
    model.release(gone)
    with pytest.raises(ValueError, match="released"):
        model.update_steps([StepUpdate([kept, gone], [2, 2], [1, 1], [None, None], None, None,
                                       1)])


@pytest.mark.parametrize("waiting", [False, True], ids=["plain", "a-proposal-waiting"])
def test_plain_steps_learnt_together_equal_one_at_a_time(waiting):
    """Steps without drafts (a plain stretch) change nothing, learnt together or one at a time,
    unless a proposal recorded before them waits to be counted with a request's next update
    (then they count it, as one at a time does)."""
    k = 3
    alone, together = AcceptanceModel(k), AcceptanceModel(k)
    reqs = _new_requests([alone, together], 3)
    history = _random_steps(np.random.default_rng(7), reqs, 0, k, 4)
    _one_at_a_time(alone, history)
    _one_at_a_time(together, history)
    if waiting:
        for model in (alone, together):
            model.record_proposals(reqs[:2], [2, 0])
    clock = history[-1].clock
    plain = [StepUpdate(reqs, [0] * 3, [0] * 3, [None] * 3, None, None, clock + i)
             for i in range(1, 5)]
    version = together.version
    _one_at_a_time(alone, plain)
    together.update_steps(plain)
    for a, b in zip(_state(alone), _state(together), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
    assert (together.version > version) == waiting


def test_step_codes_cap_the_accepted_and_backed_drafts_at_the_drafted_ones():
    """``(d * K1 + min(a, d)) * K1 + min(b, d)`` with ``K1 = max_k + 1``, a ``b`` of None read
    as ``d`` (every draft backed); worked out by hand for max_k = 3."""
    model = AcceptanceModel(3)
    codes = model._codes([2, 3, 0, 1, 3], [5, 1, 0, 0, 3], [None, 0, None, 3, 2])
    assert codes.tolist() == [(2 * 4 + 2) * 4 + 2, (3 * 4 + 1) * 4 + 0, 0,
                              (1 * 4 + 0) * 4 + 1, (3 * 4 + 3) * 4 + 2]
    assert codes.tolist() == [42, 52, 0, 17, 62]
