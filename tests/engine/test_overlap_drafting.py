"""Overlapped drafting steps (``engine.overlap``, drafting flights): a greedy batch whose
proposer drafts on the device verifies each step there and launches the next one from the
verified tokens, before the host reads them. Output equals the plain engine's token for token,
through partial acceptance, stops found a step late, length limits, arrivals, aborts and steps
that cannot overlap; the KV rows reserved for the most a sequence can advance all come back."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from engine import LLM, SamplingParams
from proposers import Proposal, Proposer
from tests.conftest import tiny_model
from tests.engine.llm_helpers import random_head_dir, tiny_tokenizer
from tests.engine.test_overlap import DEVICES, assert_engine_empty, outputs, prompts

VOCAB = 48
K = 3


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=3)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, target):
    return random_head_dir(tmp_path_factory, target.config)


def wrong(position: int) -> bool:
    """The oracle's draft at this position is wrong (partial acceptance, at every length)."""
    return position % 5 == 0 or position % 7 == 3


class Oracle(Proposer):
    """Drafts the target's own greedy continuation (``greedy``: each prompt's, long enough),
    wrong where :func:`wrong` says, from the host (``propose``) and from a verification on the
    device (``draft_after``, which reads the device: a test may wait)."""

    needs_features = True
    drafts_are_free = True
    drafts_on_device = True

    def __init__(self, greedy: list[list[int]]) -> None:
        self.greedy = greedy
        self.full: dict[str | int, list[int]] = {}
        self.device_drafts = 0
        self.advanced: dict[str | int, int] = {}

    def _draft(self, full: list[int], position: int, n: int) -> list[int]:
        return [(full[p] + 1) % VOCAB if wrong(p) else full[p] if p < len(full) else 0
                for p in range(position, position + n)]

    def propose(self, requests):
        drafts = []
        for r in requests:
            if r.sampling_params.temperature > 0 and r.sampling_params.seed is None:
                drafts.append([0] * r.num_spec_tokens)  # (unseeded: any drafts are exact)
                continue
            full = self.full.get(r.req_id)
            if full is None:
                full = self.full[r.req_id] = next(
                    g for g in self.greedy if g[:len(r.token_ids)] == list(r.token_ids))
            assert full[:len(r.token_ids)] == list(r.token_ids)  # (the engine is exact)
            drafts.append(self._draft(full, len(r.token_ids), r.num_spec_tokens))
        return Proposal(drafts, None)

    def draft_after(self, req_ids, features, tokens, accepted, base, base_hi, steps):
        width = tokens.shape[1]
        assert features.shape[0] == len(req_ids) * width
        assert all(int(b) <= hi for b, hi in zip(base, base_hi, strict=True))
        self.device_drafts += 1
        # (the bonus token sits at base + accepted + 1: the next drafts follow it)
        return torch.tensor([self._draft(self.full[r], int(b) + int(a) + 2, steps)
                             for r, b, a in zip(req_ids, base, accepted, strict=True)],
                            device=tokens.device)

    def ready_on_device(self, req_id, num_tokens):
        return req_id in self.full  # (proposed for once: its continuation is known)

    def flush(self, req_ids, contexts):
        pass

    def advance(self, req_id, length, features, row, token):
        full = self.full[req_id]
        assert full[length] == token and 0 <= row < features.shape[0]
        self.advanced[req_id] = length


def oracle_llm(target, head_dir, greedy, device="cpu", k: int = K) -> tuple[LLM, Oracle]:
    llm = LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
              async_scheduling=True, max_num_seqs=8,
              speculative_config={"method": "eagle", "model": str(head_dir),
                                  "num_speculative_tokens": k, "adaptive_k": False})
    oracle = Oracle(greedy)
    llm.llm_engine.proposer = oracle
    return llm, oracle


class Chained:
    """Counts drafting flights launched from the device (``_launch_chained`` answers)."""

    def __init__(self, monkeypatch, engine) -> None:
        self.count = 0
        launch = engine._launch_chained

        def counted(*args):
            nxt = launch(*args)
            self.count += nxt is not None
            return nxt

        monkeypatch.setattr(engine, "_launch_chained", counted)


def greedy_continuations(target, batch, device, params=None) -> list[list[int]]:
    """Each prompt with the plain engine's continuation of 60 tokens: greedy, or as
    ``params[i]`` samples it (seeded: the same tokens in any batch, at any step)."""
    plain = LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
                async_scheduling=False)
    params = [replace(p, max_tokens=60, ignore_eos=True, stop=None, stop_token_ids=None)
              for p in params or [SamplingParams(temperature=0.0)] * len(batch)]
    outs = plain.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    return [p + list(o.outputs[0].token_ids) for p, o in zip(batch, outs, strict=True)]


# requests whose stops land inside drafting flights: a stop token, a stop string, EOS,
# max_tokens of every remainder; greedy, and seeded samples (top-k, top-p: their drafts are
# verified by matching their keyed samples, at output positions moved on on the device)
GREEDY = [
    SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[7, 19]),
    SamplingParams(temperature=0.0, max_tokens=30, stop=["w5 w", "w3"], ignore_eos=True),
    SamplingParams(temperature=0.8, seed=11, top_k=12, max_tokens=26),
    SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
    SamplingParams(temperature=1.0, seed=3, top_p=0.9, max_tokens=17, ignore_eos=True),
]


@pytest.mark.parametrize("k", [1, K])  # (one draft: the drafts a strided column of the chains)
@pytest.mark.parametrize("device", DEVICES)
def test_drafting_flights_equal_plain_decoding(target, head_dir, monkeypatch, device, k):
    batch = prompts(6, seed=21)
    greedy = greedy_continuations(target, batch, device, GREEDY)
    expected = outputs(LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB),
                           device=device, async_scheduling=False), batch, GREEDY)
    llm, oracle = oracle_llm(target, head_dir, greedy, device, k)
    chained = Chained(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, GREEDY) == expected
    metrics = llm.llm_engine.metrics
    assert chained.count >= 5 and oracle.device_drafts >= chained.count
    assert 0 < metrics.num_accepted < metrics.num_drafted  # (partial acceptance)
    assert {"s3#0", "s5#0"} <= set(oracle.advanced)  # (the seeded samples' flights)
    assert_engine_empty(llm)
    # staggered arrivals (each one ends the flights: its prefill runs from the host)
    params = [*GREEDY[:4], SamplingParams(temperature=0.8, seed=5, max_tokens=20,
                                          ignore_eos=True), GREEDY[5]]
    greedy = greedy_continuations(target, batch, device, params)
    arrivals = [0, 0, 3, 8, 12, 20]
    expected = outputs(LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB),
                           device=device, async_scheduling=False), batch, params, arrivals)
    llm, oracle = oracle_llm(target, head_dir, greedy, device, k)
    chained = Chained(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, params, arrivals) == expected
    assert chained.count >= 3
    assert_engine_empty(llm)


