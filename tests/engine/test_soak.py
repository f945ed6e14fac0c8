"""A bounded soak of the request lifecycle: waves of mixed requests on a tiny model whose KV cache
forces preemptions, with aborts, abandoned and interleaved streams and bad requests. Nothing may be
lost, duplicated or held at the end, and greedy and seeded samples must come out as they do when
run alone. Runs in CI (``-m soak`` selects it alone)."""

from __future__ import annotations

import os
import random

import pytest
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import tiny_tokenizer

VOCAB = 32
# 120 waves (about 700 requests) in CI; SPECDEC_SOAK_WAVES=350 gives about 2,000 per proposer
WAVES = int(os.environ.get("SPECDEC_SOAK_WAVES", "120"))
MAX_NUM_SEQS = 4

pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


def make_llm(target, method: str, cache: bool = False) -> LLM:
    spec = {"method": method, "num_speculative_tokens": 3}
    if method == "draft_model":
        spec.update(model=tiny_model("llama", vocab_size=VOCAB, seed=1),
                    tokenizer=tiny_tokenizer(VOCAB))
    # 64 KV rows for 4 sequences of up to 12 + 16 tokens (+ drafts): preemption is routine
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=MAX_NUM_SEQS,
               kv_cache_tokens=64, max_model_len=48, speculative_config=spec,
               enable_prefix_caching=cache)


def random_request(rng: random.Random) -> tuple[list[int], SamplingParams, str]:
    """A prompt, its parameters and its kind: greedy, seeded, unseeded, n=2 or bad."""
    kind = rng.choice(["greedy", "greedy", "seeded", "seeded", "unseeded", "n2", "bad"])
    prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 12))]
    max_tokens = rng.randrange(4, 16)
    if kind == "bad":
        prompt = rng.choice([[], list(range(3, 3 + 48))])  # empty, or no room for output
        return prompt, SamplingParams(max_tokens=max_tokens), kind
    stop = rng.choice([None, None, ["w7"]])
    params = {"greedy": dict(temperature=0.0),
              "seeded": dict(temperature=0.8, top_k=12, seed=rng.randrange(1000)),
              "unseeded": dict(temperature=1.0),
              "n2": dict(temperature=0.9, n=2, seed=rng.randrange(1000))}[kind]
    return prompt, SamplingParams(max_tokens=max_tokens, stop=stop, **params), kind


def run_wave(llm: LLM, rng: random.Random, requests, mode: str) -> tuple[dict, bool]:
    """Run one wave. Returns {(request key, sample index): (finish_reason, token_ids)} for every
    sample whose end was seen (the key: the prompt's index for ``generate``, the request id for
    streams), and whether a stream was abandoned. Fails on a final delta reported twice."""
    prompts, params = [r[0] for r in requests], [r[1] for r in requests]
    seen: dict[tuple, tuple[str, list[int]]] = {}
    if mode == "generate":
        for i, out in enumerate(llm.generate(prompts, params, use_tqdm=False)):
            assert out.finished and len(out.outputs) == params[i].n
            for c in out.outputs:
                seen[(i, c.index)] = (c.finish_reason, c.token_ids)
        return seen, False
    half = len(requests) // 2 if mode == "interleaved" else len(requests)
    live = [(llm.generate_stream(prompts[:half], params[:half]), False)]
    if half < len(requests):
        live.append((llm.generate_stream(prompts[half:], params[half:]), True))
    tokens: dict[tuple, list[int]] = {}
    abort_at = rng.randrange(1, 6)
    abandon = mode == "interleaved" and rng.random() < 0.5
    count = 0
    while live:
        for item in list(live):
            stream, second = item
            delta = next(stream, None)
            if delta is None:
                live.remove(item)
                continue
            count += 1
            key = (delta.request_id, delta.index)
            tokens.setdefault(key, []).extend(delta.token_ids)
            if delta.finished:
                assert key not in seen, f"final delta of {key} reported twice"
                seen[key] = (delta.finish_reason, tokens[key])
            if count == abort_at and not delta.finished:
                llm.abort(delta.request_id)
            if abandon and second and count >= abort_at + 3:
                stream.close()  # a consumer that stops reading
                live.remove(item)
    return seen, abandon


@pytest.mark.parametrize("method,cache", [("ngram", False), ("draft_model", False),
                                          ("ngram", True), ("suffix", True)])
def test_soak(target, method, cache):
    rng = random.Random(1234)
    llm = make_llm(target, method, cache)
    checked: list[tuple[list[int], SamplingParams, list[list[int]]]] = []
    num_requests = 0
    for wave in range(WAVES):
        requests = [random_request(rng) for _ in range(rng.randrange(3, 9))]
        num_requests += len(requests)
        mode = ["generate", "stream", "interleaved"][wave % 3]
        seen, abandoned = run_wave(llm, rng, requests, mode)
        num_samples = sum(params.n for _, params, _ in requests)
        # nothing lost: every sample ends once (but those of an abandoned stream)
        assert len(seen) == num_samples or abandoned
        for reason, ids in seen.values():
            assert reason in ("stop", "length", "abort", "error") and len(ids) <= 16
        if mode == "generate":
            for i, (prompt, params, kind) in enumerate(requests):
                reasons = [seen[(i, j)][0] for j in range(params.n)]
                assert all(r == "error" for r in reasons) == (kind == "bad")
                if kind in ("greedy", "seeded", "n2") and all(
                        r in ("stop", "length") for r in reasons):
                    checked.append((prompt, params,
                                    [seen[(i, j)][1] for j in range(params.n)]))
        # nothing held between waves
        engine = llm.engine
        assert engine.requests == {} and not engine.has_work() and llm._inboxes == {}
        assert engine.runner.num_cached_tokens == 0
        assert engine.runner.num_free_slots == MAX_NUM_SEQS
        assert engine.runner.num_free_tokens == 64  # (the prefix cache's rows count as free)
        if cache:
            assert all(node.refs == 0 for node in engine.runner._slots.cache._nodes())
    assert llm.get_metrics().num_preemptions > 0
    if cache:
        assert llm.get_metrics().prefix_cache_hits > 0
    assert num_requests > 100 and len(checked) > 15
    # greedy samples and every seeded one (n=2 included) are what they are alone, in a fresh
    # engine; seeded ones also without speculation (their tokens do not depend on drafts)
    alone = make_llm(target, method)
    plain = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=MAX_NUM_SEQS)
    greedy = [c for c in checked if c[1].temperature == 0.0]
    seeded = [c for c in checked if c[1].temperature > 0.0]
    assert len(seeded) >= 10
    for prompt, params, ids in rng.sample(greedy, min(12, len(greedy))) + seeded:
        (out,) = alone.generate([prompt], params, use_tqdm=False)
        assert [c.token_ids for c in out.outputs] == ids
        if params.seed is not None:
            (out,) = plain.generate([prompt], params, use_tqdm=False)
            assert [c.token_ids for c in out.outputs] == ids
