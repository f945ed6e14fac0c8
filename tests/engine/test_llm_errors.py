"""Bad input fails alone, clearly; invalid parameters raise before any work."""

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer

VOCAB = 32
GOOD = [5, 6, 7, 5, 6]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="module")
def llm(target):
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_model_len=32,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3})


@pytest.mark.parametrize("bad, message", [
    ([], "prompt is empty"),
    ("", "prompt is empty"),
    (list(range(3, 31)) + [3, 4, 5, 6],
     "32 tokens; this engine holds at most 32 tokens per sequence (set by max_model_len=32)"),
    ([5, 99], "outside the vocabulary [0, 32)"),
])
def test_a_bad_prompt_fails_alone(llm, target, bad, message):
    outs = llm.generate([GOOD, bad, GOOD], GREEDY, use_tqdm=False)
    assert outs[1].outputs[0].finish_reason == "error"
    assert outs[1].outputs[0].token_ids == [] and outs[1].finished
    assert message in outs[1].error
    expected = hf_greedy(target, GOOD, 8)
    assert [o.outputs[0].token_ids for o in (outs[0], outs[2])] == [expected, expected]
    assert outs[0].error is None and outs[0].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("params, field", [
    (SamplingParams(stop_token_ids=[40]), "stop_token_ids"),
    (SamplingParams(allowed_token_ids=[3, 32]), "allowed_token_ids"),
    (SamplingParams(logit_bias={100: 1.0}), "logit_bias"),
    (SamplingParams(logprobs=33), "logprobs"),
])
def test_invalid_params_raise_before_any_work(llm, params, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}=.*\[0, 3[23]"):
        llm.generate([GOOD, GOOD], [GREEDY, params], use_tqdm=False)
    assert llm.engine.requests == {} and not llm.engine.has_work()


def test_params_that_ban_every_token_fail_alone(llm, target):
    banned = SamplingParams(allowed_token_ids=[7], bad_words=["w7"], max_tokens=4)
    outs = llm.generate([GOOD, GOOD], [banned, GREEDY], use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error" and "allowed_token_ids" in outs[0].error
    assert outs[1].outputs[0].token_ids == hf_greedy(target, GOOD, 8)


def test_sampling_params_count_must_match(llm):
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        llm.generate([GOOD] * 3, [GREEDY, GREEDY], use_tqdm=False)
    with pytest.raises(TypeError, match="prompt 1 must be a string, a list of token ids"):
        llm.generate([GOOD, 3.5], GREEDY, use_tqdm=False)


def test_abort_mid_flight(llm, target):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    finals = {}
    texts: dict[str, str] = {}
    for delta in llm.generate_stream([GOOD, [9, 10, 11], [20, 21, 20]], params):
        texts[delta.request_id] = texts.get(delta.request_id, "") + delta.text
        if delta.request_id == min(texts) and not delta.finished and len(texts) == 3:
            llm.abort(delta.request_id)
        if delta.finished:
            finals[delta.request_id] = delta
    first, *others = sorted(finals)
    assert finals[first].finish_reason == "abort"
    assert 0 < len(texts[first].split()) < 20
    assert [finals[r].finish_reason for r in others] == ["length", "length"]
    assert llm.engine.requests == {} and not llm.engine.has_work()


def test_engine_level_failure_while_others_run(llm, target):
    """A bad request added mid-flight through the engine API finishes alone at once."""
    engine = llm.engine
    engine.add_request("ok", None, GOOD, GREEDY)
    engine.step()
    engine.add_request("bad", None, [], GREEDY)
    finished = {s.request_id: s for s in engine.step() if s.is_finished}
    assert finished["bad"].finish_reason == "error"
    while engine.has_work():
        engine.step()
    (ok,) = engine.pop_request("ok")
    engine.pop_request("bad")
    assert ok.output_token_ids == hf_greedy(target, GOOD, 8)


def test_draft_vocabulary_mismatch_is_refused(target):
    draft = tiny_model("llama", vocab_size=48, seed=1, num_layers=1)
    spec = {"method": "draft_model", "model": draft, "tokenizer": tiny_tokenizer(48)}
    with pytest.raises(ValueError, match="vocab"):
        LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec)


def test_loaded_model_needs_its_tokenizer(target):
    with pytest.raises(ValueError, match="EngineConfig.tokenizer"):
        LLM(model=target)


def test_non_finite_logits_fail_their_request_alone():
    """A model whose embedding of token 9 is NaN: a prompt holding 9 gets NaN logits (CPU
    path, no CUDA kernel to mark it); that request fails, the others equal HF's greedy output."""
    poisoned = tiny_model("llama", vocab_size=VOCAB, seed=0)
    with torch.no_grad():
        poisoned.get_input_embeddings().weight[9] = float("nan")
    llm = LLM(model=poisoned, tokenizer=tiny_tokenizer(VOCAB), max_model_len=32,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    outs = llm.generate([GOOD, [5, 9, 6], GOOD], GREEDY, use_tqdm=False)
    assert outs[1].outputs[0].finish_reason == "error" and "non-finite" in outs[1].error
    expected = hf_greedy(poisoned, GOOD, 8)
    assert [o.outputs[0].token_ids for o in (outs[0], outs[2])] == [expected, expected]
