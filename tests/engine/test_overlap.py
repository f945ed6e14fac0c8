"""Overlapped steps (``async_scheduling``, :mod:`engine.overlap`) give the synchronous steps'
output, whatever stops a sample one step late, preemption or an abort in flight, and leave
nothing behind.

On CPU the forward runs in the call, so nothing overlaps in time, but the path is the GPU's:
the next step is launched from the flight's tokens left on the device (``FedTokens``) before
they are read, and committed a call later.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.runner import FedTokens
from engine.runner.model_runner import ModelRunner
from scheduler import DraftPlan
from tests.engine.llm_helpers import staggered_outputs, tiny_tokenizer

VOCAB = 48


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=3)


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, VOCAB) for _ in range(rng.randrange(3, 14))] for _ in range(n)]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="a CUDA device overlaps in time: none here"))]


def make_llm(target, overlap: bool, device: str = "cpu", **kwargs) -> LLM:
    return LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
               async_scheduling=overlap, **kwargs)


class LLMOf:
    """What :func:`outputs` reads of an ``LLM``: its engine."""

    def __init__(self, engine) -> None:
        self.engine = engine


class Launches:
    """Counts the steps an engine launched ahead (its ``_launch_next`` answers that were not
    None), so that a test knows the overlapped path ran."""

    def __init__(self, monkeypatch, engine) -> None:
        self.count = 0
        launch = engine._launch_next

        def counted(flight):
            nxt = launch(flight)
            self.count += nxt is not None
            return nxt

        monkeypatch.setattr(engine, "_launch_next", counted)


def outputs(llm: LLM, batch, params, arrivals=None) -> list[tuple]:
    arrivals = arrivals or [0] * len(batch)
    outs = staggered_outputs(llm, batch, params, arrivals)
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs]
            for out in outs]


def assert_engine_empty(llm: LLM) -> None:
    engine = llm.llm_engine
    assert engine._in_flight is None
    assert not engine.has_work()
    assert engine.runner.num_cached_tokens == 0
    assert engine.runner.num_free_slots == engine.config.max_num_seqs


# requests whose stops land at every kind of step: a frequent stop token, a stop string, EOS,
# max_tokens, n samples, seeded and unseeded sampling; and ones whose logits need the host
# (penalties, min_tokens, logprobs: sampled after the step before commits,
# engine.overlap.Pending; tests/engine/test_overlap_hosted.py)
MIXED = [
    SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[7, 19, 23]),
    SamplingParams(temperature=0.0, max_tokens=30, stop=["w5 w", "w3"], ignore_eos=True),
    SamplingParams(temperature=0.9, seed=4, max_tokens=21, ignore_eos=True, n=2),
    SamplingParams(temperature=0.8, top_k=9, seed=7, max_tokens=25, stop_token_ids=[11]),
    SamplingParams(temperature=0.0, max_tokens=9),
]
NOT_OVERLAPPABLE = [
    SamplingParams(temperature=0.7, seed=2, max_tokens=12, repetition_penalty=1.4),
    SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6, stop_token_ids=[7]),
    SamplingParams(temperature=0.0, max_tokens=12, logprobs=2),
]


@pytest.mark.parametrize("device", DEVICES)
def test_overlapped_steps_equal_synchronous_steps(target, monkeypatch, device):
    batch = prompts(len(MIXED) * 2, seed=1)
    params = MIXED * 2
    arrivals = [0, 0, 0, 0, 0, 0, 3, 5, 5, 9, 14, 20]
    expected = outputs(make_llm(target, False, device, max_num_seqs=6), batch, params, arrivals)
    llm = make_llm(target, True, device, max_num_seqs=6)
    launches = Launches(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, params, arrivals) == expected
    assert launches.count > 20  # (most steps launched ahead)
    assert_engine_empty(llm)
    # stops that land one step late were exercised: a stop token and a stop string
    finishes = {(r[2], type(r[3]).__name__) for out in expected for r in out}
    assert {("stop", "int"), ("stop", "str"), ("length", "NoneType")} <= finishes


def test_steps_that_cannot_overlap_alternate_with_ones_that_do(target, monkeypatch):
    batch = prompts(6, seed=2)
    params = [MIXED[0], NOT_OVERLAPPABLE[0], MIXED[3], NOT_OVERLAPPABLE[1], MIXED[2],
              NOT_OVERLAPPABLE[2]]
    arrivals = [0, 4, 0, 10, 2, 16]
    expected = outputs(make_llm(target, False, max_num_seqs=4), batch, params, arrivals)
    llm = make_llm(target, True, max_num_seqs=4)
    launches = Launches(monkeypatch, llm.llm_engine)
    got = outputs(llm, batch, params, arrivals)
    assert got == expected
    assert launches.count > 0
    assert got[5][0][0] and all(len(c.logprobs) == len(c.token_ids)
                                for c in llm.generate([batch[5]], params[5],
                                                      use_tqdm=False)[0].outputs)
    assert_engine_empty(llm)


@pytest.mark.parametrize("device", DEVICES)
def test_a_full_batch_goes_on_ahead_while_requests_wait(target, monkeypatch, device):
    """Twelve requests for four slots at once: while every slot is taken, a waiting request
    cannot be admitted before a sequence finishes (which the commit finds), so steps go on
    being launched ahead with the queue non-empty; output unchanged."""
    batch = prompts(12, seed=8)
    params = [MIXED[i % len(MIXED)] for i in range(12)]
    expected = outputs(make_llm(target, False, device, max_num_seqs=4), batch, params)
    llm = make_llm(target, True, device, max_num_seqs=4)
    engine = llm.llm_engine
    launch, queued = engine._launch_next, []

    def counted(flight):
        nxt = launch(flight)
        queued.append(nxt is not None and bool(engine.scheduler.waiting))
        return nxt

    monkeypatch.setattr(engine, "_launch_next", counted)
    assert outputs(llm, batch, params) == expected
    assert sum(queued) > 20
    assert_engine_empty(llm)


@pytest.mark.parametrize("device", DEVICES)
def test_preemption_between_overlapped_steps(target, monkeypatch, device):
    """A KV cache that holds about two of the six sequences: overlapped steps end where the
    cache runs short, preempted sequences are recomputed, output unchanged."""
    batch = prompts(6, seed=4)
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=9, max_tokens=20, ignore_eos=True)] * 3
    kwargs = dict(max_num_seqs=6, kv_cache_tokens=48, max_model_len=40)
    expected = outputs(make_llm(target, False, device, **kwargs), batch, params)
    llm = make_llm(target, True, device, **kwargs)
    launches = Launches(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, params) == expected
    assert launches.count > 0 and llm.llm_engine.metrics.num_preemptions > 0
    assert_engine_empty(llm)


def test_an_abort_in_flight_drops_its_token_and_frees_its_slot(target):
    batch = prompts(3, seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    expected = outputs(make_llm(target, False), batch[:2], [params] * 2)
    llm = make_llm(target, True)
    engine = llm.llm_engine
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", None, prompt, params)
    while engine._in_flight is None or len(engine._in_flight.sequences) < 3:
        engine.step()
    engine.abort_request("r2")  # (its token is on its way; its slot goes now)
    while engine.has_work():
        engine.step()
    aborted = engine.pop_request("r2")[0]
    assert aborted.finish_reason == "abort" and aborted.num_output_tokens == 1
    from engine.llm import build_output
    got = [[(c.token_ids, c.text, c.finish_reason, c.stop_reason)
            for c in build_output(engine.pop_request(f"r{i}")).outputs] for i in range(2)]
    assert got == expected
    assert_engine_empty(llm)
    # the next call is correct
    assert outputs(llm, batch[:2], [params] * 2) == expected


def test_streamed_deltas_add_up_to_the_output(target):
    batch = prompts(3, seed=6)
    params = SamplingParams(temperature=0.0, max_tokens=14, stop=["w9"], ignore_eos=True)
    expected = outputs(make_llm(target, False), batch, [params] * 3)
    llm = make_llm(target, True)
    texts, tokens = {}, {}
    for delta in llm.generate_stream(batch, params):
        key = delta.request_id
        texts[key] = texts.get(key, "") + delta.text
        tokens[key] = tokens.get(key, []) + list(delta.token_ids)
    assert [(tokens[k], texts[k]) for k in sorted(texts)] == [
        (out[0][0], out[0][1]) for out in expected]


def test_fed_tokens_give_the_logits_of_the_same_tokens_from_the_host(target):
    """``ModelRunner.forward(fed=...)``: each slot's first new token taken on the device from
    ``values[sources[b]]`` scores as that token given from the host."""
    runners = [ModelRunner(target.to("cpu"), 4, 256, 64) for _ in range(2)]
    contexts = prompts(3, seed=7)
    for runner in runners:
        slots = [runner.allocate_slot() for _ in contexts]
        runner.forward(slots, contexts)
    nxt = [5, 17, 40]
    host = runners[0].forward([0, 1, 2], [[t] for t in nxt]).logits
    values = torch.tensor([40, 0, 5, 17])  # (in another order, with a token nobody takes)
    fed = runners[1].forward([0, 1, 2], [[0]] * 3, fed=FedTokens(values, [2, 3, 0])).logits
    torch.testing.assert_close(fed, host)
    with pytest.raises(ValueError, match="fed tokens"):
        runners[1].forward([0, 1], [[0, 1], [0]], fed=FedTokens(values, [0, 1]))


def test_fed_tokens_laid_out_on_the_device_or_the_host_score_the_same(target, monkeypatch):
    """Every slot fed: the step's layout is written on the device (a fed-chains forward of
    width 1), a row the kernels marked invalid (negative) fed as id 0; a slot given from the
    host, or a lone sequence whose rows are one run of the pool, takes the host's layout. Each
    way, the logits are those of the same tokens given from the host, step after step."""
    from engine.runner.executor import Executor

    run = Executor.run
    chained = []  # (per forward: whether its layout was written on the device)

    def counted(self, inputs, *args, chains=None, **kwargs):
        chained.append(chains is not None)
        return run(self, inputs, *args, chains=chains, **kwargs)

    monkeypatch.setattr(Executor, "run", counted)
    runners = [ModelRunner(target.to("cpu"), 4, 256, 64) for _ in range(2)]
    contexts = prompts(3, seed=8)
    for runner in runners:
        for context in contexts:
            runner.forward([runner.allocate_slot()], [context])
    rng = random.Random(2)
    for step in range(4):  # (all fed, one from the host, a lone run, an invalid row)
        if step == 2:  # (a lone sequence whose rows are one run: a fresh slot's)
            for runner in runners:
                runner.forward([runner.allocate_slot()], [prompts(1, seed=9)[0]])
        slots = [[0, 1, 2], [0, 1, 2], [3], [0, 2]][step]
        nxt = [rng.randrange(1, VOCAB) for _ in slots]
        sources = [[2, 0, 1], [1, -1, 0], [0], [1, 0]][step]
        values = torch.tensor([nxt[sources.index(i)] if i in sources else -3
                               for i in range(max(sources) + 1)])
        if step == 3:  # (slot 2's token marked invalid: fed as 0)
            values[0], nxt[1] = -1, 0
        given = [[t] for t in nxt]
        chained.clear()
        host = runners[0].forward(slots, given).logits
        assert chained == [False]
        fed_given = [[t if s < 0 else 0] for t, s in zip(nxt, sources, strict=True)]
        fed = runners[1].forward(slots, fed_given, fed=FedTokens(values, sources)).logits
        assert chained[1:] == [step in (0, 3)]
        torch.testing.assert_close(fed, host)
    chained.clear()  # (slot 1 alone, its rows no longer one run: laid out on the device)
    assert runners[1]._slots.run_start(1) is None
    runners[1].forward([1], [[0]], fed=FedTokens(torch.tensor([7]), [0]))
    assert chained == [True]


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_logits_in_flight_fail_their_request_alone(device):
    """A model whose embedding of token 9 is NaN: a prompt holding it gets NaN logits in an
    overlapped step (on CUDA its token is marked invalid on the device and must not be fed as
    an input id); that request fails, the others equal the synchronous engine's output."""
    poisoned = tiny_model("llama", vocab_size=VOCAB, seed=0)
    with torch.no_grad():
        poisoned.get_input_embeddings().weight[9] = float("nan")
    batch = [[5, 6, 7, 8], [5, 9, 6], [4, 3, 2]]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = outputs(make_llm(poisoned, False, device), batch, [params] * 3)
    llm = make_llm(poisoned, True, device)
    got = outputs(llm, batch, [params] * 3)
    assert got[1][0][2] == "error" and got[0] == expected[0] and got[2] == expected[2]
    assert_engine_empty(llm)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the default is on for CUDA only")
