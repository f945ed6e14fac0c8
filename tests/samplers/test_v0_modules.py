"""vLLM V0's sampler module call: ``sampler(target_with_bonus_probs, bonus_token_ids, draft_probs,
draft_token_ids) -> [batch, k + 1]`` on ``RejectionSampler`` and ``TypicalAcceptanceSampler``.

Every expected value is written by hand from the rules of modified rejection sampling and Medusa
typical acceptance (never computed by the samplers); the statistical tests compare histograms of
emitted tokens with hand-written distributions, and check that a 1 % error would be seen.
"""

from __future__ import annotations

import os

import pytest
import torch

from samplers import RejectionSampler, TypicalAcceptanceSampler, get_sampler
from tests.samplers.helpers import P_VALUE_FLOOR, biased, chi_square_p_value, position_counts

V = 5


def _rows(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _point(token: int, vocab: int = V) -> list[float]:
    return [1.0 if i == token else 0.0 for i in range(vocab)]


def _batch(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` repeated as ``n`` identical requests along a new first dim."""
    return x.unsqueeze(0).repeat(n, *([1] * x.dim()))


UNIFORM = [1.0 / V] * V


# --- Rejection sampling: exact cases -------------------------------------------------------------


def test_target_prob_one_is_always_accepted_and_the_bonus_fills_the_last_slot() -> None:
    n = 300
    target = _batch(_rows(_point(2), _point(4), _point(1), UNIFORM), n)  # [n, k + 1 = 4, V]
    draft_probs = _batch(_rows(UNIFORM, UNIFORM, UNIFORM), n)  # p / d = 5 >= 1: accept
    drafts = _batch(torch.tensor([2, 4, 1]), n)
    bonus = (torch.arange(n) % V).reshape(n, 1)  # given ids, not sampled from the last row
    torch.manual_seed(0)
    out = RejectionSampler()(target, bonus, draft_probs, drafts)
    assert out.dtype == torch.int64 and tuple(out.shape) == (n, 4)
    assert out.tolist() == [[2, 4, 1, i % V] for i in range(n)]


def test_target_prob_zero_is_always_rejected_and_the_token_comes_from_the_residual() -> None:
    # p_0 = [0, .6, .4, 0, 0], d_0 = [.4, .6, 0, 0, 0]: the draft 0 has p = 0 (rejected), and
    # max(p_0 - d_0, 0) = [0, 0, .4, 0, 0]: only token 2, although token 1 has p = .6.
    # Positions 1 and 2 would accept (point masses on the drafts) but come after the rejection.
    n = 300
    target = _batch(_rows([0, 0.6, 0.4, 0, 0], _point(3), _point(1), UNIFORM), n)
    draft_probs = _batch(_rows([0.4, 0.6, 0, 0, 0], _point(3), _point(1)), n)
    drafts = _batch(torch.tensor([0, 3, 1]), n)
    torch.manual_seed(1)
    out = RejectionSampler()(target, torch.full((n, 1), 4), draft_probs, drafts)
    assert out.tolist() == [[2, -1, -1, -1]] * n


def test_minus_one_after_the_first_rejection_in_a_mixed_batch() -> None:
    # k = 3. Row 0 accepts all (bonus 0); row 1 rejects at 1 (p_1(draft) = 0, residual point mass
    # on 4); row 2 rejects at 0 (residual point mass on 3), although its later drafts would pass.
    target = torch.stack([
        _rows(_point(1), _point(2), _point(3), UNIFORM),
        _rows(_point(1), _point(4), _point(3), UNIFORM),
        _rows(_point(3), _point(2), _point(3), UNIFORM),
    ])
    draft_probs = torch.stack([
        _rows(UNIFORM, UNIFORM, UNIFORM),
        _rows(UNIFORM, _point(2), UNIFORM),
        _rows(_point(1), UNIFORM, UNIFORM),
    ])
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    bonus = torch.tensor([[0], [0], [0]])
    for seed in range(5):
        torch.manual_seed(seed)
        out = RejectionSampler()(target, bonus, draft_probs, drafts)
        assert out.tolist() == [[1, 2, 3, 0], [1, 4, -1, -1], [3, -1, -1, -1]]


def test_no_drafts_emits_the_bonus_token_and_forward_is_the_same_call() -> None:
    target = _batch(_rows(UNIFORM), 3)  # k = 0
    bonus = torch.tensor([[4], [0], [2]])
    out = RejectionSampler()(target, bonus, torch.zeros(3, 0, V), torch.zeros(3, 0,
                                                                             dtype=torch.long))
    assert out.tolist() == [[4], [0], [2]]
    out = RejectionSampler().forward(target, bonus, None, torch.zeros(3, 0, dtype=torch.long))
    assert out.tolist() == [[4], [0], [2]]


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton kernels need a GPU or TRITON_INTERPRET=1")
def test_the_triton_path_gives_the_same_exact_tokens() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    target = _rows([0, 0.6, 0.4, 0, 0], _point(3), UNIFORM)[None].to(device)
    draft_probs = _rows([0.4, 0.6, 0, 0, 0], _point(3))[None].to(device)
    sampler = RejectionSampler(use_triton=True, chunk_size=4)
    bonus = torch.tensor([[1]], device=device)
    out = sampler(target, bonus, draft_probs, torch.tensor([[0, 3]], device=device))
    assert out.tolist() == [[2, -1, -1]]
    out = sampler(target, bonus, draft_probs, torch.tensor([[1, 3]], device=device))
    assert out.tolist() == [[1, 3, 1]]  # p / d = 1: accepted, then bonus


# --- Rejection sampling: distributions -----------------------------------------------------------

N = 200_000  # a 1 % move between the two most probable tokens gives a chi-square of ~100+
P0 = [0.30, 0.20, 0.15, 0.12, 0.10, 0.08, 0.05, 0.0]  # target, position 0
P1 = [0.05, 0.05, 0.10, 0.10, 0.15, 0.15, 0.25, 0.15]  # target, position 1
D0 = [0.05, 0.10, 0.05, 0.30, 0.20, 0.10, 0.10, 0.10]  # draft, far from P0 (token 7: p = 0)
D1 = [0.25, 0.05, 0.05, 0.05, 0.30, 0.10, 0.10, 0.10]


def _check(counts: torch.Tensor, probs: list[float]) -> None:
    assert chi_square_p_value(counts, probs) > P_VALUE_FLOOR, (counts.tolist(), probs)
    # The same counts must refute a distribution 1 % away: the test can see such an error.
    assert chi_square_p_value(counts, biased(probs)) < P_VALUE_FLOOR


def test_emitted_tokens_follow_the_target_distribution() -> None:
    vocab = len(P0)
    draft = torch.tensor([D0, D1])  # [k = 2, vocab]
    gen = torch.Generator().manual_seed(7)
    drafts = torch.multinomial(draft.repeat(N, 1), 1, generator=gen).reshape(N, 2)
    target = torch.tensor([P0, P1, [1.0 / vocab] * vocab]).expand(N, 3, vocab)
    torch.manual_seed(7)
    out = RejectionSampler()(target, torch.zeros(N, 1, dtype=torch.long),
                             draft.expand(N, 2, vocab), drafts)
    _check(position_counts(out, 0, vocab), P0)  # every request emits a first token
    # Rows that accepted their first draft: the second token follows P1.
    reached = int((out[:, 1] >= 0).sum())
    assert 0.3 * N < reached < 0.9 * N
    _check(position_counts(out, 1, vocab), P1)


def test_the_recovered_token_follows_the_normalised_residual() -> None:
    # p = [0, .6, .4, 0], d = [.5, .5, 0, 0], every draft is 0 (p = 0): always rejected, and the
    # token follows max(p - d, 0) / sum = [0, .1, .4, 0] / .5 = [0, .2, .8, 0].
    vocab = 4
    target = torch.tensor([[0.0, 0.6, 0.4, 0.0], [0.25] * 4]).expand(N, 2, vocab)
    draft_probs = torch.tensor([[0.5, 0.5, 0.0, 0.0]]).expand(N, 1, vocab)
    torch.manual_seed(11)
    out = RejectionSampler()(target, torch.zeros(N, 1, dtype=torch.long), draft_probs,
                             torch.zeros(N, 1, dtype=torch.long))
    assert bool((out[:, 1] == -1).all())
    _check(position_counts(out, 0, vocab), [0.0, 0.2, 0.8, 0.0])


# --- Typical acceptance: exact cases -------------------------------------------------------------


def test_typical_defaults_accept_any_draft_of_a_uniform_distribution() -> None:
    # Docstring example: H = ln 4, bar = min(0.09, 0.3 / 4) = 0.075 < p = 0.25.
    uniform4 = [0.25] * 4
    target = _rows(uniform4, uniform4, uniform4, uniform4)[None]
    for strict in (False, True):
        out = TypicalAcceptanceSampler(strict_mode=strict)(target, torch.tensor([[1]]), None,
                                                            torch.tensor([[3, 0, 2]]))
        assert out.tolist() == [[3, 0, 2, 1]]


def test_typical_rejects_below_the_bar_and_emits_the_target_argmax() -> None:
    # p = [.4, .3, .2, .1]: H = 1.2799, exp(-H) = 0.278.
    # Defaults: bar = min(0.09, 0.3 * 0.278 = 0.083) = 0.083, so even token 3 (p = .1) passes.
    # threshold 0.25, alpha 1.0: bar = min(0.25, 0.278) = 0.25: token 1 (.3) passes, 2 (.2) not,
    # and the rejected slot gets argmax(p) = 0, then -1.
    p = [0.4, 0.3, 0.2, 0.1]
    target = _rows(p, p, p)[None]
    drafts = torch.tensor([[3, 3]])
    out = TypicalAcceptanceSampler()(target, torch.tensor([[2]]), None, drafts)
    assert out.tolist() == [[3, 3, 2]]
    sampler = TypicalAcceptanceSampler(strict_mode=True, posterior_threshold=0.25,
                                       posterior_alpha=1.0)
    out = sampler(target, torch.tensor([[2]]), None, torch.tensor([[1, 2]]))
    assert out.tolist() == [[1, 0, -1]]
    out = sampler(target, torch.tensor([[2]]), None, torch.tensor([[2, 1]]))
    assert out.tolist() == [[0, -1, -1]]
    # draft_probs is unused, as documented: not read, not checked, even in strict mode.
    out = sampler(target, torch.tensor([[2]]), torch.zeros(7), torch.tensor([[1, 1]]))
    assert out.tolist() == [[1, 1, 2]]


# --- Construction ---------------------------------------------------------------------------------


def test_constructors_take_strict_mode_and_the_existing_keywords() -> None:
    sampler = RejectionSampler(strict_mode=True, validate=True, use_triton=False)
    assert (sampler.strict_mode, sampler.validate, sampler.use_triton) == (True, True, False)
    assert RejectionSampler().strict_mode is False
    assert get_sampler("rejection_sampler", strict_mode=True).strict_mode is True
    typical = TypicalAcceptanceSampler(strict_mode=True, posterior_threshold=0.2,
                                       posterior_alpha=0.5, use_triton=False)
    assert (typical.strict_mode, typical.posterior_threshold, typical.posterior_alpha,
            typical.use_triton) == (True, 0.2, 0.5, False)
    assert TypicalAcceptanceSampler().strict_mode is False
    with pytest.raises(TypeError, match="strict_mode"):
        RejectionSampler(strict_mode="yes")
    with pytest.raises(TypeError, match="strict_mode"):
        TypicalAcceptanceSampler(strict_mode=1)
    with pytest.raises(TypeError, match="posterior_threshold"):
        TypicalAcceptanceSampler(True, 0.09, 0.3)  # the documented order, given positionally


# --- strict_mode ----------------------------------------------------------------------------------


def _valid() -> dict:
    """Batch 2, k 2, vocab 5: every draft accepted (p = 1, d uniform)."""
    return {
        "target_with_bonus_probs": torch.stack([_rows(_point(1), _point(2), UNIFORM)] * 2),
        "bonus_token_ids": torch.tensor([[3], [4]]),
        "draft_probs": torch.stack([_rows(UNIFORM, UNIFORM)] * 2),
        "draft_token_ids": torch.tensor([[1, 2], [1, 2]]),
    }


def _call(sampler, args: dict) -> torch.Tensor:
    return sampler(args["target_with_bonus_probs"], args["bonus_token_ids"],
                   args["draft_probs"], args["draft_token_ids"])


BAD_INPUTS = {
    # name: (argument, bad value, error, message fragment)
    "float_draft_ids": ("draft_token_ids", torch.tensor([[1.0, 2.0], [1.0, 2.0]]), TypeError,
                        "draft_token_ids has dtype torch.float32, expected an integer dtype"),
    "bool_bonus_ids": ("bonus_token_ids", torch.tensor([[True], [False]]), TypeError,
                       "bonus_token_ids has dtype torch.bool, expected an integer dtype"),
    "integer_target": ("target_with_bonus_probs", torch.ones(2, 3, V, dtype=torch.long),
                       TypeError, "target_with_bonus_probs has dtype torch.int64, expected a "
                       "floating dtype"),
    "integer_draft_probs": ("draft_probs", torch.ones(2, 2, V, dtype=torch.int32), TypeError,
                            "draft_probs has dtype torch.int32, expected a floating dtype"),
    "list_draft_ids": ("draft_token_ids", [[1, 2], [1, 2]], TypeError,
                       "draft_token_ids must be a torch.Tensor, got list"),
    "2d_target": ("target_with_bonus_probs", torch.full((2, V), 0.2), ValueError,
                  "target_with_bonus_probs has 2 dimensions"),
    "1d_draft_ids": ("draft_token_ids", torch.tensor([1, 2]), ValueError,
                     "draft_token_ids has 1 dimensions"),
    "draft_ids_batch": ("draft_token_ids", torch.tensor([[1, 2]] * 3), ValueError,
                        "draft_token_ids has batch size 3, target_with_bonus_probs has 2"),
    "draft_ids_k": ("draft_token_ids", torch.tensor([[1, 2, 3]] * 2), ValueError,
                    "target_with_bonus_probs has 3 positions, expected k + 1 = 4"),
    "bonus_width": ("bonus_token_ids", torch.tensor([[3, 3], [4, 4]]), ValueError,
                    "bonus_token_ids has shape (2, 2)"),
    "draft_probs_k": ("draft_probs", torch.full((2, 1, V), 0.2), ValueError,
                      "draft_probs has 1 draft positions, draft_token_ids has k = 2"),
    "draft_probs_vocab": ("draft_probs", torch.full((2, 2, V + 1), 1 / (V + 1)), ValueError,
                          "draft_probs has vocab_size 6, target_with_bonus_probs has 5"),
    "device": ("draft_token_ids", torch.zeros(2, 2, dtype=torch.long, device="meta"),
               ValueError, "draft_token_ids is on meta"),
    "draft_id_range": ("draft_token_ids", torch.tensor([[1, 5], [1, 2]]), ValueError,
                       "draft_token_ids has ids outside [0, vocab_size=5)"),
    "bonus_id_range": ("bonus_token_ids", torch.tensor([[3], [-1]]), ValueError,
                       "bonus_token_ids has ids outside [0, vocab_size=5)"),
}


def test_the_valid_inputs_pass_strict_mode() -> None:
    assert _call(RejectionSampler(strict_mode=True), _valid()).tolist() == [[1, 2, 3], [1, 2, 4]]
    args = _valid()
    args["draft_probs"] = args["draft_probs"].double()  # any floating dtype
    args["draft_token_ids"] = args["draft_token_ids"].int()  # any integer dtype
    assert _call(RejectionSampler(strict_mode=True), args).tolist() == [[1, 2, 3], [1, 2, 4]]


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_strict_mode_names_the_bad_argument(case: str) -> None:
    name, value, error, message = BAD_INPUTS[case]
    args = _valid()
    args[name] = value
    with pytest.raises(error) as info:
        _call(RejectionSampler(strict_mode=True), args)
    assert message in str(info.value)
    if name != "draft_probs":  # the typical sampler ignores draft_probs
        with pytest.raises(error) as info:
            _call(TypicalAcceptanceSampler(strict_mode=True), args)
        assert message in str(info.value)


def test_without_strict_mode_only_the_dense_checks_run() -> None:
    args = _valid()
    args["draft_token_ids"] = args["draft_token_ids"].float()  # not checked: read as int64
    assert _call(RejectionSampler(), args).tolist() == [[1, 2, 3], [1, 2, 4]]
    args = _valid()
    args["draft_token_ids"] = torch.tensor([[1, 2, 3]] * 2)
    with pytest.raises(ValueError, match="draft_token_ids has shape"):
        _call(RejectionSampler(), args)
