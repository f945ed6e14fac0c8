"""Prefix caching end to end on a tiny random model: outputs with the cache equal outputs
without (greedy and seeded, with speculation, eviction, preemption, aborts), and the engine
holds no lock and no row of its own once every request is gone."""

from __future__ import annotations

import random

import pytest
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import random_head_dir, tiny_tokenizer

VOCAB = 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


def make_llm(target, cache: bool, kv: int = 256, method: str | None = "ngram",
             max_num_seqs: int = 4) -> LLM:
    spec = None if method is None else {"method": method, "num_speculative_tokens": 3}
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=max_num_seqs,
               kv_cache_tokens=kv, speculative_config=spec, enable_prefix_caching=cache)


def shared_prompts(seed: int, n: int, system: int = 40) -> list[list[int]]:
    """``n`` prompts that start with one ``system``-token prefix, then 1-7 tokens of their own."""
    rng = random.Random(seed)
    head = [rng.randrange(3, VOCAB) for _ in range(system)]
    return [head + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 8))]
            for _ in range(n)]


def assert_holds_nothing(llm: LLM, kv: int) -> None:
    """No lock on any cached row, every row free or evictable, no slot in use."""
    runner = llm.engine.runner
    cache = runner._slots.cache
    assert all(node.refs == 0 for node in cache._nodes())
    assert runner.num_free_tokens == kv and runner.num_cached_tokens == 0
    assert cache.num_evictable == cache.num_rows == runner.num_prefix_cached_tokens
    assert runner.num_free_slots == llm.engine.config.max_num_seqs


@pytest.mark.parametrize("method", [None, "ngram"])
def test_greedy_with_the_cache_equals_greedy_without(target, method):
    prompts = shared_prompts(0, 6)
    plain = make_llm(target, False, method=None)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY, use_tqdm=False)]
    llm = make_llm(target, True, method=method)
    for repeat in range(3):
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        assert_holds_nothing(llm, 256)
        cached = [o.num_cached_tokens for o in outs]
        # (the first batch admits 4 at once with nothing cached; each prompt's last token is
        # always computed, so at most len - 1 of it is read)
        assert all(c <= len(p) - 1 for c, p in zip(cached, prompts, strict=True))
        if repeat:
            assert all(c >= 40 for c in cached)
    metrics = llm.get_metrics()
    assert 0 < metrics.prefix_cache_hits <= metrics.prefix_cache_queries
    assert metrics.prefix_cache_tokens == llm.engine.runner.num_prefix_cached_tokens > 0


def test_a_follow_up_turn_reads_the_previous_turns_prompt_and_output(target):
    """A multi-turn chat: turn 2's prompt is turn 1's prompt + output + new words; the cache
    serves all of turn 1 (without drafts its output's last token was never fed: one less)."""
    llm = make_llm(target, True, method=None)
    first = shared_prompts(1, 1)[0]
    (out,) = llm.generate([first], GREEDY, use_tqdm=False)
    turn2 = first + out.outputs[0].token_ids + [5, 6, 7]
    (again,) = llm.generate([turn2], GREEDY, use_tqdm=False)
    assert again.num_cached_tokens == len(first) + len(out.outputs[0].token_ids) - 1
    (plain,) = make_llm(target, False).generate([turn2], GREEDY, use_tqdm=False)
    assert again.outputs[0].token_ids == plain.outputs[0].token_ids
    assert_holds_nothing(llm, 256)


def test_seeded_sampling_is_the_same_with_the_cache(target):
    prompts = shared_prompts(2, 4)
    params = [SamplingParams(temperature=0.9, top_k=20, seed=10 + i, max_tokens=10)
              for i in range(4)]
    expected = [o.outputs[0].token_ids
                for o in make_llm(target, False).generate(prompts, params, use_tqdm=False)]
    llm = make_llm(target, True)
    for _ in range(2):
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.get_metrics().prefix_cache_hits > 0
    assert_holds_nothing(llm, 256)