def test_an_engine_overlaps_on_cuda_by_default(target):
    assert make_llm(target, None, "cuda").llm_engine.overlap
    assert not make_llm(target, None, "cpu").llm_engine.overlap


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="sampling is replayed from CUDA graphs on CUDA only")
def test_sampled_flights_replay_their_sampling_and_keep_seeded_output(target, monkeypatch):
    """Seeded sampled requests with top-k, top-p and min-p (greedy ones beside them), arriving
    and finishing at different steps: their flights' sampling replays CUDA graphs
    (``samplers.sampled_chains``), and the output is that of the same engine sampling through
    the sampler's own calls, token for token (keyed samples: the same numbers whatever the
    batch or the path)."""
    batch = prompts(8, seed=11)
    params = [SamplingParams(temperature=0.8, top_p=0.8, seed=5, max_tokens=26, ignore_eos=True),
              SamplingParams(temperature=1.1, top_k=7, seed=6, max_tokens=30, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=22, ignore_eos=True),
              SamplingParams(temperature=0.7, min_p=0.1, top_k=20, seed=7, max_tokens=18,
                             stop_token_ids=[9]),
              SamplingParams(temperature=0.9, top_p=0.9, min_p=0.05, seed=8, max_tokens=30,
                             ignore_eos=True, n=2)] * 2
    arrivals = [0, 0, 0, 0, 0, 4, 7, 7, 12, 15]
    batch = batch + batch[:2]
    eager = make_llm(target, True, "cuda", max_num_seqs=8)
    eager.llm_engine._sampled_chains = None  # (the sampler's own call, the same forwards)
    expected = outputs(eager, batch, params, arrivals)
    llm = make_llm(target, True, "cuda", max_num_seqs=8)
    launches = Launches(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, params, arrivals) == expected
    assert launches.count > 20
    assert llm.llm_engine._sampled_chains.graphs.num_replays > 20
    assert_engine_empty(llm)


