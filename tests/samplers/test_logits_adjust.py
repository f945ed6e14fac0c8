"""Per-position logits adjustments, checked on hand-built rows.

Every expected value below is written out by hand from the rules in the module docstring.
"""

import math

import pytest
import torch

from samplers.logits_adjust import LogitsAdjuster
from samplers.sampling_params import SamplingParams
from tests.engine.llm_helpers import EOS_ID, tiny_tokenizer

TOK = tiny_tokenizer(8)
EOS = frozenset({EOS_ID})
NEG = -math.inf
PROMPT = [2, 3]


def adjuster(**kwargs) -> LogitsAdjuster:
    return LogitsAdjuster(SamplingParams(**kwargs), PROMPT, EOS, TOK)


def rows(n: int) -> torch.Tensor:
    # [n, 8]: 1, 2, ..., 8 in every row (all positive), then the last two negative
    base = torch.tensor([1.0, 2, 3, 4, 5, 6, -1, -2])
    return base.repeat(n, 1)


def test_inactive_is_untouched():
    adj = adjuster(temperature=0.5, top_k=3)
    assert not adj.active
    x = rows(2)
    assert adj.apply(x, [4], [5]) is x and torch.equal(x, rows(2))


def test_allowed_token_ids():
    out = adjuster(allowed_token_ids=[0, 5]).apply(rows(1), [])
    assert out[0].tolist() == [1, NEG, NEG, NEG, NEG, 6, NEG, NEG]


def test_bad_words_use_each_rows_history():
    # "w4 w6": token 6 is banned exactly where the history ends with 4; "w7" is always banned
    adj = adjuster(bad_words=["w4 w6", "w7"])
    out = adj.apply(rows(3), [5], [4, 3])  # histories: ..5 | ..5 4 | ..5 4 3
    assert out[:, 7].tolist() == [NEG, NEG, NEG]
    assert out[:, 6].tolist() == [-1, NEG, -1]


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    adj = adjuster(min_tokens=3, stop_token_ids=[4])
    # output has 1 token: rows follow 1, 2, 3 output tokens -> the first two are masked
    out = adj.apply(rows(3), [6], [5, 5])
    assert out[:, EOS_ID].tolist() == [NEG, NEG, 2]
    assert out[:, 4].tolist() == [NEG, NEG, 5]
    ignore = adjuster(min_tokens=3, ignore_eos=True).apply(rows(1), [])
    assert ignore[0, EOS_ID] == 2  # EOS is not a stop then: left alone


def test_logit_bias():
    out = adjuster(logit_bias={0: 2.5, 7: -1.0}).apply(rows(1), [])
    assert out[0].tolist() == [3.5, 2, 3, 4, 5, 6, -1, -3]


def test_penalties_follow_drafts_row_by_row():
    adj = adjuster(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    # output [4, 4]; drafts [6, 4]; prompt [2, 3] only feeds the repetition penalty
    out = adj.apply(rows(3), [4, 4], [6, 4])
    # row 0: counts {4: 2}; repeated set {2, 3, 4}
    # token 4: 5 / 2 - 0.5 * 2 - 0.25
    assert out[0].tolist() == [1, 2, 1.5, 2.0, 1.25, 6, -1, -2]
    # row 1: counts {4: 2, 6: 1}; token 6: -1 * 2 - 0.5 - 0.25
    assert out[1].tolist() == [1, 2, 1.5, 2.0, 1.25, 6, -2.75, -2]
    # row 2: counts {4: 3, 6: 1}; token 4: 2.5 - 1.5 - 0.25
    assert out[2].tolist() == [1, 2, 1.5, 2.0, 0.75, 6, -2.75, -2]


def test_order_allowed_then_bias_then_penalty():
    adj = adjuster(allowed_token_ids=[4, 5], logit_bias={4: 1.0}, repetition_penalty=2.0)
    out = adj.apply(rows(1), [4])
    assert out[0].tolist() == [NEG, NEG, NEG, NEG, 3.0, 6, NEG, NEG]


def test_draft_hook_equals_the_target_row():
    adj = adjuster(bad_words=["w4 w6"], min_tokens=2, presence_penalty=1.0, logit_bias={3: 1.0})
    target = adj.apply(rows(3), [5], [4, 2])
    for j in range(3):
        prefix = PROMPT + [5] + [4, 2][:j]
        draft = adj.adjust_prefix(prefix, torch.tensor([1.0, 2, 3, 4, 5, 6, -1, -2]))
        assert torch.equal(draft, target[j])


def test_smaller_draft_vocabulary_is_adjusted_on_its_own_ids():
    adj = adjuster(allowed_token_ids=[1, 7], logit_bias={7: 3.0})
    draft = adj.adjust_prefix(PROMPT, torch.zeros(6))
    assert draft.tolist() == [NEG, 0, NEG, NEG, NEG, NEG]


def test_wrong_row_count_raises():
    with pytest.raises(ValueError, match="rows"):
        adjuster(logit_bias={0: 1.0}).apply(rows(2), [], [])


def test_check_sampleable():
    assert adjuster(allowed_token_ids=[1, 4]).check_sampleable(8) is None
    assert adjuster(allowed_token_ids=[1, 4], bad_words=["w4"], min_tokens=1).check_sampleable(8)
    assert adjuster(allowed_token_ids=[4], bad_words=["w4"]).check_sampleable(8)
    assert adjuster(allowed_token_ids=[1, 4], bad_words=["w4"]).check_sampleable(8) is None
