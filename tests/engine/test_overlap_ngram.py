"""Overlapped drafting steps with n-gram prompt lookup (``proposers.ngram_device``): each
verification step's next drafts are looked up on the device from its verified tokens, and the
next step is launched before the host reads them. Output equals the plain engine's token for
token (greedy, seeded samples, stops a step late, arrivals, preemption), the flights do run,
and the engine holds nothing afterwards."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import tiny_tokenizer
from tests.engine.test_overlap import (
    DEVICES,
    VOCAB,
    assert_engine_empty,
    outputs,
    prompts,
    target,  # noqa: F401  (the module's tiny model fixture)
)
from tests.engine.test_overlap_drafting import GREEDY, Chained


def repeating(n: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a phrase: n-gram lookup matches them, and the tiny target copies
    some of it (partial acceptance)."""
    return [p * 3 for p in prompts(n, seed)]


def ngram_llm(target, device: str, overlap: bool = True, adaptive: bool = False,  # noqa: F811
              **kwargs) -> LLM:
    return LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
               async_scheduling=overlap, max_num_seqs=8,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                   "adaptive_k": adaptive}, **kwargs)


def plain_outputs(target, device, batch, params, arrivals=None, **kwargs):  # noqa: F811
    return outputs(LLM(model=target.to(device), tokenizer=tiny_tokenizer(VOCAB), device=device,
                       async_scheduling=False, **kwargs), batch, params, arrivals)


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_ngram_flights_equal_plain_decoding(target, monkeypatch, device, adaptive):  # noqa: F811
    batch = repeating(6, seed=21)
    expected = plain_outputs(target, device, batch, GREEDY)
    llm = ngram_llm(target, device, adaptive=adaptive)
    chained = Chained(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, GREEDY) == expected
    metrics = llm.llm_engine.metrics
    assert chained.count >= (5 if not adaptive else 1)
    assert 0 < metrics.num_accepted < metrics.num_drafted  # (partial acceptance)
    assert_engine_empty(llm)
    assert llm.llm_engine.proposer._device._held == {}  # (every request's row given back)
    # staggered arrivals: each one ends the flights (its prefill runs from the host)
    arrivals = [0, 0, 3, 8, 12, 20]
    expected = plain_outputs(target, device, batch, GREEDY, arrivals)
    llm = ngram_llm(target, device, adaptive=adaptive)
    chained = Chained(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, GREEDY, arrivals) == expected
    assert chained.count >= 1
    assert_engine_empty(llm)


@pytest.mark.parametrize("device", DEVICES)
def test_ngram_flights_through_preemption(target, monkeypatch, device):  # noqa: F811
    """A KV cache of about two of the six sequences: flights end where it runs short, the
    preempted sequences are recomputed (their device rows given back and written again)."""
    batch = repeating(6, seed=4)
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=9, max_tokens=20, ignore_eos=True)] * 3
    kwargs = dict(kv_cache_tokens=96, max_model_len=80)
    expected = plain_outputs(target, device, batch, params, max_num_seqs=8, **kwargs)
    llm = ngram_llm(target, device, **kwargs)
    chained = Chained(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, params) == expected
    assert chained.count > 0 and llm.llm_engine.metrics.num_preemptions > 0
    assert_engine_empty(llm)


def test_an_ngram_engine_without_overlap_drafts_on_the_host(target, monkeypatch):  # noqa: F811
    batch = repeating(3, seed=2)
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)] * 3
    llm = ngram_llm(target, "cpu", overlap=False)
    chained = Chained(monkeypatch, llm.llm_engine)
    assert outputs(llm, batch, params) == plain_outputs(target, "cpu", batch, params)
    assert chained.count == 0 and llm.llm_engine.metrics.num_accepted > 0


def test_device_drafts_are_the_host_rule_on_the_verified_context(target):  # noqa: F811
    """At every device lookup, the row holds the request's true context (the prompt and the
    output the engine ends with, up to the step's bonus token) and the drafts are what the host
    proposer drafts for that context; each k drafts, newest token where nothing matched."""
    from proposers.base import ProposeRequest
    from proposers.ngram import NgramProposer

    batch = repeating(4, seed=13)
    llm = ngram_llm(target, "cpu")
    proposer = llm.llm_engine.proposer
    device, seen = proposer._device, []
    lookup = device.draft_after

    def logged(req_ids, tokens, accepted, base, k, base_hi):
        drafts = lookup(req_ids, tokens, accepted, base, k, base_hi)
        for b, req_id in enumerate(req_ids):
            length = int(base[b] + accepted[b]) + 2
            row = device._row_of[req_id]
            seen.append((req_id, device.history[row, :length].tolist(), drafts[b].tolist()))
        return drafts

    device.draft_after = logged
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    full = {f"{o.request_id}#0": p + list(o.outputs[0].token_ids)
            for p, o in zip(batch, outs, strict=True)}
    assert len(seen) >= 20
    host = NgramProposer(proposer.prompt_lookup_min, proposer.prompt_lookup_max)
    for req_id, context, drafts in seen:
        assert len(drafts) == 3
        if len(context) <= len(full[req_id]):  # (a lookup past the end drafted nothing used)
            assert context == full[req_id][:len(context)]
        expected = host.propose([ProposeRequest(0, context, 3, params)]).draft_token_ids[0]
        assert drafts == (expected or [context[-1]] * 3)
        host.remove(0)


def test_unmatched_rows_draft_only_in_steps_that_may_verify_ahead(target, monkeypatch):  # noqa: F811
    """The host proposer fills an unmatched row with the newest token only where the step may
    start a drafting flight (every request decodes and overlaps) and another row matched: a
    step with a request banning a bad word of several tokens never may (its logits need the
    host's adjustment, from its newest tokens), and its unmatched rows draft nothing (no width
    wasted on them)."""
    from dataclasses import replace

    batch = repeating(3, seed=2) + [prompts(1, seed=99)[0]]
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 4
    seen = []  # (banning run, the requests' uniform flags, rows without drafts, rows)
    for bans in (False, True):
        llm = ngram_llm(target, "cpu")
        proposer = llm.llm_engine.proposer

        def spied(requests, _propose=proposer.propose, _pen=bans):
            out = _propose(requests)
            seen.append((_pen, {r.uniform for r in requests},
                         sum(1 for d in out.draft_token_ids if not d), len(requests)))
            return out

        monkeypatch.setattr(proposer, "propose", spied)
        outputs(llm, batch, params[:3] + [replace(params[3], bad_words=["w5 w6"] if bans
                                                  else None)])
    # uniform steps: every row drafts, or none matched and none does (a plain step)
    uniform = [(empty, n) for _, flags, empty, n in seen if flags == {True}]
    assert uniform and all(empty in (0, n) for empty, n in uniform)
    # the banning request's steps are never uniform, and some of their rows draft nothing
    # while others do
    mixed = [(empty, n) for pen, flags, empty, n in seen if pen and n == 4]
    assert mixed and all(flags == {False} for pen, flags, _, n in seen if pen and n == 4)
    assert any(0 < empty < n for empty, n in mixed)