def test_async_scheduling_is_checked():
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(model="x", async_scheduling="yes")
    with pytest.raises(ValueError, match="async_scheduling.*tensor_parallel_size"):
        EngineConfig(model="x", async_scheduling=True, tensor_parallel_size=2)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, target):
    from tests.engine.llm_helpers import random_head_dir

    return random_head_dir(tmp_path_factory, target.config)


@pytest.mark.parametrize("method", ["ngram", "eagle", "draft_model"])
def test_a_speculative_engine_overlaps_its_plain_steps_and_keeps_exact_output(
        target, head_dir, monkeypatch, method):
    """A controller that finds drafting dear (a fixed verification cost of 2 plain steps per
    token) plans plain steps, which overlap, and probes with drafting steps every few steps,
    which do not: greedy output and seeded samples equal plain decoding's, and a draft head fed
    through overlapped steps drafts from the right features (else its greedy output would
    still be right, but the exactness of the interleaving is what is checked here)."""
    from tests.engine.test_llm_greedy import noisy_copy

    spec = {"method": method, "num_speculative_tokens": 3, "adaptive_k": True,
            "verify_cost_per_token": 2.0, "draft_cost_ratio": 0.05,
            "adaptive_probe_interval": 3}
    if method == "eagle":
        spec["model"] = str(head_dir)
    if method == "draft_model":
        spec.update(model=noisy_copy(target.to("cpu"), 0.3, seed=1),
                    tokenizer=tiny_tokenizer(VOCAB))
    batch = prompts(5, seed=8)
    batch[1] = batch[1] * 3  # (repeated text: n-gram drafts it)
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=18, stop_token_ids=[7]),
              SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                             num_speculative_tokens=0),
              SamplingParams(temperature=0.9, seed=6, max_tokens=20, ignore_eos=True)]
    arrivals = [0, 0, 2, 5, 9]
    expected = outputs(make_llm(target, False, max_num_seqs=8), batch, params, arrivals)
    llm = make_llm(target, True, speculative_config=spec, max_num_seqs=8)
    launches = Launches(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, params, arrivals) == expected
    assert launches.count > 5 and llm.llm_engine.metrics.num_drafted > 0
    assert_engine_empty(llm)
    # one request alone under a scripted plan (drafts at every fourth step, plain steps
    # between: the measured controller's plans follow the clock): the drafts it verified and
    # their acceptance must equal the synchronous engine's (the proposer saw the same text, a
    # head the same features, through the overlapped steps; a head drafts the steps after
    # plain flights on the device, and so does n-gram, which drafts the newest token where
    # nothing matched, a step the host would have made plain)
    lone = [batch[1]], [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)]
    proposed = []
    unmatched = []  # (n-gram: device lookups that found nothing, and drafted the newest token)
    if method == "ngram":
        import proposers.ngram_device as ngram_device

        def counted(*args, _lookup=ngram_device.lookup_ngrams):
            drafts, found = _lookup(*args)
            unmatched.extend(d for d, f in zip(drafts.tolist(), found.tolist(), strict=True)
                             if not f)
            return drafts, found

        monkeypatch.setattr(ngram_device, "lookup_ngrams", counted)
    for overlap in (False, True):
        engine = make_llm(target, overlap, speculative_config={**spec, "adaptive_k": False},
                          max_num_seqs=8).llm_engine

        def scripted(running, waiting, _plan=engine.controller.plan):
            plan = _plan(running, waiting)
            return DraftPlan(3 if plan.step % 4 == 0 else 0, plan.step)

        monkeypatch.setattr(engine.controller, "plan", scripted)
        drafts: list[list[int]] = []
        for sampler in {engine.sampler, engine.greedy_sampler} - {None}:

            def logged(logits, metadata, *args, _verify=sampler.verify, _drafts=drafts):
                ids = iter(metadata.draft_token_ids.tolist())
                _drafts.extend(d for n in metadata.num_draft_tokens
                               if (d := [next(ids) for _ in range(n)]))
                return _verify(logits, metadata, *args)

            monkeypatch.setattr(sampler, "verify", logged)
        outputs(LLMOf(engine), *lone)
        proposed.append((drafts, engine.metrics.num_accepted))
    if unmatched:  # (the host drafts nothing there: a plain step)
        rest, wanted = [], iter(proposed[0][0])
        nxt = next(wanted, None)
        for d in proposed[1][0]:  # (the host's drafts in order; the others unmatched lookups')
            if d == nxt:
                nxt = next(wanted, None)
            else:
                rest.append(d)
                assert d in unmatched
                unmatched.remove(d)
        assert nxt is None and len(rest) < len(proposed[0][0])
        proposed[1] = (proposed[0][0], proposed[1][1])
    assert proposed[0] == proposed[1] and proposed[0][0]


