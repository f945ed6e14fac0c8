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
    """Costs fixed (a draft free, a scored token 0.1 of a plain step), so that the controller's
    decisions follow the acceptance alone, not this machine's timings (measured costs made the
    acceptance-0 test fail about one run in four)."""
    return {"method": "draft_model", "model": draft, "tokenizer": tiny_tokenizer(VOCAB),
            "num_speculative_tokens": 4, "draft_sample_method": "greedy", "adaptive_k": adaptive,
            "draft_cost_ratio": 0.0, "verify_cost_per_token": 0.1, "adaptive_probe_interval": 8}


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


def test_sampling_params_cap_or_turn_off_a_requests_speculation(target):
    """Per-request control: SamplingParams.num_speculative_tokens caps a request's drafts per
    step (0: none); the others speculate as configured, and greedy output is unchanged."""
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "adaptive_k": False})
    caps = [0, 1, None]
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                             num_speculative_tokens=c) for c in caps]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(target, p, 40) for p in PROMPTS]
    drafted = [o.metrics.num_drafted for o in outs]
    steps = [o.metrics.num_steps for o in outs]
    assert drafted[0] == 0
    assert 0 < drafted[1] <= steps[1]
    assert drafted[2] > steps[2]  # more than one draft per step somewhere


@pytest.mark.parametrize("adaptive", [False, True])
def test_steps_of_unequal_drafts_are_packed_and_keep_greedy_output(target, monkeypatch,
                                                                    adaptive):
    """Requests capped at 0, 1 and 4 drafts verify unequal numbers of drafts in one step: with
    graph buckets (here their padded layout, eagerly) the runner packs such steps, one token a
    row (at any saving), and greedy output stays Hugging Face's. The controller (costs fixed:
    decisions independent of this machine's timings) records those steps as packed ones."""
    from engine.runner import step_layout

    monkeypatch.setattr(step_layout, "PACK_MIN_BATCH", 1)  # (packed at any size)
    monkeypatch.setattr(step_layout, "PACK_MAX_EXTRA", 100)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "adaptive_k": adaptive,
            "verify_cost_per_token": 0.1, "draft_cost_ratio": 0.0}
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec)
    runner, policy = llm.engine.runner, llm.engine.controller
    runner.use_graph_buckets(5, capture=False)
    packed, recorded = [], []
    forward, learn = runner.forward, policy.learn

    def counted(*args, **kwargs):
        out = forward(*args, **kwargs)
        packed.append(out.packed_rows)
        return out

    def recording(outcome, defer=False):
        if outcome.timing is not None:
            recorded.append(outcome.timing.packed_rows)
        return learn(outcome, defer)

    runner.forward, policy.learn = counted, recording
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                             num_speculative_tokens=c) for c in (0, 1, None)]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(target, p, 40) for p in PROMPTS]
    assert sum(rows is not None for rows in packed) >= 3
    if adaptive:
        assert any(rows is not None for rows in recorded)
    else:
        assert outs[2].metrics.num_drafted > outs[2].metrics.num_steps  # (4 drafts at times)


def test_a_proposal_that_is_not_steady_teaches_the_controller_no_cost(target):
    """A proposal the proposer marks as not steady (it captured a CUDA graph, met a new shape)
    reaches the controller without its time (None); the steady ones are timed."""
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "adaptive_k": False})
    engine = llm.engine
    proposer, calls, seen = engine.proposer, [], []
    original = proposer.propose

    def propose(requests):
        proposer.last_proposal_steady = len(calls) % 2 == 1  # every other proposal not steady
        calls.append(proposer.last_proposal_steady)
        return original(requests)

    learn = engine.controller.learn

    def learning(outcome, defer=False):  # (on CPU the step's own outcome, at its end)
        if outcome.timing is not None:
            seen.append((calls.pop() if calls else False, outcome.timing.propose_s))
        calls.clear()
        return learn(outcome, defer)

    proposer.propose = propose
    engine.controller.learn = learning
    llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    timed = seen[2:]  # (past the first look at the prompt, never timed)
    assert any(steady for steady, _ in timed) and any(not steady for steady, _ in timed)
    assert all((s is not None) == steady for steady, s in timed)


