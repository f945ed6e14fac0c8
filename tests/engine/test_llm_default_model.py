"""The engine on the embedded default model (SmolLM2-135M-Instruct): greedy speculation is HF
greedy, the chat template applies, and text streams out whole, multi-byte characters included."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.detokenizer import IncrementalDetokenizer

pytestmark = pytest.mark.slow

PROMPTS = [
    "Copy this list exactly: apples, pears, plums, apples, pears, plums, apples,",
    "The capital of France is",
]
NUM_TOKENS = 12
SMALL = dict(max_model_len=256, kv_cache_tokens=1024)  # a small KV pool: quick to allocate


@pytest.fixture(scope="module")
def hf_reference(default_model):
    model, tokenizer = default_model
    refs = []
    with torch.inference_mode():
        for text in PROMPTS:
            ids = tokenizer(text, return_tensors="pt")
            out = model.generate(**ids, do_sample=False, max_new_tokens=NUM_TOKENS,
                                 eos_token_id=None, pad_token_id=0)
            refs.append(out[0, ids["input_ids"].shape[1]:].tolist())
    return refs


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 4},
    {"method": "early_exit", "num_speculative_tokens": 3, "draft_sample_method": "greedy"},
    {"method": "eagle", "num_speculative_tokens": 3, "adaptive_k": False},  # the shipped head
], ids=["ngram", "early_exit", "eagle"])
def test_greedy_speculation_is_hf_greedy(default_model, hf_reference, spec):
    model, tokenizer = default_model
    llm = LLM(model=model, tokenizer=tokenizer, speculative_config=spec, **SMALL)
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_reference
    for out in outs:
        assert out.outputs[0].text == tokenizer.decode(out.outputs[0].token_ids,
                                                       skip_special_tokens=True)
    assert llm.get_metrics().num_drafted > 0


def test_chat_uses_the_template(default_model):
    model, tokenizer = default_model
    llm = LLM(model=model, tokenizer=tokenizer, **SMALL)
    messages = [{"role": "user", "content": "Say hi."}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt_token_ids == tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert len(out.outputs[0].token_ids) >= 1


def multibyte_case(tokenizer) -> tuple[list[int], list[int]]:
    """(prompt ids, output ids) of a text with multi-byte characters split across tokens."""
    text = "Crème brûlée 🍮 costs 5 € — naïve café, 東京 and spaces  here."
    return (tokenizer("Say:", add_special_tokens=False)["input_ids"],
            tokenizer(text, add_special_tokens=False)["input_ids"])


def test_incremental_text_equals_full_decode(default_model):
    _, tokenizer = default_model
    prompt, ids = multibyte_case(tokenizer)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detok.add_token(t) for t in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_text_added_in_runs_equals_token_by_token(default_model):
    """The engine detokenizes a run of tokens at once when nothing reads the text in between;
    cutting the runs anywhere, also inside a multi-byte character, gives the same text."""
    _, tokenizer = default_model
    prompt, ids = multibyte_case(tokenizer)
    one_by_one = IncrementalDetokenizer(tokenizer, prompt)
    expected = [one_by_one.add_token(t) for t in ids]
    for run in (2, 3, 5, len(ids)):
        detok = IncrementalDetokenizer(tokenizer, prompt)
        pieces = [detok.add_tokens(ids[i:i + run]) for i in range(0, len(ids), run)]
        assert "".join(pieces) == "".join(expected) == tokenizer.decode(ids)
        assert all("\ufffd" not in p for p in pieces)
