"""The request lifecycle under misuse (issue 16): each case failed before its fix. Every API call
leaves the engine clean however it ends, streams report each final delta once and carry errors,
several streams can be open at once, and bad input names its field."""

from __future__ import annotations

import pytest
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer

VOCAB = 32
PROMPTS = [[5, 6, 7, 5, 6], [9, 10, 11, 12], [20, 21, 20, 21, 22], [3, 4, 3]]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


def make_llm(target, **kwargs) -> LLM:
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec, **kwargs)


def assert_clean(llm: LLM) -> None:
    engine = llm.engine
    assert engine.requests == {} and not engine.has_work() and llm._inboxes == {}
    assert engine.runner.num_cached_tokens == 0


def test_a_final_delta_is_reported_once_after_an_abort(target):
    """n=3 with room for 2 samples at a time, aborted on its first delta."""
    llm = make_llm(target, max_num_seqs=2)
    params = SamplingParams(n=3, temperature=0.8, seed=1, max_tokens=12, ignore_eos=True)
    finals: list[tuple[str, int]] = []
    for delta in llm.generate_stream([PROMPTS[0]], params):
        if not finals and delta.token_ids:
            llm.abort(delta.request_id)
        if delta.finished:
            finals.append((delta.request_id, delta.index))
    assert sorted(finals) == [("0", 0), ("0", 1), ("0", 2)]
    assert_clean(llm)


def test_interleaved_streams_each_see_their_own_deltas(target):
    llm = make_llm(target)
    a = llm.generate_stream(PROMPTS[:2], GREEDY)
    b = llm.generate_stream(PROMPTS[2:], GREEDY)
    tokens: dict[tuple[str, int], list[int]] = {}
    finished: list[str] = []
    streams = [a, b]
    while streams:
        for stream in list(streams):
            delta = next(stream, None)
            if delta is None:
                streams.remove(stream)
                continue
            tokens.setdefault((delta.request_id, delta.index), []).extend(delta.token_ids)
            if delta.finished:
                finished.append(delta.request_id)
    assert sorted(finished) == ["0", "1", "2", "3"]
    assert [tokens[(str(i), 0)] for i in range(4)] == [hf_greedy(target, p, 10) for p in PROMPTS]
    assert_clean(llm)


def test_generate_while_a_stream_is_open(target):
    llm = make_llm(target)
    stream = llm.generate_stream([PROMPTS[0]], GREEDY)
    first = next(stream)
    out = llm.generate([PROMPTS[1]], GREEDY, use_tqdm=False)  # steps the stream's request too
    assert out[0].outputs[0].token_ids == hf_greedy(target, PROMPTS[1], 10)
    rest = [first, *stream]
    assert sum((d.token_ids for d in rest), []) == hf_greedy(target, PROMPTS[0], 10)
    assert [d.finished for d in rest].count(True) == 1
    assert_clean(llm)


def test_a_failed_stream_says_why(target):
    llm = make_llm(target, max_model_len=16)
    deltas = list(llm.generate_stream([PROMPTS[0], list(range(3, 20))], GREEDY))
    failed = [d for d in deltas if d.finish_reason == "error"]
    assert len(failed) == 1 and "holds at most 16 tokens" in failed[0].error
    assert all(d.error is None for d in deltas if d.finish_reason != "error")


def test_abort_takes_int_ids_and_refuses_other_types(target):
    llm = make_llm(target)
    finals = {}
    for delta in llm.generate_stream(PROMPTS[:2], GREEDY):
        if delta.request_id == "0" and not delta.finished:
            llm.abort(0)  # the int form of the id '0'
        if delta.finished:
            finals[delta.request_id] = delta.finish_reason
    assert finals == {"0": "abort", "1": "length"}
    with pytest.raises(TypeError, match="request_id must be a string"):
        llm.abort(["0"])
    llm.abort("no-such-request")  # an id that is not (or no longer) held: ignored, as in vLLM


@pytest.mark.parametrize("messages, error, match", [
    ("hello", TypeError, "messages must be a conversation"),
    ([{"role": "user"}], ValueError, "message 0 has no 'content'"),
    ([{"content": "hi"}], ValueError, "message 0 has no 'role'"),
    ([{"role": "user", "content": 5}], TypeError, "content must be a string, got int"),
    ([[{"role": "user", "content": "hi"}], ["hi"]], TypeError, "conversation 1, message 0"),
    ([], TypeError, "messages must be a conversation"),
])
def test_malformed_chat_input_names_the_message(target, messages, error, match):
    llm = make_llm(target)
    llm.engine.tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(error, match=match):
        llm.chat(messages, GREEDY, use_tqdm=False)
    assert_clean(llm)


@pytest.mark.parametrize("prompts, sampling_params, error, match", [
    ([["w5", 6, 7]], GREEDY, TypeError, "prompt 0: .* element 0 is str 'w5'"),
    ([PROMPTS[0]], {"temperature": 0}, TypeError, "sampling_params must be a SamplingParams"),
    ([PROMPTS[0]], [{"temperature": 0}], TypeError, "got dict"),
])
def test_bad_prompts_and_params_name_what_is_wrong(target, prompts, sampling_params, error,
                                                   match):
    llm = make_llm(target)
    with pytest.raises(error, match=match):
        llm.generate(prompts, sampling_params, use_tqdm=False)
    assert_clean(llm)


def test_a_bad_word_that_tokenizes_to_nothing_is_refused(target):
    llm = make_llm(target)
    with pytest.raises(ValueError, match="bad_words entry ' ' tokenizes to no tokens"):
        llm.generate([PROMPTS[0]], SamplingParams(bad_words=[" "]), use_tqdm=False)
    assert_clean(llm)


def test_a_prompt_past_the_kv_cache_blames_kv_cache_tokens(target):
    llm = make_llm(target, kv_cache_tokens=12)
    out = llm.generate([list(range(3, 16))], GREEDY, use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "error"
    assert "set by kv_cache_tokens=12" in out[0].error


def test_a_stream_dropped_before_it_started_leaves_nothing(target):
    import gc

    llm = make_llm(target)
    stream = llm.generate_stream(PROMPTS[:2], GREEDY)
    out = llm.generate([PROMPTS[2]], GREEDY, use_tqdm=False)  # steps the unread stream too
    assert out[0].outputs[0].token_ids == hf_greedy(target, PROMPTS[2], 10)
    del stream
    gc.collect()
    assert_clean(llm)


def test_a_step_that_raises_loses_no_other_calls_report(target, monkeypatch):
    """Found in review: a failing step dropped what had finished outside it (an abort, a request
    that failed at add), and an open stream then ended in 'cannot finish'."""
    llm = make_llm(target, max_model_len=16)
    stream = llm.generate_stream([list(range(3, 20))], GREEDY)  # fails alone at add
    forward = llm.engine.runner.forward

    def failing(*args, **kwargs):
        raise MemoryError("out of memory")

    monkeypatch.setattr(llm.engine.runner, "forward", failing)
    with pytest.raises(MemoryError):
        llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False)
    monkeypatch.setattr(llm.engine.runner, "forward", forward)
    (delta,) = list(stream)
    assert delta.finish_reason == "error" and "holds at most 16 tokens" in delta.error
    assert_clean(llm)
