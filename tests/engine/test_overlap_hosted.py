"""Overlapped steps for samples whose logits need the host (``engine.overlap.Pending``): under
a grammar, or with penalties, bias, bad words or min_tokens. The next step's forward is launched
from the flight's tokens on the device before the flight is committed; once it is, the host
masks and adjusts the next step's logits and the device samples them. Output equals the
synchronous engine's token for token (greedy and seeded), through stops found a step late,
forced grammar tokens, arrivals, aborts and a step that raised; sampled output follows the
masked distribution (tests/engine/test_structured_distribution.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.overlap import InFlight, Pending
from samplers.slot_adjustments import Adjusted
from tests.engine.llm_helpers import staggered_outputs
from tests.engine.structured_helpers import EOS_ID, char_tokenizer
from tests.engine.test_llm_structured import CASES, PROMPTS, SCHEMA, valid_json
from tests.engine.test_overlap import DEVICES, assert_engine_empty

VOCAB = 128


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0, eos_token_id=EOS_ID)


def make_llm(target, overlap: bool, device: str = "cpu", **kwargs) -> LLM:
    return LLM(model=target.to(device), tokenizer=char_tokenizer(), device=device,
               max_model_len=256, async_scheduling=overlap, **kwargs)


class PendingLaunches:
    """Counts the steps an engine launched ahead whose sampling waited for the commit before
    them (its ``_launch_next`` answers that were :class:`Pending`: ``count``) and those it
    sampled at once (``ahead``)."""

    def __init__(self, monkeypatch, engine) -> None:
        self.count = self.ahead = 0
        launch = engine._launch_next

        def counted(flight):
            nxt = launch(flight)
            self.count += isinstance(nxt, Pending)
            self.ahead += isinstance(nxt, InFlight)
            return nxt

        monkeypatch.setattr(engine, "_launch_next", counted)


def outputs(llm: LLM, params: list[SamplingParams], arrivals: list[int] | None = None,
            prompts: list[str] = PROMPTS) -> list[list[tuple]]:
    tokenizer = char_tokenizer()
    batch = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    outs = staggered_outputs(llm, batch, params, arrivals or [0] * len(batch))
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs]
            for out in outs]


def constrained(constraint: dict, **kwargs) -> list[SamplingParams]:
    """Greedy, seeded and ``n = 2`` seeded samples under ``constraint``, one a prompt."""
    so = StructuredOutputsParams(**constraint)
    return [SamplingParams(temperature=0.0, max_tokens=120, structured_outputs=so, **kwargs),
            SamplingParams(temperature=1.0, seed=5, max_tokens=120, structured_outputs=so,
                           **kwargs),
            SamplingParams(temperature=0.8, top_k=20, seed=6, n=2, max_tokens=120,
                           structured_outputs=so, **kwargs),
            SamplingParams(temperature=1.2, seed=7, max_tokens=120, structured_outputs=so,
                           **kwargs)]


@pytest.mark.parametrize("forced", [0, 8])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("device", DEVICES)
def test_grammar_steps_overlap_and_equal_synchronous_steps(target, monkeypatch, device, case,
                                                          forced):
    constraint, valid = CASES[case]
    params = constrained(constraint)
    arrivals = [0, 0, 3, 7]
    expected = outputs(make_llm(target, False, device, structured_forced_tokens=forced),
                       params, arrivals)
    llm = make_llm(target, True, device, structured_forced_tokens=forced)
    pending = PendingLaunches(monkeypatch, llm.llm_engine)
    got = outputs(llm, params, arrivals)
    assert got == expected
    assert pending.count > 5  # (the overlapped path ran: the choices' outputs are short)
    assert all(valid(r[1]) for out in got for r in out if r[2] == "stop")
    assert_engine_empty(llm)


@pytest.mark.parametrize("pattern", [None, r"[ab]{2,4}-(x|yz)\.[0-9]"])
def test_forced_tokens_still_come_several_a_step(target, monkeypatch, pattern):
    """A grammar that forces three or more tokens ends the overlap: the synchronous step after
    the flight drafts what is left (the schema's keys and punctuation), as without overlap;
    that step never finds too few to draft (``_forced`` drafts two or more while steps
    overlap). The regex forces exactly two tokens at its dot."""
    constraint = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    if pattern is not None:
        constraint = StructuredOutputsParams(regex=pattern)
    params = SamplingParams(temperature=0, max_tokens=200, structured_outputs=constraint)
    llm = make_llm(target, True)
    engine = llm.llm_engine
    pending = PendingLaunches(monkeypatch, engine)
    launch, forced, ended = engine._launch_next, engine._forced, []

    def launched(flight):
        ended.append(flight.host_next)
        return launch(flight)

    def drafted(items, free):
        out = forced(items, free)
        if ended and ended[-1]:  # (the synchronous step after an overlap forcing ended)
            assert out and all(len(out.get(i, ())) >= 2 for i in range(len(items)))
            ended.append(False)
        return out

    monkeypatch.setattr(engine, "_launch_next", launched)
    monkeypatch.setattr(engine, "_forced", drafted)
    out = llm.generate(PROMPTS if pattern is None else PROMPTS[:1], params, use_tqdm=False)
    if pattern is not None:  # (a dot between free characters: nothing else to check)
        return
    assert all(valid_json(o.outputs[0].text) for o in out)
    m = llm.get_metrics()
    assert m.num_drafted > 0 and m.num_accepted > 0 and pending.count > 0
    steps = sum(o.metrics.num_steps for o in out)
    tokens = sum(len(o.outputs[0].token_ids) for o in out)
    assert steps < tokens


def test_a_speculative_engine_planning_no_drafts_overlaps_grammar_steps(target, monkeypatch):
    """A speculative engine whose plans give no drafts (a backed-off controller) overlaps its
    grammar steps as an engine without a proposer does: forced tokens are drafted only in a
    step where every sample is forced two or more, and the output is the synchronous
    engine's."""
    from scheduler import DraftPlan

    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = [SamplingParams(temperature=0.0, max_tokens=120, structured_outputs=so),
              SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)] * 2
    prompts = PROMPTS
    arrivals = [0, 2, 4, 9]  # (steps from the host as each arrives, beside forced ones)
    expected = outputs(make_llm(target, False, structured_forced_tokens=8), params, arrivals,
                       prompts)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "adaptive_k": False}
    llm = make_llm(target, True, speculative_config=spec, structured_forced_tokens=8)
    engine = llm.llm_engine
    monkeypatch.setattr(engine.controller, "plan",
                        lambda running, waiting, _plan=engine.controller.plan:
                        DraftPlan(0, _plan(running, waiting).step))
    pending = PendingLaunches(monkeypatch, engine)
    forced, mixed = engine._forced, []

    def drafted(items, free):
        out = forced(items, free)
        samples = [i for i, item in enumerate(items) if item.samples]
        mixed.append(bool(out) and not all(len(out.get(i, ())) >= 2 for i in samples))
        return out

    monkeypatch.setattr(engine, "_forced", drafted)
    assert outputs(llm, params, arrivals, prompts) == expected
    assert pending.count > 5 and len(mixed) > 3 and not any(mixed)
    assert_engine_empty(llm)