def test_generate_closes_its_batch_and_a_stream_does_not(target, monkeypatch):
    """``LLM.generate`` returns when its last request is done, so its requests are added as one
    closed batch (the controller then weighs the sequences with the most tokens left); a
    stream's requests each count on their own."""
    from scheduler import GoodputPolicy

    seen = []
    new_tracker = GoodputPolicy.new_tracker

    def spy(self, seq, together=False):
        seen.append(together)
        return new_tracker(self, seq, together)

    monkeypatch.setattr(GoodputPolicy, "new_tracker", spy)
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
              speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert seen == [True] * len(PROMPTS)
    seen.clear()
    list(llm.generate_stream(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4)))
    assert seen == [False]


def test_steps_without_drafts_show_the_ngram_index_their_contexts(target, monkeypatch):
    """Where the forward runs asynchronously (a GPU), a step that asks n-gram for no drafts
    shows it the sampling sequences' contexts while the forward runs; the path is forced here
    on CPU. The greedy output is still the target's own, and the proposals after observed steps
    are not first looks (their time is the controller's typical proposal cost)."""
    from proposers.ngram import NgramProposer

    observed = []
    observe = NgramProposer.observe

    def spy(self, requests):
        observed.append(len(requests))
        return observe(self, requests)

    monkeypatch.setattr(NgramProposer, "observe", spy)
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
              speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                  "verify_cost_per_token": 2.0})  # (drafts never pay: idle)
    llm.engine.forward_is_async = True
    out = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [hf_greedy(target, p, 40) for p in PROMPTS]
    assert observed and max(observed) == len(PROMPTS)
    # ... every observe_every-th step without a proposal, not every one
    steps = llm.engine.metrics.num_steps
    every = llm.engine.proposer.observe_every
    assert steps >= 40 and len(observed) <= steps // every < steps // 2


def test_learning_a_step_late_keeps_greedy_output_and_loses_no_row(target):
    """On a GPU the controller learns each step's outcome during the next step's forward
    (``LLMEngine._run_step``); forced here on CPU, with an aborted request among finished
    ones: the greedy output is still the target's own, the controller still drafts where
    drafts pay, and every acceptance row comes back once the engine is idle."""
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
              speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                  "verify_cost_per_token": 0.1})
    llm.engine.forward_is_async = True
    acceptance = llm.engine.controller.controller.acceptance
    rows = len(acceptance.stamps)
    for _ in range(2):
        out = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in out] == [hf_greedy(target, p, 40)
                                                         for p in PROMPTS]
        assert len(acceptance._free) == rows
    assert llm.get_metrics().num_drafted > 0
    llm.engine.add_request("gone", None, PROMPTS[0], GREEDY)
    llm.engine.step()
    llm.engine.step()
    llm.engine.abort_request("gone")  # (while the step's outcome waits to be learnt)
    llm.engine.step()  # (nothing runs: the finished request is reported)
    out = llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    assert out[0].outputs[0].token_ids == hf_greedy(target, PROMPTS[0], 40)
    assert len(acceptance._free) == rows


def test_a_probes_proposal_after_plain_steps_is_timed_as_such(target):
    """Where drafts never pay, the controller probes after plain steps; each probe's proposal
    is timed into the controller's ``"probe"`` cell (not its typical proposals'), which its
    probe wait weighs."""
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
              speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                  "verify_cost_per_token": 2.0,  # (drafts never pay: idle)
                                  "adaptive_probe_interval": 2})  # (probes every 2 x 8 steps)
    out = llm.generate(PROMPTS * 2, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out[:3]] == [hf_greedy(target, p, 40)
                                                         for p in PROMPTS]
    costs = llm.engine.controller.controller.costs
    probes = sum(costs.count("probe", 2 * len(PROMPTS), k) for k in range(1, 5))
    typical = sum(costs.count("propose", 2 * len(PROMPTS), k) for k in range(1, 5))
    assert probes >= 1 and typical == 0
