"""SamplingParams: vLLM's defaults, and every bad value names its field and range."""

import math

import pytest

from engine import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.max_tokens == 16 and p.min_tokens == 0 and p.seed is None
    assert p.stop == [] and p.stop_token_ids == [] and not p.ignore_eos
    assert p.skip_special_tokens and not p.include_stop_str_in_output
    assert p.logprobs is None and p.logit_bias is None and p.allowed_token_ids is None
    assert p.bad_words is None


def test_temperature_zero_is_greedy_and_disables_filters():
    p = SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.2)
    assert p.greedy
    assert (p.top_k, p.top_p, p.min_p) == (0, 1.0, 0.0)
    assert SamplingParams(temperature=1e-7).greedy
    assert not SamplingParams(temperature=0.7).greedy


def test_stop_is_normalized_to_a_list():
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert SamplingParams(stop=("a", "bc")).stop == ["a", "bc"]


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("n", 0, ">= 1"),
        ("n", 1.5, ">= 1"),
        ("temperature", -0.1, "[0, inf)"),
        ("temperature", math.nan, "[0, inf)"),
        ("temperature", math.inf, ">= 0"),
        ("top_p", 0.0, "(0.0, 1.0]"),
        ("top_p", 1.01, "(0.0, 1.0]"),
        ("top_k", -2, "-1 or 0 (off)"),
        ("top_k", 2.0, "-1 or 0 (off)"),
        ("min_p", 1.5, "[0.0, 1.0]"),
        ("min_p", -0.01, "[0.0, 1.0]"),
        ("presence_penalty", 2.5, "[-2.0, 2.0]"),
        ("frequency_penalty", -2.5, "[-2.0, 2.0]"),
        ("repetition_penalty", 0.0, "(0, inf)"),
        ("seed", -1, ">= 0"),
        ("max_tokens", 0, ">= 1"),
        ("min_tokens", -1, ">= 0"),
        ("logprobs", -1, ">= 0"),
        ("stop", [""], "non-empty strings"),
        ("stop_token_ids", [-3], "non-negative"),
        ("allowed_token_ids", [], "non-empty"),
        ("bad_words", [""], "non-empty strings"),
        ("logit_bias", {5: 200.0}, "[-100, 100]"),
    ],
)
def test_invalid_values_name_field_value_and_range(field, value, allowed):
    with pytest.raises(ValueError) as err:
        SamplingParams(**{field: value})
    msg = str(err.value)
    assert f"SamplingParams.{field}=" in msg
    assert allowed in msg


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match=r"min_tokens=8 .*\[0, max_tokens=4\]"):
        SamplingParams(min_tokens=8, max_tokens=4)


def test_unknown_field_is_rejected():
    with pytest.raises(TypeError):
        SamplingParams(temprature=0.5)


def test_logit_bias_accepts_string_keys_from_json():
    assert SamplingParams(logit_bias={"7": -5}).logit_bias == {7: -5.0}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"stop_token_ids": [100]}, "stop_token_ids"),
        ({"allowed_token_ids": [1, 100]}, "allowed_token_ids"),
        ({"logit_bias": {100: 1.0}}, "logit_bias"),
        ({"logprobs": 101}, "logprobs"),
    ],
)
def test_verify_vocab_rejects_ids_outside_the_vocabulary(kwargs, field):
    params = SamplingParams(**kwargs)
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}=.*\[0, 100"):
        params.verify_vocab(100)
    SamplingParams(**kwargs).verify_vocab(1000)


@pytest.mark.parametrize("kwargs, field", [
    ({"ignore_eos": "no"}, "ignore_eos"),  # was accepted (a truthy string: EOS ignored)
    ({"skip_special_tokens": "false"}, "skip_special_tokens"),
    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
    ({"bad_words": "t7 t8"}, "bad_words"),  # was split into characters
    ({"stop": 5}, "stop"),  # was "TypeError: 'int' object is not iterable"
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"allowed_token_ids": "5"}, "allowed_token_ids"),
    ({"logit_bias": [(5, 1.0)]}, "logit_bias"),
])
def test_wrong_types_are_type_errors_naming_the_field(kwargs, field):
    with pytest.raises(TypeError, match=rf"SamplingParams\.{field}=.* has type"):
        SamplingParams(**kwargs)


def test_right_types_still_pass():
    p = SamplingParams(ignore_eos=True, stop="x", stop_token_ids=(3, 4), bad_words=["a b"],
                       allowed_token_ids=(1, 2), logit_bias={1: 0.5})
    assert (p.stop, p.stop_token_ids, p.allowed_token_ids) == (["x"], [3, 4], [1, 2])