def test_prefix_caching_keeps_what_overlapped_steps_committed(target):
    """A sequence leaves its committed tokens' rows to the prefix cache, not the row the step
    in flight wrote past its stop: a later prompt that starts with an earlier output is served
    from the cache and decodes as without one."""
    batch = prompts(3, seed=9)
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[7, 19])
    expected = outputs(make_llm(target, False), batch, [params] * 3)
    llm = make_llm(target, True, enable_prefix_caching=True)
    assert outputs(llm, batch, [params] * 3) == expected
    # each prompt again, followed by its output: the cache serves all but the newest tokens
    again = [p + out[0][0] for p, out in zip(batch, expected, strict=True)]
    want = outputs(make_llm(target, False), again, [params] * 3)
    got = llm.generate(again, params, use_tqdm=False)
    assert [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs]
            for o in got] == want
    assert all(o.num_cached_tokens and o.num_cached_tokens >= len(p) - 1
               for o, p in zip(got, batch, strict=True))
    assert llm.llm_engine._in_flight is None and not llm.llm_engine.has_work()


def test_a_proposer_keeping_text_sees_overlapped_steps(target):
    """Suffix decoding keeps each request's text for later requests up to its last look at it:
    overlapped plain steps show it the text in their shadow (``Proposer.observe``), so a
    request whose steps all overlapped leaves nearly all its text, as a synchronous engine's."""
    spec = {"method": "suffix", "num_speculative_tokens": 3, "adaptive_k": True,
            "verify_cost_per_token": 2.0}  # (drafting never pays: every step is plain)
    held = []
    for overlap in (False, True):
        llm = make_llm(target, overlap, speculative_config=spec, max_num_seqs=8)
        engine = llm.llm_engine
        engine.forward_is_async = True  # (as on CUDA: plain steps show the proposer the text)
        prompt = prompts(1, seed=10)[0]
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40,
                                                    ignore_eos=True), use_tqdm=False)[0]
        store = engine.proposer.store
        held.append(sum(len(store._tokens[sid]) for sid in store._ids.values()))
        context = len(prompt) + len(out.outputs[0].token_ids)
        assert held[-1] >= context - engine.proposer.observe_every
    assert held[1] >= held[0] - 1