ADJUSTED = [
    SamplingParams(temperature=0.7, seed=2, max_tokens=30, repetition_penalty=1.4),
    SamplingParams(temperature=0.0, max_tokens=30, min_tokens=12, stop_token_ids=[70, 71]),
    SamplingParams(temperature=0.0, max_tokens=30, frequency_penalty=0.8,
                   presence_penalty=0.3, ignore_eos=True),
    SamplingParams(temperature=0.9, seed=3, max_tokens=30, logit_bias={70: 5.0, 72: -100.0},
                   bad_words=["ab"], n=2),
    SamplingParams(temperature=0.0, max_tokens=20, stop=["e"], ignore_eos=True),  # (plain)
    SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(
        regex=r"[ab]{2,4}-(x|yz)\.[0-9]")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_penalties_and_masks_overlap_beside_plain_samples(target, monkeypatch, device):
    prompts = PROMPTS + ["zzz", "ab"]
    arrivals = [0, 0, 0, 2, 5, 9]
    expected = outputs(make_llm(target, False, device, max_num_seqs=4), ADJUSTED, arrivals,
                       prompts)
    llm = make_llm(target, True, device, max_num_seqs=4)
    pending = PendingLaunches(monkeypatch, llm.llm_engine)
    assert outputs(llm, ADJUSTED, arrivals, prompts) == expected
    assert pending.count > 10
    assert_engine_empty(llm)
    # min_tokens held EOS and the stop ids off for its first 12 tokens
    assert len(expected[1][0][0]) >= 12


DEVICE_ADJUSTED = [
    SamplingParams(temperature=0.7, seed=2, max_tokens=30, repetition_penalty=1.4, logprobs=2),
    SamplingParams(temperature=0.0, max_tokens=30, min_tokens=12, stop_token_ids=[70, 71]),
    SamplingParams(temperature=0.0, max_tokens=30, frequency_penalty=0.8,
                   presence_penalty=0.3, ignore_eos=True),
    SamplingParams(temperature=0.9, seed=3, max_tokens=30, logit_bias={70: 5.0, 72: -100.0},
                   allowed_token_ids=list(range(60, 100)), frequency_penalty=-0.5, n=2),
    SamplingParams(temperature=0.0, max_tokens=20, stop=["e"], ignore_eos=True),  # (plain)
    SamplingParams(temperature=1.1, seed=8, max_tokens=25, presence_penalty=1.5,
                   repetition_penalty=0.7, min_tokens=20),
]


@pytest.mark.parametrize("device", DEVICES)
def test_adjusted_samples_are_sampled_ahead_from_slot_state(target, monkeypatch, device):
    """Penalties, bias, allowed ids and min_tokens with no grammar or bad words beside them:
    the steps are sampled ahead, adjusted from each slot's state on the device
    (samplers.slot_adjustments), whose counts the sampled tokens raise there. Arrivals into
    three slots: slots change hands, their rows written again; output the synchronous
    engine's."""
    prompts = PROMPTS + ["zzz", "ab"]
    arrivals = [0, 0, 0, 2, 5, 9]
    expected = outputs(make_llm(target, False, device, max_num_seqs=3), DEVICE_ADJUSTED,
                       arrivals, prompts)
    llm = make_llm(target, True, device, max_num_seqs=3)
    launches = PendingLaunches(monkeypatch, llm.llm_engine)
    assert outputs(llm, DEVICE_ADJUSTED, arrivals, prompts) == expected
    assert launches.count == 0 and launches.ahead > 40
    state = llm.llm_engine.slot_adjustments
    assert set(state.rows) == {"banned", "min_tokens", "in_prompt", "bias"}
    assert not state.owner and not state.counted  # (every sequence released its slot)
    assert_engine_empty(llm)


@pytest.mark.parametrize("where", ["apply", "count", "copies"])
def test_a_step_sampled_ahead_that_raised_leaves_nothing_behind(target, monkeypatch, where):
    """A step launched ahead raised once while it was sampled (adjusting its logits, after
    counting its tokens on the device, or queueing their copy): its rows go back to the
    cache, and its slots' counts are marked for making again once counted, so the calls
    after it give the synchronous engine's output."""
    params = DEVICE_ADJUSTED[:4]
    expected = outputs(make_llm(target, False), params)
    llm = make_llm(target, True)
    engine = llm.llm_engine
    state, raised, calls = engine.slot_adjustments, [], []
    targets = {"apply": (state, "apply"), "count": (Adjusted, "count"),
               "copies": (engine._token_copies, "start")}
    owner, name = targets[where]
    original = getattr(owner, name)

    def once(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(1)
        if len(calls) == 3 and engine._in_flight is not None:  # (from _launch_next)
            raised.append(1)
            raise RuntimeError("sampling failed")
        return out

    monkeypatch.setattr(owner, name, once)
    tokenizer = char_tokenizer()
    for i, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True)):
        engine.add_request(f"r{i}", None, tokenizer.encode(prompt, add_special_tokens=False), p)
    while engine.has_work():
        try:
            engine.step()
        except RuntimeError:  # (counted, then dropped: nothing says the counts are current)
            penalized = {s.slot for s in engine._in_flight.sequences if s.params.needs_penalties}
            assert penalized and not (where != "apply" and penalized & set(state.counted))
    assert raised
    from engine.llm import build_output
    got = [[(c.token_ids, c.text, c.finish_reason, c.stop_reason)
            for c in build_output(engine.pop_request(f"r{i}")).outputs]
           for i in range(len(params))]
    assert got == expected
    assert_engine_empty(llm)