def test_eviction_and_preemption_in_a_small_pool(target):
    """64 rows for up to 4 sequences of 40-47 prompt tokens: cached rows are evicted for new
    work and sequences are preempted (their committed rows cached, read back on readmission)."""
    prompts = shared_prompts(3, 8) + shared_prompts(4, 4)
    expected = [o.outputs[0].token_ids
                for o in make_llm(target, False, kv=256).generate(prompts, GREEDY,
                                                                  use_tqdm=False)]
    llm = make_llm(target, True, kv=64)
    for _ in range(2):
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        assert_holds_nothing(llm, 64)
    metrics = llm.get_metrics()
    assert metrics.num_preemptions > 0 and metrics.prefix_cache_hits > 0
    assert llm.engine.runner.num_prefix_cached_tokens <= 64


def test_aborts_and_streams_leave_no_lock(target):
    prompts = shared_prompts(5, 3)
    llm = make_llm(target, True)
    llm.generate(prompts[:1], GREEDY, use_tqdm=False)  # (cached: the others share its prefix)
    stream = llm.generate_stream(prompts, GREEDY)
    first = next(stream)
    llm.abort(first.request_id)
    rest = list(stream)
    assert any(d.finish_reason == "abort" for d in [first, *rest])
    assert_holds_nothing(llm, 256)
    stream = llm.generate_stream(prompts, GREEDY)
    next(stream)
    stream.close()  # a consumer that stops reading
    assert_holds_nothing(llm, 256)
    expected = make_llm(target, False).generate(prompts, GREEDY, use_tqdm=False)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in expected]


def test_prompt_logprobs_requests_compute_their_whole_prompt(target):
    prompt = shared_prompts(6, 1)[0]
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=1)
    llm = make_llm(target, True)
    llm.generate([prompt], GREEDY, use_tqdm=False)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    (plain,) = make_llm(target, False).generate([prompt], params, use_tqdm=False)
    assert out.num_cached_tokens == 0 and len(out.prompt_logprobs) == len(prompt)
    assert [None if p is None else sorted(p) for p in out.prompt_logprobs] == \
        [None if p is None else sorted(p) for p in plain.prompt_logprobs]


def test_rejected_drafts_after_a_shared_prefix_leave_it_intact(target):
    """A random draft model's drafts, mostly rejected, are rolled back in every step after a
    cached prefix; the next request reading that prefix still gets the plain output."""
    prompt = shared_prompts(7, 1)[0]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    (plain,) = make_llm(target, False, method=None).generate([prompt], params, use_tqdm=False)
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4, kv_cache_tokens=256,
              enable_prefix_caching=True,
              speculative_config={"method": "draft_model", "num_speculative_tokens": 3,
                                  "adaptive_k": False,
                                  "model": tiny_model("llama", vocab_size=VOCAB, seed=1),
                                  "tokenizer": tiny_tokenizer(VOCAB)})
    for _ in range(3):
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    metrics = llm.get_metrics()
    assert metrics.num_drafted > metrics.num_accepted  # (rejections happened)
    assert out.num_cached_tokens == len(prompt) - 1
    assert_holds_nothing(llm, 256)


def test_a_draft_head_turns_the_cache_off_and_says_so(target, tmp_path_factory, caplog):
    head = str(random_head_dir(tmp_path_factory, target.config))
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4, kv_cache_tokens=256,
              enable_prefix_caching=True,
              speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 3})
    assert "enable_prefix_caching is off with method='eagle'" in caplog.text
    prompts = shared_prompts(8, 3)
    expected = make_llm(target, False, method=None).generate(prompts, GREEDY, use_tqdm=False)
    for _ in range(2):
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == \
            [o.outputs[0].token_ids for o in expected]
    assert llm.get_metrics().prefix_cache_queries == 0
    assert llm.engine.runner.num_prefix_cached_tokens == 0