@pytest.mark.parametrize("device", DEVICES)
def test_a_greedy_batch_shrinking_in_flight_reuses_its_sizes_greedy_tensors(target, head_dir,
                                                                           monkeypatch, device):
    """A greedy batch whose requests end at different steps: each drafting flight launched
    from chains for fewer sequences than the flight before takes the greedy sampling tensors
    of that many (made once a size), so a second run of the same batch selects none on the
    device; the output equals plain decoding's both times."""
    from samplers import SamplingTensors

    batch = prompts(6, seed=41)
    params = [GREEDY[0], GREEDY[1], GREEDY[2], GREEDY[4],
              SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=18, ignore_eos=True)]
    greedy = greedy_continuations(target, batch, device, params)
    expected = outputs(LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB),
                           device=device, async_scheduling=False), batch, params)
    llm, _ = oracle_llm(target, head_dir, greedy, device)
    engine = llm.llm_engine
    shrinks, selects = [], []
    sampling_of, select = engine._sampling_of, SamplingTensors.select

    def counted_sampling_of(*args):
        shrinks.append(len(args[1]))
        out = sampling_of(*args)
        assert out.batch_size == len(args[1]) and out.all_greedy and not out.needs_filters
        return out

    def counted_select(self, *args):
        selects.append(len(args[0]))
        return select(self, *args)

    monkeypatch.setattr(engine, "_sampling_of", counted_sampling_of)
    monkeypatch.setattr(SamplingTensors, "select", counted_select)
    assert outputs(llm, batch, params) == expected
    first = list(shrinks)
    assert len(set(first)) >= 2 and selects and set(selects) <= set(first)
    shrinks.clear()
    selects.clear()
    assert outputs(llm, batch, params) == expected
    assert sorted(shrinks) == sorted(first) and selects == []  # (every size's tensors made)
    assert_engine_empty(llm)


def with_logprobs(llm: LLM, batch, params, arrivals=None) -> list[tuple]:
    """Each request's tokens, finish and logprob entries (every listed value and rank), and
    its cumulative logprob."""
    from tests.engine.llm_helpers import staggered_outputs

    outs = staggered_outputs(llm, batch, params, arrivals or [0] * len(batch))
    return [(c.token_ids, c.finish_reason, c.logprobs, c.cumulative_logprob)
            for out in outs for c in out.outputs]


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.parametrize("device", DEVICES)
def test_drafting_flights_give_the_logprobs_of_synchronous_steps(target, head_dir, monkeypatch,
                                                                  device, mode):
    """Requests with logprobs (greedy, and seeded samples with top-k or top-p, beside requests
    without) verify in drafting flights, their logprob facts gathered on the device for every
    row of their chains: the tokens and each kept token's entry (its value, rank and the best
    ones) equal those of the same engine stepping synchronously, whose steps verify the same
    drafts (the oracle's), through partial acceptance and stops inside a chain."""
    batch = prompts(6, seed=31)
    params = [replace(GREEDY[0], logprobs=3), replace(GREEDY[1], logprobs=0), GREEDY[2],
              replace(GREEDY[3], logprobs=2), GREEDY[4], replace(GREEDY[5], logprobs=4)]
    greedy = greedy_continuations(target, batch, device, params)
    arrivals = [0, 0, 0, 2, 5, 5]

    def oracle_engine(overlap: bool) -> tuple[LLM, Oracle]:
        llm = LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
                  async_scheduling=overlap, max_num_seqs=8, logprobs_mode=mode,
                  speculative_config={"method": "eagle", "model": str(head_dir),
                                      "num_speculative_tokens": K, "adaptive_k": False})
        oracle = Oracle(greedy)
        llm.llm_engine.proposer = oracle
        return llm, oracle

    expected = with_logprobs(oracle_engine(False)[0], batch, params, arrivals)
    llm, oracle = oracle_engine(True)
    chained = Chained(monkeypatch, llm.llm_engine)
    got = with_logprobs(llm, batch, params, arrivals)
    # (the two engines batch differently at some steps, and a forward's rows may round in
    # their last bits with the batch: values agree to float32 rounding, all else exactly)
    for (tokens, finish, entries, total), (want_tokens, want_finish, want_entries,
                                          want_total) in zip(got, expected, strict=True):
        assert (tokens, finish) == (want_tokens, want_finish)
        assert (entries is None) == (want_entries is None)
        if entries is None:
            continue
        assert len(entries) == len(tokens) == len(want_entries)
        for entry, want in zip(entries, want_entries, strict=True):
            assert {t: (e.rank, e.decoded_token) for t, e in entry.items()} == {
                t: (e.rank, e.decoded_token) for t, e in want.items()}
            assert all(abs(entry[t].logprob - want[t].logprob) < 1e-4 for t in entry)
        assert total == pytest.approx(want_total, abs=1e-3)
    assert chained.count >= 5
    metrics = llm.llm_engine.metrics
    assert 0 < metrics.num_accepted < metrics.num_drafted  # (partial acceptance)
    listed = [entries for _, _, entries, _ in got if entries is not None]
    assert len(listed) == 4 and all(listed)
    assert any(len(position) > 2 for entries in listed for position in entries)  # (top-n)
    assert_engine_empty(llm)