@pytest.mark.parametrize("device", DEVICES)
def test_preempted_adjusted_samples_keep_their_counts(target, monkeypatch, device):
    """A KV cache that holds about two of six penalized sequences: preempted ones are
    recomputed and come back to a slot another may have held meanwhile (its rows written
    again) or their own (its counts still theirs); output equals the synchronous engine's,
    greedy and seeded."""
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                             frequency_penalty=0.6, logit_bias={40: 1.0}),
              SamplingParams(temperature=0.9, seed=9, max_tokens=24, ignore_eos=True,
                             repetition_penalty=1.3, presence_penalty=0.4, min_tokens=10)] * 3
    prompts = ["abcab", "zzz", "hello", "ab", "qqq q", "xyz"]
    kwargs = dict(max_num_seqs=6, kv_cache_tokens=56)
    expected = outputs(make_llm(target, False, device, **kwargs), params, prompts=prompts)
    llm = make_llm(target, True, device, **kwargs)
    launches = PendingLaunches(monkeypatch, llm.llm_engine)
    assert outputs(llm, params, prompts=prompts) == expected
    assert launches.ahead > 5 and llm.llm_engine.metrics.num_preemptions > 0
    assert_engine_empty(llm)


def test_counts_made_again_after_drafting_steps_adjusted_on_the_host(target, monkeypatch):
    """An n-gram engine drafts every third step (synchronous: its rows adjusted on the host,
    the slots' counts not raised) and decodes plainly between (sampled ahead from the slots'
    state): the plain step after a drafting one counts its slots' output again. Greedy output
    equals plain decoding's."""
    from scheduler import DraftPlan

    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                             frequency_penalty=0.4, presence_penalty=0.2),
              SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                             repetition_penalty=1.2, logit_bias={40: 0.5, 41: 0.7})]
    prompts = [PROMPTS[0] * 3, PROMPTS[1] * 3]  # (repeated text: n-gram drafts it)
    expected = outputs(make_llm(target, False), params, prompts=prompts)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "adaptive_k": False}
    llm = make_llm(target, True, speculative_config=spec)
    engine = llm.llm_engine

    def scripted(running, waiting, _plan=engine.controller.plan):
        plan = _plan(running, waiting)
        return DraftPlan(3 if plan.step % 3 == 0 else 0, plan.step)

    monkeypatch.setattr(engine.controller, "plan", scripted)
    state, rebuilt = engine.slot_adjustments, []
    rebuild = state._rebuild
    monkeypatch.setattr(state, "_rebuild", lambda rows, fed: (rebuilt.append(len(rows)),
                                                              rebuild(rows, fed)))
    assert outputs(llm, params, prompts=prompts) == expected
    assert engine.metrics.num_drafted > 0 and len(rebuilt) > 5
    assert_engine_empty(llm)


