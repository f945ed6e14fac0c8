"""Suffix decoding: the token store and its drafts on hand-built texts (counts and limits worked
out by hand), then end to end on a tiny random model: acceptance over repeats of a request,
and output equal to plain decoding."""

from __future__ import annotations

import random

import pytest
from conftest import tiny_model

from engine import LLM, SamplingParams
from engine.config import SpeculativeConfig
from proposers import ProposeRequest
from proposers.suffix import SuffixProposer
from proposers.suffix_index import SuffixIndex, draft_from
from tests.engine.llm_helpers import random_head_dir, tiny_tokenizer

PARAMS = SamplingParams(temperature=0.0)


def propose(proposer: SuffixProposer, req_id: str, context: list[int], k: int) -> list[int]:
    return proposer.propose([ProposeRequest(req_id, context, k, PARAMS)]).draft_token_ids[0]


def test_the_most_frequent_continuation_while_its_probability_holds():
    """After [1 2 3]: 4 three times, 9 once. Path probabilities: 4 -> 3/4; then [.. 4] -> 5
    in all three -> 3/4; then 6 twice of three -> 1/2, then 7 in both -> 1/2."""
    store = SuffixIndex(max_depth=24, max_cached=10)
    store.extend("a", [1, 2, 3, 4, 5, 6, 7])
    store.extend("b", [1, 2, 3, 4, 5, 6, 7])
    store.extend("c", [1, 2, 3, 4, 5, 8])
    store.extend("d", [1, 2, 3, 9])
    found = store.candidates([0, 1, 2, 3])
    assert sorted(length for _, _, length in found) == [3, 3, 3, 3]
    draft, score = draft_from(found, 8, 24, 4.0, 0.1)
    assert draft == [4, 5, 6, 7] and score == pytest.approx(0.75 + 0.75 + 0.5 + 0.5)
    assert draft_from(found, 8, 24, 4.0, 0.6)[0] == [4, 5]  # (1/2 < 0.6 stops at 6)
    assert draft_from(found, 8, 24, 1.0, 0.1)[0] == [4, 5, 6]  # (3 matched: 3 drafts at most)
    assert draft_from(found, 2, 24, 4.0, 0.1)[0] == [4, 5]  # (k = 2)
    # depth 4 bounds match + draft: the match of 3 leaves room for 1; read as a match of 1
    # (the same four occurrences) it leaves 3, at 4 drafts a matched token
    assert draft_from(found, 8, 4, 4.0, 0.1)[0] == [4, 5, 6]


def test_a_longer_match_narrows_the_node():
    """[7 2 3] matched 3 long only in "x" (then 4), [2 3] twice (then 4 and 5)."""
    store = SuffixIndex(max_depth=24, max_cached=10)
    store.extend("x", [7, 2, 3, 4])
    store.extend("y", [8, 2, 3, 5])
    found = store.candidates([7, 2, 3])
    assert sorted((length, tokens[pos]) for tokens, pos, length in found) == [(2, 5), (3, 4)]
    assert draft_from(found, 4, 24, 1.0, 0.1) == ([4], 1.0)  # (m = 3 scores 1; m = 2: 1/2)


def test_cached_requests_are_dropped_oldest_first_and_a_returning_one_starts_over():
    store = SuffixIndex(max_depth=24, max_cached=1)
    store.extend("a", [1, 2, 3, 4])
    store.leave("a")
    assert draft_from(store.candidates([1, 2, 3]), 4, 24, 1.0, 0.1)[0] == [4]
    store.extend("b", [5, 6, 7])
    store.leave("b")  # (one cached request: "a" goes)
    assert store.candidates([1, 2, 3]) == [] and store.tokens("a") is None
    store.extend("b", [5, 6, 7, 8])  # (a preempted request comes back: its text anew)
    assert store.tokens("b") == [5, 6, 7, 8]
    for i in range(40):  # (dropped entries are purged once they outnumber the live ones)
        store.extend(f"r{i}", [i + 100] * 6)
        store.leave(f"r{i}")
    held = [v for index in store._index for v in index.values()]
    assert sum(1 if isinstance(v, int) else len(v) for v in held) <= 2 * store._live


def test_drafts_never_come_from_the_contexts_own_end():
    proposer = SuffixProposer()
    assert propose(proposer, "a", [1, 2, 3], 4) == []
    assert propose(proposer, "a", [1, 2, 3, 1, 2], 4) == [3, 1]  # (m = 2, factor 1: 2 at most)


@pytest.mark.parametrize("field,value", [("suffix_decoding_max_tree_depth", 1),
                                         ("suffix_decoding_max_cached_requests", -1),
                                         ("suffix_decoding_max_spec_factor", 0),
                                         ("suffix_decoding_min_token_prob", 1.5)])
def test_bad_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SpeculativeConfig.{field}={value!r} is invalid"):
        SpeculativeConfig(method="suffix", **{field: value})


VOCAB = 256


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=3)


def make_llm(target, method: str | None, **spec) -> LLM:
    config = None if method is None else {"method": method, "num_speculative_tokens": 4, **spec}
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4,
               speculative_config=config)


def test_acceptance_rises_over_repeats_of_a_request(target):
    """A seeded sample of a random model is text without repeats (nothing to draft the first
    time); sent again, the same tokens come out, and the earlier run's text drafts them."""
    prompt = [random.Random(0).randrange(3, VOCAB) for _ in range(30)]
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=40, ignore_eos=True)
    (plain,) = make_llm(target, None).generate([prompt], params, use_tqdm=False)
    llm = make_llm(target, "suffix", adaptive_k=False)
    rates, steps = [], []
    for _ in range(4):
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        assert out.outputs[0].token_ids == plain.outputs[0].token_ids
        rates.append(out.metrics.acceptance_rate)
        steps.append(out.metrics.num_steps)
    assert rates[0] < 0.5 and rates[3] >= 0.8 and rates == sorted(rates)
    assert steps[3] < steps[0] / 2


@pytest.mark.parametrize("method", ["suffix", "suffix_eagle"])
def test_greedy_with_suffix_equals_plain(target, method, tmp_path_factory):
    rng = random.Random(1)
    base = [rng.randrange(3, VOCAB) for _ in range(20)]
    prompts = [base + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 6))]
               for _ in range(5)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    expected = [o.outputs[0].token_ids
                for o in make_llm(target, None).generate(prompts, greedy, use_tqdm=False)]
    extra = {"model": str(random_head_dir(tmp_path_factory, target.config))} \
        if method == "suffix_eagle" else {}
    llm = make_llm(target, method, adaptive_k=False, **extra)  # (every step drafts: the
    for _ in range(2):  # second round's drafts from the first's text are accepted)
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.get_metrics().num_accepted > 0