# penalties, bias, allowed ids, a one-token bad word and a min_tokens (of stop tokens) that ends
# early, beside
# a request without adjustments; greedy and seeded samples; with and without logprobs
PENALIZED = [
    SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True, repetition_penalty=1.3),
    SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[7], frequency_penalty=0.5,
                   presence_penalty=0.3, logprobs=2),
    SamplingParams(temperature=0.8, seed=11, top_k=12, max_tokens=26, repetition_penalty=1.2,
                   logit_bias={3: 2.0, 9: -1.0}, logprobs=3),
    SamplingParams(temperature=0.0, max_tokens=25, stop_token_ids=[5, 11, 17, 23],
                   min_tokens=9, frequency_penalty=0.4),
    SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
    SamplingParams(temperature=1.0, seed=3, top_p=0.9, max_tokens=27, ignore_eos=True,
                   allowed_token_ids=list(range(8, 40)), presence_penalty=0.6,
                   bad_words=["w9"]),
]


@pytest.mark.parametrize(("mode", "plain_every"), [("raw_logprobs", 0),
                                                   ("processed_logprobs", 0),
                                                   ("raw_logprobs", 3)])
@pytest.mark.parametrize("device", DEVICES)
def test_penalized_requests_verify_in_drafting_flights(target, head_dir, monkeypatch, device,
                                                        mode, plain_every):
    """Requests with penalties, bias, allowed ids and bad words verify in drafting flights,
    each chain row adjusted on the device from its slot's counts and the drafts before it,
    the kept tokens counted there: tokens, finish and logprobs equal those of the same engine
    stepping synchronously over the same drafts (the oracle's), through partial acceptance,
    stops inside a chain and a min_tokens that holds the first steps back (masked in the
    chains by where they sit on the device). ``plain_every``:
    every such step of the overlapped engine plans no drafts (a plain flight fed from chains,
    its counts the chains' on the device; chains fed from a plain flight's token)."""
    from scheduler import DraftPlan

    batch = prompts(6, seed=41)
    greedy = greedy_continuations(target, batch, device, PENALIZED)
    arrivals = [0, 0, 0, 2, 5, 5]

    def oracle_engine(overlap: bool) -> LLM:
        llm = LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
                  async_scheduling=overlap, max_num_seqs=8, logprobs_mode=mode,
                  speculative_config={"method": "eagle", "model": str(head_dir),
                                      "num_speculative_tokens": K, "adaptive_k": False})
        llm.llm_engine.proposer = Oracle(greedy)
        return llm

    expected = with_logprobs(oracle_engine(False), batch, PENALIZED, arrivals)
    llm = oracle_engine(True)
    chained = Chained(monkeypatch, llm.llm_engine)
    if plain_every:
        plan = llm.llm_engine.controller.plan

        def scripted(running, waiting):
            planned = plan(running, waiting)
            return DraftPlan(0 if planned.step % plain_every == 0 else K, planned.step)

        monkeypatch.setattr(llm.llm_engine.controller, "plan", scripted)
    adjusted = []
    apply_chains = llm.llm_engine.slot_adjustments.apply_chains

    short = []  # (chains of a sequence whose min_tokens was ahead of its committed output)

    def spied(logits, rows, drafts, fed=None, base=None):
        adjusted.append((len(rows), fed is not None, rows[0].holds is not None))
        short.append(any(r.adjuster.min_tokens_ids and len(r.output) < r.adjuster.params.min_tokens
                         for r in rows))
        return apply_chains(logits, rows, drafts, fed, base)

    monkeypatch.setattr(llm.llm_engine.slot_adjustments, "apply_chains", spied)
    apply, from_chains = llm.llm_engine.slot_adjustments.apply, []

    def spied_plain(logits, rows, fed=None, base=None):  # (plain steps fed from chains:
        from_chains.append(any(r.holds is not None for r in rows))  # their mark)
        return apply(logits, rows, fed, base)

    monkeypatch.setattr(llm.llm_engine.slot_adjustments, "apply", spied_plain)
    got = with_logprobs(llm, batch, PENALIZED, arrivals)
    for (tokens, finish, entries, total), (want_tokens, want_finish, want_entries,
                                          want_total) in zip(got, expected, strict=True):
        assert (tokens, finish) == (want_tokens, want_finish)
        assert (entries is None) == (want_entries is None)
        for entry, want in zip(entries or [], want_entries or [], strict=True):
            assert {t: e.rank for t, e in entry.items()} == {t: e.rank for t, e in want.items()}
            assert all(abs(entry[t].logprob - want[t].logprob) < 1e-4 for t in entry)
        if entries is not None:
            assert total == pytest.approx(want_total, abs=1e-3)
    assert chained.count >= (2 if plain_every else 5)
    # (chains fed from chains, and chains of several penalized sequences at once; after plain
    # flights, chains fed from their tokens)
    assert sum(holds for _, _, holds in adjusted) >= (2 if plain_every else 5)
    assert max(n for n, _, _ in adjusted) >= 3
    assert sum(fed for _, fed, _ in adjusted) >= (3 if plain_every else 0)
    assert sum(from_chains) >= (3 if plain_every else 0)
    assert sum(short) >= 2  # (min_tokens ahead: masked by the chains' positions on the device)
    metrics = llm.llm_engine.metrics
    assert 0 < metrics.num_accepted < metrics.num_drafted  # (partial acceptance)
    assert_engine_empty(llm)


def noisy_copy(target, scale: float = 0.5):
    """A draft model: the target with noise on its output head (its argmax agrees often, not
    always: partial acceptance)."""
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        weight = draft.lm_head.weight
        weight.add_(scale * weight.std()
                    * torch.randn(weight.shape, generator=gen).to(weight.device))
    return draft


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_draft_model_drafting_on_the_device_equals_plain_decoding(target, monkeypatch, device,
                                                                     method):
    """A draft model drafts its argmax drafts on the device after each verification (every
    request greedy or seeded under ``greedy`` drafts; the greedy ones under ``probabilistic``,
    whose drawn drafts are the argmax there): the output is the plain engine's, token for
    token, with staggered arrivals, and both runners end empty."""
    batch = prompts(6, seed=23)
    params = GREEDY if method == "greedy" else [p for p in GREEDY if p.temperature == 0.0]
    batch = batch[:len(params)]
    arrivals = [0, 0, 2, 5, 9, 14][:len(params)]
    plain = LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
                async_scheduling=False)
    for when in ([0] * len(params), arrivals):
        expected = outputs(plain, batch, params, when)
        llm = LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
                  async_scheduling=True, max_num_seqs=8,
                  speculative_config={"method": "draft_model", "model": noisy_copy(target),
                                      "tokenizer": tiny_tokenizer(VOCAB),
                                      "num_speculative_tokens": K, "adaptive_k": False,
                                      "draft_sample_method": method})
        engine = llm.llm_engine
        chained = Chained(monkeypatch, engine)
        assert outputs(llm, batch, params, when) == expected
        metrics = engine.metrics
        assert chained.count >= 3
        assert 0 < metrics.num_accepted < metrics.num_drafted  # (partial acceptance)
        assert_engine_empty(llm)
        draft_runner = engine.proposer.runner
        assert draft_runner.num_cached_tokens == 0
        assert draft_runner.num_free_slots == engine.config.max_num_seqs