@pytest.mark.parametrize("raise_at", range(0, 36, 4))
def test_a_step_that_raised_after_its_commit_leaves_the_next_to_sample(target, monkeypatch,
                                                                        raise_at):
    """The host's processing of a pending step raised once, at its end (its logits bias,
    penalties and masks applied by then, its tokens counted in the slots' state): the flight
    before it was committed, what that commit updated is reported by the next call, which
    samples the pending step again from the forward's own logits, its penalties from counts
    made again; output unchanged."""
    params = [*constrained({"regex": r"[ab]{2,4}-(x|yz)\.[0-9]{20,30}"})[:3],
              SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                             logit_bias={5: 2.0, 9: -1.5, 17: 1.0}, frequency_penalty=0.9,
                             presence_penalty=0.8, repetition_penalty=1.3)]
    expected = outputs(make_llm(target, False), params)
    llm = make_llm(target, True)
    engine = llm.llm_engine
    forces, calls, raised = engine._forces_tokens, [], []

    def once(seqs):  # (the last thing _sample_hosted does; once, from raise_at calls on)
        calls.append(1)
        if len(calls) > raise_at and not raised and isinstance(engine._in_flight, Pending):
            raised.append(1)
            raise RuntimeError("the host's processing failed")
        return forces(seqs)

    monkeypatch.setattr(engine, "_forces_tokens", once)
    tokenizer = char_tokenizer()
    for i, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True)):
        engine.add_request(f"r{i}", None, tokenizer.encode(prompt, add_special_tokens=False), p)
    reported = set()
    while engine.has_work():
        try:
            reported |= {id(s) for s in engine.step() if s.is_finished}
        except RuntimeError:
            assert isinstance(engine._in_flight, Pending)
    assert raised
    assert reported == {id(s) for i in range(len(PROMPTS)) for s in engine.requests[f"r{i}"]}
    from engine.llm import build_output
    got = [[(c.token_ids, c.text, c.finish_reason, c.stop_reason)
            for c in build_output(engine.pop_request(f"r{i}")).outputs]
           for i in range(len(PROMPTS))]
    assert got == expected
    assert_engine_empty(llm)


