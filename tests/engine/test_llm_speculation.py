"""Adaptive k and the acceptance methods through the engine."""

import pytest
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer
from tests.engine.test_llm_greedy import noisy_copy

VOCAB = 32
PROMPTS = [[5, 6, 7, 5, 6], [9, 10, 11, 12, 9], [20, 21, 20, 21, 22]]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


def draft_spec(draft, adaptive: bool) -> dict:
    return {"method": "draft_model", "model": draft, "tokenizer": tiny_tokenizer(VOCAB),
            "num_speculative_tokens": 4, "draft_sample_method": "greedy", "adaptive_k": adaptive,
            "draft_cost_ratio": 0.0, "adaptive_probe_interval": 8}


def test_adaptive_k_stops_drafting_when_drafts_fail(target):
    bad_draft = tiny_model("llama", vocab_size=VOCAB, seed=9, num_layers=1)  # unrelated guesses
    fixed = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
                speculative_config=draft_spec(bad_draft, adaptive=False))
    adaptive = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
                   speculative_config=draft_spec(bad_draft, adaptive=True))
    outs = [llm.generate(PROMPTS, GREEDY, use_tqdm=False) for llm in (fixed, adaptive)]
    expected = [hf_greedy(target, p, 40) for p in PROMPTS]
    for out in outs:
        assert [o.outputs[0].token_ids for o in out] == expected
    fixed_m, adaptive_m = fixed.get_metrics(), adaptive.get_metrics()
    assert fixed_m.acceptance_rate < 0.2
    assert adaptive_m.num_drafted < 0.3 * fixed_m.num_drafted
    assert adaptive_m.num_drafted > 0  # it still probes now and then


def test_adaptive_k_keeps_drafting_when_drafts_pay(target):
    good_draft = noisy_copy(target, 0.1, seed=1)
    fixed = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
                speculative_config=draft_spec(good_draft, adaptive=False))
    adaptive = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
                   speculative_config=draft_spec(good_draft, adaptive=True))
    for llm in (fixed, adaptive):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert fixed.get_metrics().acceptance_rate > 0.5
    assert adaptive.get_metrics().mean_accepted_length >= (
        0.8 * fixed.get_metrics().mean_accepted_length)


@pytest.mark.parametrize("acceptance", ["greedy", "typical_acceptance_sampler"])
def test_other_acceptance_methods_run(target, acceptance):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_method": acceptance}
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec)
    greedy = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    if acceptance == "greedy":
        assert [o.outputs[0].token_ids for o in greedy] == [
            hf_greedy(target, p, 40) for p in PROMPTS]
    sampled = llm.generate(PROMPTS, SamplingParams(temperature=0.8, seed=1, max_tokens=12,
                                                   ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 12 for o in sampled)
    assert llm.get_metrics().num_accepted > 0


def test_ngram_drafts_fill_the_steps_padding(target):
    """The forward pads every sequence to the step's longest: n-gram drafts up to that length
    are given to every decoding sequence, except seeded sampling ones (fixed k), within each
    one's max_tokens and the free KV cache."""
    from scheduler import ScheduledSequence

    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
              speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    engine = llm.engine
    params = [GREEDY, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=7, max_tokens=40), GREEDY]
    seqs = [engine.add_request(f"r{i}", None, PROMPTS[i % 3], p)[0]
            for i, p in enumerate(params)]
    policy, free = engine.spec_policy, 1000
    items = [ScheduledSequence(seq, 1, True, k)
             for seq, k in zip(seqs, [0, 0, 1, 2], strict=True)]
    policy.fill_padding(items, free)
    # longest 1 + 2; max_tokens=3 leaves room for 2 drafts; the seeded sample keeps its 1
    assert [item.num_spec_tokens for item in items] == [2, 2, 1, 2]
    items = [ScheduledSequence(seqs[0], 1, True, 0), ScheduledSequence(seqs[3], 40, False, 0)]
    policy.fill_padding(items, free)  # a prefill chunk pads decodes to 1 + k at most
    assert items[0].num_spec_tokens == 4
    items = [ScheduledSequence(seqs[0], 1, True, 0), ScheduledSequence(seqs[3], 1, True, 4)]
    policy.fill_padding(items, 8)  # the step needs 6 rows of 8 free: 2 drafts fit
    assert items[0].num_spec_tokens == 2