def test_a_draft_model_keeps_adjusted_requests_drafting_from_the_host(target):
    """A draft model adjusts its drafts on the host with each request's penalties, bias and
    allowed ids (``adjust_logits``); its drafts on the device would not be. With a draft model
    that is the target itself, every draft of such requests is accepted overlapped as it is
    synchronously, and the output is the synchronous engine's."""
    batch = prompts(4, seed=23)
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, repetition_penalty=1.8),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, frequency_penalty=1.0,
                       presence_penalty=0.5),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True,
                       allowed_token_ids=list(range(20, 30))),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logit_bias={5: 5.0},
                       frequency_penalty=2.0),
    ]
    runs = []
    for overlap in (False, True):
        llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), async_scheduling=overlap,
                  speculative_config={"method": "draft_model", "model": noisy_copy(target, 0.0),
                                      "tokenizer": tiny_tokenizer(VOCAB),
                                      "num_speculative_tokens": K, "adaptive_k": False,
                                      "draft_sample_method": "greedy"})
        metrics = llm.llm_engine.metrics
        runs.append((outputs(llm, batch, params), metrics.num_accepted, metrics.num_drafted))
        assert_engine_empty(llm)
    (sync, *_), (got, accepted, drafted) = runs
    assert got == sync
    assert drafted >= 60 and accepted == drafted


def abort_in_a_chain(engine, monkeypatch, batch, max_tokens: int) -> dict:
    """Greedy requests ``r0 ...`` for ``batch``, ``r1`` aborted while a chain launched from the
    device is in flight (the second one), the rest run to their end: each request's sequence."""
    chained = Chained(monkeypatch, engine)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(batch):
        engine.add_request(f"r{i}", None, p, params)
    while chained.count < 2:
        engine.step()
    assert engine._in_flight is not None and engine._in_flight.chain is not None
    engine.abort_request("r1")
    while engine.has_work():
        engine.step()
    done = {f"r{i}": engine.pop_request(f"r{i}")[0] for i in range(len(batch))}
    assert done["r1"].finish_reason == "abort"
    return done


def test_a_draft_model_drafting_on_the_device_survives_aborts_and_preemption(target,
                                                                          monkeypatch):
    """A draft model's drafting flights with a KV pool too small for every request (some are
    preempted and come back) and a request aborted while its chain is in flight: the others
    end as plain decoding ends them, and both runners end empty."""
    batch = prompts(4, seed=31)
    greedy = greedy_continuations(target, batch, "cpu")
    llm = LLM(model=target.to("cpu"), tokenizer=tiny_tokenizer(VOCAB), device="cpu",
              async_scheduling=True, max_num_seqs=4, kv_cache_tokens=80, max_model_len=64,
              speculative_config={"method": "draft_model", "model": noisy_copy(target),
                                  "tokenizer": tiny_tokenizer(VOCAB),
                                  "num_speculative_tokens": K, "adaptive_k": False,
                                  "draft_sample_method": "greedy"})
    engine = llm.llm_engine
    done = abort_in_a_chain(engine, monkeypatch, batch, 36)
    for i in (0, 2, 3):
        assert done[f"r{i}"].output_token_ids == greedy[i][len(batch[i]):][:36]
    assert engine.metrics.num_preemptions > 0
    assert_engine_empty(llm)
    draft_runner = engine.proposer.runner
    assert draft_runner.num_cached_tokens == 0
    assert draft_runner.num_free_slots == engine.config.max_num_seqs


def test_an_abort_during_a_drafting_flight_frees_everything(target, head_dir, monkeypatch):
    batch = prompts(3, seed=5)
    greedy = greedy_continuations(target, batch, "cpu")
    llm, _ = oracle_llm(target, head_dir, greedy)
    engine = llm.llm_engine
    done = abort_in_a_chain(engine, monkeypatch, batch, 40)
    for rid in ("r0", "r2"):
        seq = done[rid]
        assert seq.output_token_ids == greedy[int(rid[1])][len(batch[int(rid[1])]):][:40]
    assert_engine_empty(llm)


def test_a_draft_head_drafts_on_the_device_what_it_drafts_from_the_host(target, head_dir):
    """The real head: a lone request's drafts in overlapped drafting steps are those the
    synchronous engine's proposals give (each from the same pairs), step for step."""
    batch = [prompts(2, seed=8)[1] * 3]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    logs = []
    for overlap in (False, True):
        llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), async_scheduling=overlap,
                  speculative_config={"method": "eagle", "model": str(head_dir),
                                      "num_speculative_tokens": K, "adaptive_k": False})
        engine, log = llm.llm_engine, []
        propose, after = engine.proposer.propose, engine.proposer.draft_after

        def proposed(requests, _propose=propose, _log=log):
            proposal = _propose(requests)
            _log.extend(list(d) for d in proposal.draft_token_ids if d)
            return proposal

        def drafted(*args, _after=after, _log=log):
            out = _after(*args)
            _log.extend(out.tolist())
            return out

        engine.proposer.propose, engine.proposer.draft_after = proposed, drafted
        llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        logs.append(log)
    sync, overlapped = logs
    assert len(sync) > 8 and overlapped[:len(sync) - 2] == sync[:-2]


