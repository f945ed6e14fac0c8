"""Stop checks token by token: order, text cutting, tokens after a stop dropped."""

from engine.sequence import Sequence
from engine.stop_checker import append_until_stop, check_stop, find_stop_string
from samplers.sampling_params import SamplingParams
from tests.engine.llm_helpers import EOS_ID, tiny_tokenizer

TOK = tiny_tokenizer(32)
EOS = frozenset({EOS_ID})


def run(params: SamplingParams, tokens: list[int], max_model_len: int = 100):
    req = Sequence("r", 0, None, [3, 4], params, TOK, EOS, 0.0)
    kept = append_until_stop(req, tokens, EOS, max_model_len)
    return req, kept


def test_find_stop_string_only_in_new_text_and_earliest_wins():
    assert find_stop_string("ab.cd.", 1, ["."], False) == (".", "ab.cd")
    assert find_stop_string("ab.cd", 2, ["."], False) is None  # older match: checked before
    # a stop that straddles old and new text is found
    assert find_stop_string("hello wo", 2, ["o w"], True) == ("o w", "hello w")
    assert find_stop_string("x END y STOP", 10, ["STOP", "END"], False) == ("END", "x ")


def test_eos_in_the_middle_of_a_run_stops_and_drops_the_rest():
    req, kept = run(SamplingParams(max_tokens=10), [5, 6, EOS_ID, 7, 8])
    assert kept == 3
    assert req.output_token_ids == [5, 6, EOS_ID]
    assert (req.finish_reason, req.stop_reason) == ("stop", None)
    assert req.text == " w5 w6"


def test_ignore_eos_continues():
    req, kept = run(SamplingParams(max_tokens=10, ignore_eos=True), [5, EOS_ID, 7])
    assert kept == 3 and not req.is_finished


def test_stop_token_id_is_the_stop_reason_and_text_is_cut():
    req, _ = run(SamplingParams(stop_token_ids=[6]), [5, 6, 7])
    assert req.output_token_ids == [5, 6]
    assert (req.finish_reason, req.stop_reason, req.text) == ("stop", 6, " w5")
    req, _ = run(SamplingParams(stop_token_ids=[6], include_stop_str_in_output=True), [5, 6, 7])
    assert req.text == " w5 w6"


def test_stop_string_cut_unless_included():
    req, kept = run(SamplingParams(stop=["w6 w7"]), [5, 6, 7, 8])
    assert kept == 3 and req.output_token_ids == [5, 6, 7]
    assert (req.finish_reason, req.stop_reason, req.text) == ("stop", "w6 w7", " w5 ")
    req, _ = run(SamplingParams(stop=["w6 w7"], include_stop_str_in_output=True), [5, 6, 7, 8])
    assert req.text == " w5 w6 w7"


def test_max_tokens_and_context_length():
    req, kept = run(SamplingParams(max_tokens=2), [5, 6, 7])
    assert kept == 2 and (req.finish_reason, req.stop_reason) == ("length", None)
    req, kept = run(SamplingParams(max_tokens=None), [5, 6, 7], max_model_len=4)
    assert kept == 2 and req.finish_reason == "length"


def test_min_tokens_defers_every_stop():
    params = SamplingParams(min_tokens=3, stop_token_ids=[6], stop=["w5"], max_tokens=10)
    req, kept = run(params, [5, 6, 7, 6, 8])
    assert kept == 4  # "w5" and 6 came before 3 tokens; the next 6 stops
    assert req.stop_reason == 6
    req, kept = run(params, [5, 6, EOS_ID, 6, 8])
    assert kept == 3 and req.stop_reason is None  # the 3rd token may stop


def test_eos_checked_before_stop_token_ids():
    req, _ = run(SamplingParams(stop_token_ids=[EOS_ID]), [EOS_ID])
    assert req.stop_reason is None
    req, _ = run(SamplingParams(stop_token_ids=[EOS_ID], ignore_eos=True), [EOS_ID])
    assert req.stop_reason == EOS_ID


def test_check_stop_without_a_stop():
    assert check_stop(SamplingParams(), 5, " w5", " w5", 1, 3, EOS, 100) is None