def test_an_abort_between_hosted_flights_frees_everything(target):
    """A request aborted between steps (a flight sampled after the host masked it is in
    flight): the step after it drops the aborted one's token; the others' output is
    unchanged, and the engine ends empty."""
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=so)
    tokenizer = char_tokenizer()
    batch = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:3]]
    from engine.llm import build_output
    sync = make_llm(target, False, structured_forced_tokens=0)
    for i, prompt in enumerate(batch[:2]):
        sync.llm_engine.add_request(f"r{i}", None, prompt, params)
    while sync.llm_engine.has_work():
        sync.llm_engine.step()
    expected = [build_output(sync.llm_engine.pop_request(f"r{i}")).outputs[0].token_ids
                for i in range(2)]
    llm = make_llm(target, True, structured_forced_tokens=0)
    engine = llm.llm_engine
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", None, prompt, params)
    while engine._in_flight is None or len(engine._in_flight.sequences) < 3:
        engine.step()
    engine.step()
    engine.abort_request("r2")
    while engine.has_work():
        engine.step()
    assert engine.pop_request("r2")[0].finish_reason == "abort"
    got = [build_output(engine.pop_request(f"r{i}")).outputs[0].token_ids for i in range(2)]
    assert got == expected
    assert_engine_empty(llm)


def logprob_outputs(llm: LLM, params: list[SamplingParams],
                    arrivals: list[int]) -> tuple[list, list[float]]:
    """Each sample's tokens and its positions' entries without their values (ids, ranks,
    texts), and every value in order (cumulative ones included)."""
    tokenizer = char_tokenizer()
    batch = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    outs = staggered_outputs(llm, batch, params, arrivals)
    samples = [c for out in outs for c in out.outputs]
    exact = [(c.token_ids, [[(t, v.rank, v.decoded_token) for t, v in pos.items()]
                            for pos in (c.logprobs or [])]) for c in samples]
    values = [v.logprob for c in samples for pos in (c.logprobs or []) for v in pos.values()]
    values += [c.cumulative_logprob for c in samples if c.cumulative_logprob is not None]
    return exact, values


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs", "processed_logits"])
@pytest.mark.parametrize("device", DEVICES)
def test_logprobs_of_overlapped_steps_equal_synchronous_steps(target, monkeypatch, device, mode):
    """Logprobs, their ranks and texts, under a grammar, with penalties and plain, greedy and
    seeded: the synchronous step's. Values to a float32 rounding: the forward's batches differ
    between the two engines (a sample stopped a step late stays in one), and so may a logit's
    last bit on the CPU."""
    so = StructuredOutputsParams(regex=r"[ab]{2,4}-(x|yz)\.[0-9]")
    params = [SamplingParams(temperature=0.0, max_tokens=30, logprobs=3, ignore_eos=True),
              SamplingParams(temperature=0.9, top_k=12, seed=4, max_tokens=30, logprobs=0,
                             structured_outputs=so),
              SamplingParams(temperature=0.8, seed=5, max_tokens=30, logprobs=5, n=2,
                             presence_penalty=0.6, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)]
    arrivals = [0, 0, 2, 6]
    expected = logprob_outputs(make_llm(target, False, device, logprobs_mode=mode), params,
                               arrivals)
    llm = make_llm(target, True, device, logprobs_mode=mode)
    pending = PendingLaunches(monkeypatch, llm.llm_engine)
    exact, values = logprob_outputs(llm, params, arrivals)
    assert exact == expected[0]
    torch.testing.assert_close(torch.tensor(values), torch.tensor(expected[1]), rtol=1e-5,
                               atol=1e-5)
    assert pending.count > 0 and pending.ahead > 10  # (the grammar's steps: hosted)
    samples = expected[0]
    assert all(len(entries) == len(tokens) for tokens, entries in samples[:4])  # (n = 2)
    assert not samples[4][1]  # (no logprobs asked)
    assert_engine_empty(llm)
