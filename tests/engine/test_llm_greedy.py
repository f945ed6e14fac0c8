"""Greedy decoding with speculation is token for token the target's own HF greedy output.

Tiny random models with a small vocabulary fall into repeating loops within a few tokens, so
n-gram lookups and a weak draft model get many drafts accepted (checked: the acceptance counts
below are non-zero), and rejections happen too.
"""

import copy

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import hf_greedy, staggered_samples, tiny_tokenizer

VOCAB = 32
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


def noisy_copy(model, scale: float, seed: int):
    """The model with every weight perturbed by ``scale`` times its own spread."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * (p.std() if p.numel() > 1 else 1))
    return draft


@pytest.fixture(scope="module")
def draft(target):
    # the target with noisy weights: its guesses are often right, not always
    return noisy_copy(target, 0.3, seed=1)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (int(torch.randint(2, 12, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n)]


_REFERENCES: dict[tuple, list[int]] = {}


def reference(model, prompt: list[int]) -> list[int]:
    key = (id(model), tuple(prompt))
    if key not in _REFERENCES:
        _REFERENCES[key] = hf_greedy(model, prompt, MAX_TOKENS)
    return _REFERENCES[key]


def run_staggered(llm: LLM, batch: list[list[int]], params: SamplingParams,
                  arrivals: list[int]) -> list[list[int]]:
    """Add prompt ``i`` before engine step ``arrivals[i]``; step until all finish."""
    return [s[0] for s in staggered_samples(llm, batch, [params] * len(batch), arrivals)]


def spec(method: str, k: int, draft_model=None) -> dict:
    config = {"method": method, "num_speculative_tokens": k, "adaptive_k": False}
    if method == "draft_model":
        config.update(model=draft_model, tokenizer=tiny_tokenizer(VOCAB),
                      draft_sample_method="greedy")
    if method == "early_exit":
        config["num_early_exit_layers"] = 1
    return config


@pytest.mark.parametrize("method", ["ngram", "draft_model", "early_exit"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_equals_hf_with_staggered_arrivals(target, draft, method, k):
    batch_size = 16 if (method, k) == ("ngram", 3) else 8
    batch = prompts(batch_size)  # the first 8 are shared by every case (one HF reference each)
    arrivals = ([0] * 3 + [1, 2, 5, 8, 13] + [0, 1, 1, 3, 4, 6, 9, 20])[:batch_size]
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec(
        method, k, draft), max_num_seqs=16)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run_staggered(llm, batch, params, arrivals)
    for prompt, out in zip(batch, outputs, strict=True):
        assert out == reference(target, prompt)
    metrics = llm.get_metrics()
    assert metrics.num_accepted > 0
    assert metrics.num_accepted < metrics.num_drafted  # rejections were exercised too


@pytest.mark.parametrize("batch_size", [1, 2, 7])
def test_greedy_batches_and_small_max_num_seqs(target, batch_size):
    """More prompts than max_num_seqs: the rest wait and join as others finish."""
    batch = prompts(batch_size)
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=3,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(batch, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [reference(target, p) for p in batch]


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_greedy_other_families(family):
    model = tiny_model(family, vocab_size=VOCAB, seed=3)
    batch = prompts(3)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(VOCAB),
              speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(batch, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [reference(model, p) for p in batch]


def test_no_speculation_and_k0_are_plain_decoding(target):
    batch = prompts(3)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [reference(target, p) for p in batch]
    for config in (None, {"method": "ngram", "num_speculative_tokens": 0}):
        llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=config)
        outs = llm.generate(batch, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        assert llm.get_metrics().num_drafted == 0


def test_long_prompts_are_chunked_while_others_decode(target):
    """A token budget smaller than the prompts forces chunked prefill next to decoding."""
    batch = prompts(3) + [list(range(3, VOCAB)) * 3]
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_batched_tokens=16,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(batch, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [reference(target, p) for p in batch]
