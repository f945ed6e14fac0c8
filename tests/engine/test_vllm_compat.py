"""A vLLM script ports by changing the import: vLLM's keywords, SamplingParams fields, chat
options and outputs, each with vLLM's meaning here or a clear error naming it."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from engine.builder import kv_bytes_per_token
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer

VOCAB = 32
PROMPT = [5, 6, 7, 5, 6]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<bot>{% endif %}")


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


def make_llm(target, **kwargs) -> LLM:
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
               speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **kwargs)


def test_vllm_engine_keywords(target):
    llm = make_llm(target, gpu_memory_utilization=0.5, trust_remote_code=False,
                   tensor_parallel_size=1, disable_log_stats=True, enable_chunked_prefill=True)
    assert llm.llm_engine is llm.engine
    assert llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == \
        hf_greedy(target, PROMPT, 6)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=0 is invalid"):
        make_llm(target, tensor_parallel_size=0)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=1.5"):
        make_llm(target, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match=r"EngineConfig.enable_prefix_caching='yes' is invalid"):
        make_llm(target, enable_prefix_caching="yes")
    with pytest.raises(ValueError, match=r"LLM\(swap_space=...\) is a vLLM keyword "
                                         "with no meaning here: preemption recomputes"):
        make_llm(target, swap_space=4)
    with pytest.raises(ValueError, match=r"logprobs_mode='raw'"):
        make_llm(target, logprobs_mode="raw")


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer(target):
    # 2 layers x 2 key/value heads x head_dim 16 x (keys + values) x 4 bytes (float32)
    assert kv_bytes_per_token(target) == 2 * 2 * 2 * 16 * 4


def test_vllm_sampling_params_fields(target):
    llm = make_llm(target)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, best_of=1,
                            spaces_between_special_tokens=False)
    clone = params.clone()
    assert clone == params and clone is not params
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == hf_greedy(target, PROMPT, 6)
    quiet = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                  detokenize=False), use_tqdm=False)[0]
    assert quiet.outputs[0].text == "" and quiet.outputs[0].token_ids == out.token_ids
    cut = llm.generate([[9, 9, 9] + PROMPT], SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, truncate_prompt_tokens=5),
        use_tqdm=False)[0]
    assert cut.prompt_token_ids == PROMPT and cut.outputs[0].token_ids == out.token_ids
    with pytest.raises(ValueError, match=r"best_of=3 is invalid: allowed None or n=1"):
        SamplingParams(best_of=3)
    with pytest.raises(ValueError, match=r"detokenize=False is invalid"):
        SamplingParams(detokenize=False, stop=["x"])
    with pytest.raises(ValueError, match=r"prompt_logprobs=-1"):
        SamplingParams(prompt_logprobs=-1)


def test_chat_keeps_the_formatted_prompt_and_takes_vllms_options(target):
    llm = make_llm(target)
    conversation = [{"role": "user", "content": "w5 w6"}]
    with pytest.raises(ValueError, match="no chat template; pass chat_template="):
        llm.chat(conversation, GREEDY, use_tqdm=False)
    out = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=TEMPLATE)[0]
    assert out.prompt == "<user>w5 w6<bot>"
    assert out.prompt_token_ids == tiny_tokenizer(VOCAB)("<user>w5 w6<bot>",
                                                         add_special_tokens=False)["input_ids"]
    open_turn = conversation + [{"role": "assistant", "content": "w7"}]
    cont = llm.chat(open_turn, GREEDY, use_tqdm=False, chat_template=TEMPLATE,
                    continue_final_message=True)[0]
    assert cont.prompt == "<user>w5 w6<assistant>w7"


def test_a_request_that_fails_alone_is_logged(target, caplog):
    llm = make_llm(target, max_model_len=16)
    with caplog.at_level(logging.ERROR, logger="specdec"):
        outs = llm.generate([PROMPT, list(range(3, 20))], GREEDY, use_tqdm=False)
    assert outs[1].error is not None and outs[0].error is None
    assert [r.getMessage() for r in caplog.records] == [f"request {outs[1].request_id} failed: "
                                                        f"{outs[1].error}"]


def test_prompt_logprobs_come_back_with_generate(target):
    out = make_llm(target).generate([PROMPT], SamplingParams(
        temperature=0, max_tokens=2, prompt_logprobs=0), use_tqdm=False)[0]
    with torch.inference_mode():
        full = torch.log_softmax(target(torch.tensor([PROMPT])).logits[0].double(), dim=-1)
    assert out.prompt_logprobs[0] is None
    assert [set(e) for e in out.prompt_logprobs[1:]] == [{t} for t in PROMPT[1:]]
    assert [e[t].logprob for e, t in zip(out.prompt_logprobs[1:], PROMPT[1:], strict=True)] == \
        pytest.approx([float(full[i, t]) for i, t in enumerate(PROMPT[1:])], abs=1e-4)


def test_tokenizer_by_path_as_in_vllm(target, tmp_path):
    tiny_tokenizer(VOCAB).save_pretrained(tmp_path)
    llm = LLM(model=target, tokenizer=str(tmp_path))
    out = llm.generate(["w5 w6 w7 w5 w6"], GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids == PROMPT and out.outputs[0].token_ids == hf_greedy(target,
                                                                                    PROMPT, 6)
    with pytest.raises(ValueError, match="no such local directory"):
        LLM(model=target, tokenizer=str(tmp_path / "missing"))
