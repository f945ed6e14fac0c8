"""The shared example code: hand-computed cases for the formulas, argument checks of the scripts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import compare_samplers  # noqa: E402
import compare_speedups  # noqa: E402
import sampler_lib  # noqa: E402
from prompt_sets import prompt_batch, prompt_set  # noqa: E402
from speedup_lib import Measurement, find, format_table, measured_speedup  # noqa: E402


class _CharTokenizer:
    """Token id per character; no chat template."""

    chat_template = None

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}


def test_prompt_batch_repeats_the_set_in_turn():
    tok = _CharTokenizer()
    two = prompt_set(tok, "copy", 2)
    assert len(two) == 2 and two[0] != two[1]
    assert prompt_batch(tok, "copy", 5, 2) == [two[0], two[1], two[0], two[1], two[0]]


@pytest.mark.parametrize("kwargs, field", [({"kind": "poem", "batch_size": 1}, "kind"),
                                           ({"kind": "copy", "batch_size": 0}, "batch_size"),
                                           ({"kind": "open", "batch_size": 2, "num_prompts": 0},
                                            "num_prompts")])
def test_prompt_batch_rejects_bad_input(kwargs, field):
    with pytest.raises(ValueError, match=field):
        prompt_batch(_CharTokenizer(), **kwargs)


def test_predicted_and_measured_speedup_by_hand():
    # alpha 0.8, k 4, c 0.05: (1 - 0.8^5) / (0.2 * 1.2) = 0.67232 / 0.24 = 2.80133...
    spec = Measurement("ngram", 4, "copy", 1, num_tokens=90, seconds=3.0, token_acceptance=0.8,
                       draft_cost_ratio=0.05)
    base = Measurement("none", 0, "copy", 1, num_tokens=60, seconds=4.0)
    other = Measurement("none", 0, "open", 1, num_tokens=10, seconds=1.0)
    assert spec.predicted_speedup == pytest.approx(2.80133, abs=1e-5)
    assert base.predicted_speedup is None
    assert measured_speedup(spec, [other, base, spec]) == pytest.approx(30.0 / 15.0)
    table = format_table([base, spec])
    assert "2.80" in table and "2.00" in table


def test_a_default_policy_run_is_its_own_row_without_a_prediction():
    base = Measurement("none", 0, "copy", 1, num_tokens=60, seconds=4.0)
    fixed = Measurement("eagle", 4, "copy", 1, num_tokens=60, seconds=3.0, token_acceptance=0.5)
    policy = Measurement("eagle", 4, "copy", 1, num_tokens=60, seconds=2.0, token_acceptance=0.5,
                         policy=True)  # (its k is a cap: Leviathan's formula needs a fixed k)
    results = [base, fixed, policy]
    assert policy.predicted_speedup is None and fixed.predicted_speedup is not None
    assert find(results, "eagle", "copy", 1) == [fixed]
    assert find(results, "eagle", "copy", 1, policy=True) == [policy]
    rows = format_table(results).splitlines()[2:]
    assert [row.split()[2:4] for row in rows] == [["none", "0"], ["eagle", "4"], ["eagle", "<=4"]]
    assert rows[2].split()[7] == "2.00"  # 30 tokens/s over the baseline's 15


def test_typical_emitted_by_hand():
    # H(p) for p = [0.5, 0.3, 0.2] is 1.0297 nats; alpha 0.5 gives 0.5 e^-1.0297 = 0.1785, and
    # threshold 0.25 is larger, so the bar is 0.1785: tokens 0, 1 and 2 all pass.
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.1, 0.3, 0.6])
    assert torch.allclose(sampler_lib.typical_emitted(p, q, 0.25, 0.5), q.double())
    # Threshold 0.25 as the bar: token 2 (p 0.2) fails; its draft mass 0.6 goes to the argmax.
    emitted = sampler_lib.typical_emitted(p, q, 0.25, 1.0)
    assert torch.allclose(emitted, torch.tensor([0.7, 0.3, 0.0], dtype=torch.float64))
    assert sampler_lib.total_variation(emitted, p) == pytest.approx(0.2)


def test_verify_trials_greedy_emits_the_argmax():
    logits = torch.tensor([0.0, 2.0, 1.0, -1.0])  # [vocab_size]
    q = torch.tensor([0.4, 0.1, 0.4, 0.1])
    emitted, accepted = sampler_lib.verify_trials(sampler_lib.make_sampler("greedy"), logits, 1.0,
                                                  500, draft_probs=q)
    assert emitted.tolist() == [1] * 500
    assert 0 < accepted.sum() < 500  # token 1 is drafted with probability 0.1


def test_verify_trials_needs_one_kind_of_draft():
    with pytest.raises(ValueError, match="draft_probs"):
        sampler_lib.verify_trials(sampler_lib.make_sampler("rejection"), torch.zeros(4), 1.0, 10)


@pytest.mark.parametrize("script, argv, flag", [
    (compare_speedups, ["--ks", "0"], "--ks"),
    (compare_speedups, ["--batch-sizes", "0"], "--batch-sizes"),
    (compare_speedups, ["--max-tokens", "0"], "--max-tokens"),
    (compare_samplers, ["--alphas", "1.5"], "--alphas"),
    (compare_samplers, ["--trials", "5"], "--trials"),
])
def test_scripts_reject_bad_arguments(script, argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        script.parse_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("script", ["compare_speedups.py", "compare_samplers.py"])
def test_scripts_help(script):
    out = subprocess.run([sys.executable, str(EXAMPLES / script), "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--json" in out and "--quick" in out
