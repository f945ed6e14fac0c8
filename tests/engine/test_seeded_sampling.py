"""Seeded sampling is reproducible whatever the batch, the drafts or preemption.

A seeded request's token at output position ``t`` is the keyed Gumbel-max sample of the target's
processed distribution there (``samplers.keyed_random``), and its drafts are accepted iff they
equal that token. So its output must equal its run alone *without speculation*: with any k
(fixed, or the controller's), any proposer, other requests around it arriving at other steps, and
a KV cache small enough that sequences are preempted and recomputed.
"""

from __future__ import annotations

import pytest
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import random_head_dir, staggered_samples, tiny_tokenizer
from tests.engine.test_llm_greedy import noisy_copy, prompts

VOCAB = 32
MAX_TOKENS = 14
SEEDED = [SamplingParams(temperature=0.9, top_k=12, seed=11, max_tokens=MAX_TOKENS,
                         ignore_eos=True),
          SamplingParams(temperature=1.1, top_p=0.9, seed=2**40 + 7, max_tokens=MAX_TOKENS,
                         ignore_eos=True, repetition_penalty=1.3),
          SamplingParams(temperature=0.7, n=2, seed=5, max_tokens=MAX_TOKENS, ignore_eos=True)]
OTHERS = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
          SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True),
          SamplingParams(temperature=0.8, seed=99, max_tokens=MAX_TOKENS, ignore_eos=True)]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, target):
    return random_head_dir(tmp_path_factory, target.config)


def make_llm(target, head_dir, method: str | None, k: int, adaptive: bool,
             kv_cache_tokens: int | None = None, max_num_seqs: int = 8) -> LLM:
    spec = None
    if method is not None:
        spec = {"method": method, "num_speculative_tokens": k, "adaptive_k": adaptive}
        if method == "draft_model":
            spec.update(model=noisy_copy(target, 0.3, seed=1), tokenizer=tiny_tokenizer(VOCAB))
        if method == "eagle":
            spec.update(model=str(head_dir))
    kwargs = {} if kv_cache_tokens is None else dict(kv_cache_tokens=kv_cache_tokens,
                                                     max_model_len=40)
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec,
               max_num_seqs=max_num_seqs, **kwargs)


_ALONE: dict[tuple, list[list[int]]] = {}


def alone(target, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    """The request alone in an engine without speculation."""
    key = (tuple(prompt), repr(params))
    if key not in _ALONE:
        llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=8)
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        _ALONE[key] = [c.token_ids for c in out.outputs]
    return _ALONE[key]


CASES = [(method, k, False) for method in ("ngram", "draft_model", "eagle") for k in (1, 2, 4)]
CASES += [(method, 4, True) for method in ("ngram", "draft_model", "eagle")]


@pytest.mark.parametrize(("method", "k", "adaptive"), CASES)
@pytest.mark.parametrize("preempt", [False, True])
def test_a_seeded_request_in_any_batch_equals_its_run_alone_without_speculation(
        target, head_dir, method, k, adaptive, preempt):
    batch_prompts = prompts(9, seed=3)
    batch = [(p, SEEDED[i % 3] if i % 3 == 0 else OTHERS[i % 3]) for i, p in
             enumerate(batch_prompts[:6])]
    batch += [(p, SEEDED[i]) for i, p in enumerate(batch_prompts[6:])]
    arrivals = [0, 0, 1, 2, 2, 4, 0, 3, 6]
    # 48 KV rows for up to 8 sequences of up to 11 + 14 tokens: preemption is routine
    llm = make_llm(target, head_dir, method, k, adaptive, 48 if preempt else None)
    outputs = staggered_samples(llm, [b[0] for b in batch], [b[1] for b in batch], arrivals)
    checked = 0
    for (prompt, params), out in zip(batch, outputs, strict=True):
        if params.seed is not None:
            assert out == alone(target, prompt, params), (prompt, params)
            checked += 1
    assert checked == 7
    metrics = llm.get_metrics()
    assert metrics.num_drafted > 0
    assert (metrics.num_preemptions > 0) == preempt


def test_coupled_draft_model_drafts_are_accepted_where_the_models_agree(target):
    """A draft model with the target's own weights samples a seeded request's drafts with the
    target's keyed noise: every draft is the target's token (acceptance 1). Under rejection
    sampling (no seed) the same drafts are accepted with probability 1 too (p = q) — so this
    also checks that coupling loses nothing where the distributions agree."""
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "adaptive_k": False,
            "model": target, "tokenizer": tiny_tokenizer(VOCAB)}
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec,
              max_num_seqs=8)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=MAX_TOKENS, ignore_eos=True)
    batch = prompts(4, seed=5)
    outs = llm.generate(batch, params, use_tqdm=False)
    metrics = llm.get_metrics()
    assert metrics.num_drafted > 20
    assert metrics.num_accepted == metrics.num_drafted
    for prompt, out in zip(batch, outs, strict=True):
        assert [out.outputs[0].token_ids] == alone(target, prompt, params)


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle"])
def test_thirty_two_seeded_requests_in_one_batch_equal_their_runs_alone(target, head_dir, method):
    """Batch 32, k = 4 drafts every step: every seeded request equals its run alone without
    speculation."""
    llm = make_llm(target, head_dir, method, 4, False, max_num_seqs=32)
    batch = prompts(32, seed=11)
    params = [SamplingParams(temperature=0.6 + 0.05 * (i % 8), top_k=16, seed=100 + i,
                             max_tokens=10, ignore_eos=True) for i in range(32)]
    outs = llm.generate(batch, params, use_tqdm=False)
    for prompt, p, out in zip(batch, params, outs, strict=True):
        assert [c.token_ids for c in out.outputs] == alone(target, prompt, p)
    assert llm.get_metrics().num_drafted > 0