@pytest.mark.parametrize("drafts_from", ["device", "host"])
def test_plain_flights_write_the_heads_pairs_on_the_device(target, head_dir, drafts_from):
    """The real head, plans of plain stretches then drafting: overlapped plain steps write
    their pairs into the head's cache on the device (``write_after``) instead of handing it
    their features on the host, and the drafts after them are the synchronous engine's at the
    same positions (its head got the same pairs through ``on_features``); output equals plain
    decoding's. ``host``: the drafting steps after plain flights are proposed from the host,
    whose head rewrites each sequence's newest pair from the feature row the flight's commit
    named (``Proposer.advance``)."""
    from scheduler import DraftPlan

    batch = [prompts(2, seed=8)[1] * 3, prompts(3, seed=2)[2]]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (50, 37)]
    expected = outputs(LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
                           async_scheduling=False), batch, params)
    logs, writes = [], []
    for overlap in (False, True):
        llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), async_scheduling=overlap,
                  speculative_config={"method": "eagle", "model": str(head_dir),
                                      "num_speculative_tokens": K, "adaptive_k": False})
        engine, log = llm.llm_engine, {}
        plan = engine.controller.plan

        def scripted(running, waiting, _plan=plan):  # (four plain steps, then drafting)
            planned = _plan(running, waiting)
            return DraftPlan(K if planned.step % 5 == 0 else 0, planned.step)

        engine.controller.plan = scripted
        if drafts_from == "host":
            engine._drafts_after_plain = lambda *args: False
        proposer = engine.proposer
        propose, after, write = proposer.propose, proposer.draft_after, proposer.write_after

        # each step's drafts by the position of its first draft (the requests' in order)
        def proposed(requests, _propose=propose, _log=log):
            proposal = _propose(requests)
            _log[tuple(len(r.token_ids) for r in requests)] = [
                list(d) for d in proposal.draft_token_ids]
            return proposal

        def drafted(ids, features, tokens, accepted, base, *args, _after=after, _log=log):
            out = _after(ids, features, tokens, accepted, base, *args)
            _log[tuple((base + accepted + 2).tolist())] = out.tolist()
            return out

        def written(req_ids, *args, _write=write):
            writes.append(len(req_ids))
            return _write(req_ids, *args)

        proposer.propose, proposer.draft_after, proposer.write_after = proposed, drafted, written
        assert outputs(llm, batch, params) == expected
        assert_engine_empty(llm)
        logs.append(log)
    sync, overlapped = logs
    # (a drafting flight drafts every request's k: the host asks a request near its end for
    # fewer, a prefix of those)
    cut = {p: [d[:len(s)] for d, s in zip(overlapped[p], sync[p], strict=True)]
           for p in sync if p in overlapped}
    assert len(sync) >= 8 and cut == sync
    assert len(writes) >= 20 and 2 in writes  # (both requests' pairs, most plain steps)


def test_a_failed_write_of_a_plain_flights_pairs_takes_nothing(target, head_dir):
    """``write_after`` raising when the step after a plain flight is launched: the step raises
    with nothing taken for the next step, the flight is committed by the next call, and the
    requests end as plain decoding's with the engine empty."""
    from scheduler import DraftPlan

    batch = prompts(3, seed=9)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    greedy = greedy_continuations(target, batch, "cpu")
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), async_scheduling=True,
              speculative_config={"method": "eagle", "model": str(head_dir),
                                  "num_speculative_tokens": K, "adaptive_k": False})
    engine = llm.llm_engine
    plan = engine.controller.plan
    engine.controller.plan = lambda running, waiting: DraftPlan(0, plan(running, waiting).step)
    write = engine.proposer.write_after
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected")
        return write(*args)

    engine.proposer.write_after = failing
    assert steps_through_one_raise(llm, batch, params, greedy) and len(calls) > 5


def steps_through_one_raise(llm: LLM, batch, params, greedy) -> bool:
    """Steps ``llm``'s engine through ``batch`` until done, whatever step raises
    RuntimeError; every request ends as plain decoding's (``greedy``, ``params.max_tokens``
    tokens) and the engine empty. Whether exactly one step raised."""
    engine = llm.llm_engine
    for i, p in enumerate(batch):
        engine.add_request(f"r{i}", None, p, params)
    raised = 0
    while engine.has_work():
        try:
            engine.step()
        except RuntimeError:
            raised += 1
    for i in range(len(batch)):
        seq = engine.pop_request(f"r{i}")[0]
        assert seq.output_token_ids == greedy[i][len(batch[i]):][:params.max_tokens]
    assert_engine_empty(llm)
    return raised == 1


def test_a_raise_while_the_engine_learns_still_commits_the_flight(target, head_dir, monkeypatch):
    """The controller's learning raising after the next step's launch (a drafting flight in
    flight at fixed k): the flight it follows is committed all the same, the call raises, the
    next call commits the step launched, and the requests end as plain decoding's with the
    engine empty (a flight dropped there would lose its tokens)."""
    batch = prompts(3, seed=9)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    greedy = greedy_continuations(target, batch, "cpu")
    llm, _ = oracle_llm(target, head_dir, greedy)
    engine = llm.llm_engine
    engine.forward_is_async = True  # (as on CUDA: a step's outcome is learnt at the next)
    chained = Chained(monkeypatch, engine)
    learn = engine.controller.learn
    calls = []

    def failing(outcome, defer=False):
        calls.append(defer)
        if calls.count(True) == 3 and defer:  # (an overlapped step's, after its launch)
            raise RuntimeError("injected")
        return learn(outcome, defer)

    engine.controller.learn = failing
    assert steps_through_one_raise(llm, batch, params, greedy)
    assert calls.count(True) > 5 and chained.count > 3