def test_a_flight_costs_the_controller_its_period_not_only_its_kernels(target, monkeypatch):
    """A flight launched ahead is priced at the pipeline's period (the call that commits it and
    launches the next), at least its device time: where the host is the bottleneck, its kernels'
    time alone made plain steps look cheaper next to drafting ones than they were. Here the
    device's clock is made to say that every flight's kernels took a nanosecond."""
    from engine.overlap import InFlight

    monkeypatch.setattr(InFlight, "device_seconds", lambda self: 1e-9)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "adaptive_k": True}
    llm = make_llm(target, True, speculative_config=spec, max_num_seqs=4)
    engine = llm.llm_engine
    launches = Launches(monkeypatch, engine)
    costs = []
    learn = engine.controller.learn

    def recording(outcome, defer=False):
        if outcome.timing is not None:
            costs.append(outcome.timing.step_s)
        return learn(outcome, defer)

    monkeypatch.setattr(engine.controller, "learn", recording)
    steady = []  # per committed flight: launched ahead, committed while the next one flies
    commit = engine._commit_flight

    def committing(flight, start):
        steady.append(flight.ahead and engine._in_flight is not None)
        return commit(flight, start)

    monkeypatch.setattr(engine, "_commit_flight", committing)
    batch = prompts(3, seed=4)
    batch[0] = batch[0] * 3  # (repeated text: n-gram drafts it)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    assert launches.count > 5 and steady.count(True) > 5
    # only a flight that was not in a steady pipeline reads the device's time alone (a CPU
    # step takes far longer than the nanosecond)
    assert sum(c <= 1e-6 for c in costs) <= steady.count(False)
    assert sum(c > 1e-6 for c in costs) >= 5
    assert_engine_empty(llm)