@pytest.mark.parametrize("device", DEVICES)
def test_a_plan_without_drafts_runs_a_plain_step_from_the_chains(target, head_dir, monkeypatch,
                                                                  device):
    """Plans that switch between drafting and plain steps: a plain step after a drafting flight
    is launched from its chains too (each sequence's recovered or bonus token, width one), its
    features handed to the head when it commits, and a drafting step after a plain flight from
    drafts made on the device from that flight; output equals plain decoding's."""
    from scheduler import DraftPlan

    batch = prompts(4, seed=13)
    params = [GREEDY[0], GREEDY[3], GREEDY[5], GREEDY[1]]
    greedy = greedy_continuations(target, batch, device, params)
    expected = outputs(LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB),
                           device=device, async_scheduling=False), batch, params)
    llm, oracle = oracle_llm(target, head_dir, greedy, device)
    engine = llm.llm_engine
    plan = engine.controller.plan

    def scripted(running, waiting):  # (two drafting steps, then two plain ones)
        planned = plan(running, waiting)
        return DraftPlan(K if planned.step % 4 < 2 else 0, planned.step)

    monkeypatch.setattr(engine.controller, "plan", scripted)
    plain_after_chains = []
    launch = engine._launch_chained

    def counted(flight, seqs, planned):
        nxt = launch(flight, seqs, planned)
        if nxt is not None and nxt.width == 1:
            plain_after_chains.append(nxt)
        return nxt

    monkeypatch.setattr(engine, "_launch_chained", counted)
    drafting_after_plain = []
    launch_drafting = engine._launch_drafting

    def drafting(flight, seqs, planned, k):
        nxt = launch_drafting(flight, seqs, planned, k)
        drafting_after_plain.append(nxt is not None)
        return nxt

    monkeypatch.setattr(engine, "_launch_drafting", drafting)
    assert outputs(llm, batch, params) == expected
    assert len(plain_after_chains) >= 3 and engine.metrics.num_accepted > 0
    assert sum(drafting_after_plain) >= 3  # (plain -> drafting without the host, too)
    assert_engine_empty(llm)


@pytest.mark.parametrize("device", DEVICES)
def test_each_drafting_flight_verifies_the_width_chosen_at_its_launch(target, head_dir,
                                                                      monkeypatch, device):
    """The controller chooses each drafting flight's width at its launch (``device_width``),
    scripted here to narrow, widen and stop flight after flight. Chains hold K drafts, so a
    flight launched from them verifies their first ``k``: every such flight verified the
    scripted width, and output equals plain decoding's (stops inside the flights, seeded
    samples)."""
    batch = prompts(6, seed=21)
    greedy = greedy_continuations(target, batch, device, GREEDY)
    expected = outputs(LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB),
                           device=device, async_scheduling=False), batch, GREEDY)
    llm, _ = oracle_llm(target, head_dir, greedy, device)
    launched = scripted_widths(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, GREEDY) == expected
    assert len(launched) >= 6 and all(width == k + 1 for k, width in launched), launched
    assert {0, 1, 2, 3} <= {k for k, _ in launched}  # (narrowed, widened, plain)
    assert_engine_empty(llm)


def scripted_widths(monkeypatch, engine) -> list[tuple[int, int]]:
    """The engine's drafting widths scripted (narrow, widen, none; within what its controller
    allows); returns, as flights are launched from chains, each one's (width chosen, width
    launched)."""
    script, chosen, launched = [3, 1, 2, 3, 1, 0, 2, 3, 3, 1], [], []
    device_width, launch = engine.controller.device_width, engine._launch_chained

    def scripted(seqs, plan, ahead=0):
        chosen.append(min(device_width(seqs, plan, ahead), script[len(chosen) % len(script)]))
        return chosen[-1]

    def counted(flight, seqs, plan):
        asked = len(chosen)
        nxt = launch(flight, seqs, plan)
        if nxt is not None and len(chosen) > asked:
            launched.append((chosen[-1], nxt.width))
        return nxt

    monkeypatch.setattr(engine.controller, "device_width", scripted)
    monkeypatch.setattr(engine, "_launch_chained", counted)
    return launched


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the head's graphs (a free proposer, verify_and_draft) need CUDA")
def test_the_heads_graphed_flights_verify_the_width_chosen_at_each_launch(target, head_dir,
                                                                          monkeypatch):
    """The real head with its CUDA graphs: greedy chains are verified inside its graph of the
    next chain (``verify_and_draft``), its chains hold K drafts, and each flight launched
    from them verifies the width scripted at its launch (narrowed, widened, none); output
    equals plain decoding's."""
    batch = prompts(6, seed=21)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
              for n in (23, 30, 9, 26, 17, 30)]
    expected = outputs(LLM(model=target.to("cuda"), tokenizer=tiny_tokenizer(VOCAB),
                           device="cuda", async_scheduling=False), batch, params)
    llm = LLM(model=target.to("cuda"), tokenizer=tiny_tokenizer(VOCAB), device="cuda",
              async_scheduling=True, max_num_seqs=8,
              speculative_config={"method": "eagle", "model": str(head_dir),
                                  "num_speculative_tokens": K, "adaptive_k": False})
    engine = llm.llm_engine
    assert engine.proposer.drafts_are_free  # (graphs: its chains hold K drafts)
    launched, fused = scripted_widths(monkeypatch, engine), []
    verify_and_draft = engine.proposer.verify_and_draft

    def graphed(*args):
        fused.append(1)
        return verify_and_draft(*args)

    monkeypatch.setattr(engine.proposer, "verify_and_draft", graphed)
    assert outputs(llm, batch, params) == expected
    assert len(launched) >= 6 and all(width == k + 1 for k, width in launched), launched
    assert {0, 1, 2, 3} <= {k for k, _ in launched} and len(fused) >= 6
    assert_engine_empty(llm)


@pytest.mark.parametrize("plain_every", [2, 3])
def test_a_stop_token_held_back_by_min_tokens_ends_where_the_host_ends_it(target, head_dir,
                                                                          monkeypatch,
                                                                          plain_every):
    """Requests whose stop token greedy decoding first reaches right at their ``min_tokens``
    (masking one row too many there ends them late), under plans that switch between drafting
    flights and plain steps fed from their chains: both mask by where each chain sits on the
    device (the host's output is short of the flight's kept tokens), and plain steps after
    chains run launched from them while a ``min_tokens`` is ahead. Each request stops where
    the synchronous engine stops it."""
    from scheduler import DraftPlan

    batch = prompts(3, seed=41)
    greedy = greedy_continuations(target, batch, "cpu")
    requests, params = [], []
    for prompt, full in zip(batch, greedy, strict=True):
        output = full[len(prompt):]
        for m in range(2, 16):
            if output[m] not in output[:m]:  # (its first time at output token m)
                requests.append(prompt)
                params.append(SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True,
                                             stop_token_ids=[output[m]], min_tokens=m))
    assert len(requests) >= 12
    expected = outputs(LLM(model=target, tokenizer=tiny_tokenizer(VOCAB),
                           async_scheduling=False), requests, params)
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), async_scheduling=True,
              max_num_seqs=64,
              speculative_config={"method": "eagle", "model": str(head_dir),
                                  "num_speculative_tokens": K, "adaptive_k": False})
    engine = llm.llm_engine
    engine.proposer = Oracle(greedy)
    plan = engine.controller.plan

    def scripted(running, waiting):
        planned = plan(running, waiting)
        return DraftPlan(0 if planned.step % plain_every == 0 else K, planned.step)

    monkeypatch.setattr(engine.controller, "plan", scripted)
    launched = []  # (drafting flights launched on the device, after plain ones or chains)
    plain_short = []  # (plain steps launched from chains while a min_tokens was ahead)

    def counting(launch):
        def counted(flight, seqs, *args):
            short = any(seq.num_output_tokens < seq.params.min_tokens for seq in seqs)
            nxt = launch(flight, seqs, *args)
            launched.append(nxt is not None and nxt.chain is not None)
            plain_short.append(short and flight.chain is not None and nxt is not None
                               and nxt.chain is None)
            return nxt
        return counted

    for name in ("_launch_drafting", "_launch_chained"):
        monkeypatch.setattr(engine, name, counting(getattr(engine, name)))
    assert outputs(llm, requests, params) == expected
    assert sum(launched) >= 3 and sum(plain_short) >= 2
    assert_engine_empty(llm)


def test_one_width_for_all_never_writes_past_the_context(target, head_dir, monkeypatch):
    """A request near ``max_model_len`` beside one with room, plans that switch: the width a
    drafting step after a plain flight takes (the most drafts any sequence may ask for) must
    not bring the other past the context; output equals plain decoding's."""
    from scheduler import DraftPlan

    batch = [(prompts(1, seed=3)[0] * 10)[:41], prompts(1, seed=4)[0]]  # (7 tokens of room)
    params = [SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)] * 2
    expected = outputs(LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_model_len=48,
                           async_scheduling=False), batch, params)
    greedy = greedy_continuations(target, batch, "cpu")
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), async_scheduling=True,
              max_num_seqs=8, max_model_len=48,
              speculative_config={"method": "eagle", "model": str(head_dir),
                                  "num_speculative_tokens": K, "adaptive_k": False})
    llm.llm_engine.proposer = Oracle(greedy)
    plan = llm.llm_engine.controller.plan

    def scripted(running, waiting):
        planned = plan(running, waiting)
        return DraftPlan(K if planned.step % 2 else 0, planned.step)

    monkeypatch.setattr(llm.llm_engine.controller, "plan", scripted)
    assert outputs(llm, batch, params) == expected
    assert_engine_empty(llm)


@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-bucket"])
def test_fed_chains_score_like_the_same_chains_from_the_host(target, graphs):
    """``ModelRunner.forward_chains``: each slot's chain at positions ``base[b] ...`` computed on
    the device (rows reserved up to ``base_hi[b]``, some sequences behind it) scores as the same
    tokens given from the host after the same context, padded to a graph bucket's layout or
    not; and the KV rows it wrote are the host forward's (the next step agrees too)."""
    from engine.runner import FedChains
    from engine.runner.model_runner import ModelRunner

    contexts = prompts(3, seed=9)
    chains = [[5, 17, 40], [8, 1, 2], [30, 31, 32]]
    runners = [ModelRunner(target.to("cpu"), 4, 256, 64) for _ in range(2)]
    if graphs:
        for runner in runners:
            runner.use_graph_buckets(4, capture=False)
    for runner in runners:
        slots = [runner.allocate_slot() for _ in contexts]
        runner.forward(slots, contexts)
    host = runners[0].forward([0, 1, 2], chains).logits  # [9, vocab]
    base = [len(c) for c in contexts]
    hi = [b + 2 for b in base]  # (the most base could have been: rows reserved past the chain)
    fed = runners[1].forward_chains([0, 1, 2], FedChains(torch.tensor(chains),
                                                         torch.tensor(base), hi))
    torch.testing.assert_close(fed.logits, host)
    assert [runners[1].seq_len(s) for s in range(3)] == [h + 3 for h in hi]
    for s, b in enumerate(base):  # (back to the chain's own rows, as a commit does)
        runners[1].truncate(s, b + 3)
    if graphs:  # the same chains again, into the layout of the bucket met before: the same
        again = runners[1].forward_chains([0, 1, 2], FedChains(torch.tensor(chains),
                                                               torch.tensor(base), hi))
        torch.testing.assert_close(again.logits, host)
        for s, b in enumerate(base):
            runners[1].truncate(s, b + 3)
    nxt = [[7], [9], [11]]
    torch.testing.assert_close(runners[1].forward([0, 1, 2], nxt).logits,
                               runners[0].forward([0, 1, 2], nxt).logits)
    with pytest.raises(ValueError, match="max_model_len"):
        runners[1].forward_chains([0], FedChains(torch.tensor([[1, 2]]), torch.tensor([62]),
                                                 [63]))