def test_plain_flights_point_no_cells_and_send_no_layout_while_the_batch_stays(target,
                                                                             monkeypatch):
    """A batch decoding plainly flight after flight: each step's layout is written on the
    device from the flight's tokens and the positions, into spare rows pointed at when a slot
    last took rows, so most steps point no slot-table cell and send no layout (the last
    step's device copy serves again); the output is the synchronous engine's."""
    from engine.runner.executor import Executor

    batch = prompts(6, seed=33)
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 6
    expected = outputs(make_llm(target, False), batch, params)
    run, to_device = Executor.run, Executor.to_device
    copies = [0]
    steps = []  # (each fed forward: cells pointed, layouts copied)

    def counted_copy(self, values):
        copies[0] += 1
        return to_device(self, values)

    def counted(self, inputs, *args, chains=None, point=None, **kwargs):
        before = copies[0]
        out = run(self, inputs, *args, chains=chains, point=point, **kwargs)
        if chains is not None:
            steps.append((len(point[0]), copies[0] - before))
        return out

    llm = make_llm(target, True)
    launches = Launches(monkeypatch, llm.llm_engine)
    monkeypatch.setattr(Executor, "run", counted)
    monkeypatch.setattr(Executor, "to_device", counted_copy)
    assert outputs(llm, batch, params) == expected
    assert launches.count >= 30 and len(steps) == launches.count
    # (a slot points rows about once every spare_rows + 1 steps; a step pointing none of a
    # batch as the step before copies nothing)
    assert sum(cells > 0 for cells, _ in steps) <= len(steps) // 4
    assert sum(copied == 0 for _, copied in steps) >= len(steps) // 2
    assert_engine_empty(llm)