@pytest.mark.parametrize("fails_in", ["forward_chains", "forward"])
def test_rows_of_a_step_that_raised_are_not_kept_as_spare_rows(target, monkeypatch, fails_in):
    """A step that raises after taking its pool rows, before the executor points their
    slot-table cells (a fed-chains step, or a plain one from the host after fed-chains steps
    gave the slots spare rows), then the caller's rollback (``truncate``, as a flight's): no
    rows are lost, and the next fed-chains steps score as on a runner that never failed (rows
    kept as spare rows would be taken unpointed, their keys and values written through cells
    that point at other rows)."""
    from engine.runner import FedChains
    from engine.runner.model_runner import ModelRunner

    contexts = prompts(3, seed=13)
    runners = [ModelRunner(target.to("cpu"), 4, 256, 64) for _ in range(2)]
    for runner in runners:
        # (no spare rows taken ahead: the next step's rows are the ones the raise gave back)
        runner.spare_rows = 0
        slots = [runner.allocate_slot() for _ in contexts]
        runner.forward(slots, contexts)
    base = [len(c) for c in contexts]

    def chains(step: int):  # (each step's chains after the ones before: base moves on)
        at = [b + 3 * step for b in base]
        return FedChains(torch.tensor([[5 + step, 17, 40], [8, 1 + step, 2], [30, 31, 32]]),
                         torch.tensor(at), at)

    def commit(runner, step):
        for s, b in enumerate(base):
            runner.truncate(s, b + 3 * step + 3)

    for runner in runners:  # (a first fed step each: the slots hold a spare list)
        runner.forward_chains([0, 1, 2], chains(0))
        commit(runner, 0)
    free = runners[1].num_free_tokens
    lengths = [runners[1].seq_len(s) for s in range(3)]

    def injected(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(runners[1]._executor, "run", injected)
    with pytest.raises(RuntimeError, match="injected"):
        if fails_in == "forward_chains":
            runners[1].forward_chains([0, 1, 2], chains(1))
        else:  # (past the spare rows: fresh rows too)
            runners[1].forward([0, 1, 2], [[3] * 20, [4] * 20, [5] * 20])
    monkeypatch.undo()
    for s, length in enumerate(lengths):  # (the caller's rollback)
        runners[1].truncate(s, length)
    assert runners[1].num_free_tokens == free
    for step in (1, 2):
        torch.testing.assert_close(runners[1].forward_chains([0, 1, 2], chains(step)).logits,
                                   runners[0].forward_chains([0, 1, 2], chains(step)).logits)
        for runner in runners:
            commit(runner, step)


def test_fewer_chains_than_a_bucket_holds_leave_the_other_rows_alone(target):
    """Fewer chains than the bucket holds (three, then two, in a bucket of four): the rows
    past the chains keep the host's layout, so the third sequence's cache is not written from
    the chain it had before, and every sequence scores as on a runner fed from the host."""
    from engine.runner import FedChains
    from engine.runner.model_runner import ModelRunner

    contexts = prompts(3, seed=11)
    runners = [ModelRunner(target.to("cpu"), 4, 256, 64) for _ in range(2)]
    runners[1].use_graph_buckets(4, capture=False)
    for runner in runners:
        slots = [runner.allocate_slot() for _ in contexts]
        runner.forward(slots, contexts)
    chains = [[5, 17, 40], [8, 1, 2], [30, 31, 32]]
    base = [len(c) for c in contexts]
    for _ in range(2):  # (met twice: the graph's static buffers hold all three chains)
        runners[1].forward_chains([0, 1, 2], FedChains(torch.tensor(chains), torch.tensor(base),
                                                       base))
        for s, b in enumerate(base):
            runners[1].truncate(s, b)
    # two chains: slots 0 and 1 only, through the same graph (a bucket of four)
    fed = runners[1].forward_chains([0, 1], FedChains(torch.tensor(chains[:2]),
                                                      torch.tensor(base[:2]), base[:2]))
    torch.testing.assert_close(fed.logits, runners[0].forward([0, 1], chains[:2]).logits)
    assert runners[1].seq_len(2) == base[2]
    # the third sequence's cache is untouched: its next tokens score as on the host's runner
    nxt = [[7], [9], [11]]
    runners[1].forward([2], [chains[2]])
    runners[0].forward([2], [chains[2]])
    torch.testing.assert_close(runners[1].forward([0, 1, 2], nxt).logits,
                               runners[0].forward([0, 1, 2], nxt).logits)


@pytest.mark.parametrize("device", DEVICES)
def test_drafting_flights_take_spare_rows_and_reuse_their_layout(target, head_dir, monkeypatch,
                                                                device):
    """A batch drafting flight after flight: each slot's fed-chains rows come with spare ones
    (``ModelRunner.spare_rows``), pointed once, so most flights point no slot-table cell and
    send no layout to the device (the last flight's device copy serves again); the output
    equals plain decoding's with spare rows and without, and without them most flights point
    cells and copy their layout (but where the rows a rollback gave back serve again)."""
    from engine.runner.executor import Executor

    batch = prompts(6, seed=31)
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 6
    greedy = greedy_continuations(target, batch, device, params)
    expected = outputs(LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB),
                           device=device, async_scheduling=False), batch, params)
    run, to_device = Executor.run, Executor.to_device
    copies = [0]

    def counted_copy(self, values):
        copies[0] += 1
        return to_device(self, values)

    for spare in (16, 0):
        llm, _ = oracle_llm(target, head_dir, greedy, device)
        llm.llm_engine.runner.spare_rows = spare
        chained = Chained(monkeypatch, llm.llm_engine)
        flights = []  # (each fed-chains forward: (cells pointed, layouts copied))

        def counted(self, inputs, *args, chains=None, point=None, flights=flights, **kwargs):
            before = copies[0]
            out = run(self, inputs, *args, chains=chains, point=point, **kwargs)
            if chains is not None:
                flights.append((len(point[0]), copies[0] - before, len(chains.base_hi)))
            return out

        monkeypatch.setattr(Executor, "run", counted)
        monkeypatch.setattr(Executor, "to_device", counted_copy)
        assert outputs(llm, batch, params) == expected
        monkeypatch.setattr(Executor, "run", run)
        monkeypatch.setattr(Executor, "to_device", to_device)
        assert chained.count >= 10 and len(flights) == chained.count
        pointing = sum(cells > 0 for cells, _, _ in flights)
        assert all(copied == 1 for cells, copied, _ in flights if cells)
        if spare:  # (a slot runs out of spare rows about every spare / (k + 1) flights; a
            # flight of the batch before's pointing none copies nothing)
            assert pointing <= len(flights) // 2
            assert all(copied == 0 for (cells, copied, n), (_, _, m) in zip(
                flights[1:], flights, strict=False) if not cells and n == m)
        else:  # (only rows a rollback gave back serve again)
            assert pointing > len(flights) // 2
        assert_engine_empty(llm)
