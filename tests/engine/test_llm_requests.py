"""Seeds, n > 1, preemption, logprobs, streaming and chat through the ``LLM`` API."""

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer, words

VOCAB = 32
NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


def make_llm(target, spec=NGRAM, **kwargs) -> LLM:
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec, **kwargs)


PROMPTS = [[5, 6, 7, 5, 6], [9, 10, 11, 12], [20, 21, 20, 21, 22, 23], [3, 4], [30, 8, 30, 8]]


def ids(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def test_same_seed_same_output_whatever_the_batch(target):
    seeded = SamplingParams(seed=7, temperature=1.0, max_tokens=20, ignore_eos=True)
    alone = make_llm(target).generate([PROMPTS[0]], seeded, use_tqdm=False)[0]
    others = [SamplingParams(seed=s, temperature=0.9, top_k=10, max_tokens=12 + s,
                             ignore_eos=True) for s in range(4)]
    crowd = make_llm(target).generate(PROMPTS[1:3] + [PROMPTS[0]] + PROMPTS[3:],
                                      others[:2] + [seeded] + others[2:], use_tqdm=False)
    assert crowd[2].outputs[0].token_ids == alone.outputs[0].token_ids
    unseeded = make_llm(target).generate(
        [PROMPTS[0]] * 2, SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True),
        use_tqdm=False)
    assert ids(unseeded) != [[alone.outputs[0].token_ids]] * 2  # not a constant


def test_n_samples_are_independent_and_reproducible(target):
    params = SamplingParams(n=4, seed=11, temperature=1.0, max_tokens=16, ignore_eos=True)
    first = make_llm(target).generate([PROMPTS[1]], params, use_tqdm=False)[0]
    again = make_llm(target).generate([PROMPTS[1]], params, use_tqdm=False)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2, 3]
    assert ids([first]) == ids([again])
    assert len({tuple(c.token_ids) for c in first.outputs}) == 4
    single = make_llm(target).generate(
        [PROMPTS[1]], SamplingParams(seed=11, temperature=1.0, max_tokens=16, ignore_eos=True),
        use_tqdm=False)[0]
    assert single.outputs[0].token_ids == first.outputs[0].token_ids
    assert first.metrics.num_generated == 64


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_preemption_changes_no_output(target, temperature):
    params = SamplingParams(seed=3, temperature=temperature, max_tokens=24, ignore_eos=True)
    roomy = make_llm(target).generate(PROMPTS, params, use_tqdm=False)
    tight = make_llm(target, kv_cache_tokens=64)  # 5 sequences of up to 30 tokens do not fit
    squeezed = tight.generate(PROMPTS, params, use_tqdm=False)
    assert tight.get_metrics().num_preemptions > 0
    assert ids(squeezed) == ids(roomy)
    assert sum(o.metrics.num_preemptions for o in squeezed) > 0
    if temperature == 0.0:
        assert ids(squeezed) == [[hf_greedy(target, p, 24)] for p in PROMPTS]


def test_logprobs_are_the_targets(target):
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3, ignore_eos=True)
    out = make_llm(target).generate([PROMPTS[2]], params, use_tqdm=False)[0].outputs[0]
    context = PROMPTS[2] + out.token_ids
    with torch.inference_mode():
        full = torch.log_softmax(target(torch.tensor([context])).logits[0].double(), dim=-1)
    assert len(out.logprobs) == 8
    total = 0.0
    for j, (token, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        row = full[len(PROMPTS[2]) - 1 + j]
        assert entry[token].logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        assert entry[token].decoded_token == f"w{token}"
        top = torch.topk(row, 3).indices.tolist()
        assert set(entry) == set(top) | {token}
        assert [entry[t].rank for t in top] == [1, 2, 3]
        total += entry[token].logprob
    assert out.cumulative_logprob == pytest.approx(total, abs=1e-4)


def test_logprobs_are_raw_by_default_and_processed_on_request(target):
    """vLLM's default: the model's own log-probabilities, whatever the temperature and top-p;
    'processed_logprobs': those of the sampled distribution, with no -inf entries listed."""
    params = SamplingParams(temperature=0.5, top_p=0.3, seed=3, max_tokens=6, logprobs=8,
                            ignore_eos=True)
    for mode in ("raw_logprobs", "processed_logprobs"):
        llm = make_llm(target, logprobs_mode=mode)
        out = llm.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0]
        context = PROMPTS[1] + out.token_ids
        with torch.inference_mode():
            logits = target(torch.tensor([context])).logits[0].double()  # [len, vocab]
        for j, (token, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            raw = logits[len(PROMPTS[1]) - 1 + j]
            if mode == "raw_logprobs":
                want = torch.log_softmax(raw, dim=-1)
                assert len(entry) >= 8
            else:  # temperature 0.5 then top-p 0.3 of that
                probs = torch.softmax(raw / 0.5, dim=-1)
                order = probs.argsort(descending=True)
                keep = order[:int((probs[order].cumsum(0) - probs[order] < 0.3).sum())]
                want = torch.full_like(raw, float("-inf"))
                want[keep] = torch.log(probs[keep] / probs[keep].sum())
                assert set(entry) == set(keep.tolist()) | {token}  # no -inf padding
            for tid, lp in entry.items():
                assert lp.logprob == pytest.approx(float(want[tid]), abs=1e-4)


def test_prompt_logprobs_are_the_models_own(target):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    for kv in (None, 8):  # (8 KV rows: the prompt is prefilled in several preempted tries)
        llm = make_llm(target, max_num_batched_tokens=3) if kv is None else make_llm(target)
        out = llm.generate([PROMPTS[2]], params, use_tqdm=False)[0]
        with torch.inference_mode():
            full = torch.log_softmax(target(torch.tensor([PROMPTS[2]])).logits[0].double(), -1)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(PROMPTS[2])
        for pos in range(1, len(PROMPTS[2])):
            entry, token = out.prompt_logprobs[pos], PROMPTS[2][pos]
            assert entry[token].logprob == pytest.approx(float(full[pos - 1, token]), abs=1e-4)
            top = torch.topk(full[pos - 1], 2).indices.tolist()
            assert set(entry) == set(top) | {token}


def test_stream_deltas_add_up_and_never_pass_a_stop(target):
    reference = hf_greedy(target, PROMPTS[0], 20)
    stop = words(reference[6:8])
    llm = make_llm(target)
    params = SamplingParams(temperature=0, max_tokens=20, stop=[stop], ignore_eos=True)
    final = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    deltas = list(llm.generate_stream([PROMPTS[0]], params))
    assert "".join(d.text for d in deltas) == final.text
    assert sum((d.token_ids for d in deltas), []) == final.token_ids
    assert [d.finish_reason for d in deltas][-1] == "stop" and deltas[-1].stop_reason == stop
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert stop not in "".join(d.text for d in deltas)


def test_chat_applies_the_template(target):
    tok = tiny_tokenizer(VOCAB)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}w4"
    llm = LLM(model=target, tokenizer=tok, speculative_config=NGRAM)
    conversation = [{"role": "user", "content": "w5 w6"}, {"role": "assistant", "content": "w7"}]
    out = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                   use_tqdm=False)
    assert out[0].prompt_token_ids == [5, 6, 7, 4]
    assert out[0].outputs[0].token_ids == hf_greedy(target, [5, 6, 7, 4], 6)
    two = llm.chat([conversation, conversation[:1]], use_tqdm=False)
    assert [o.prompt_token_ids for o in two] == [[5, 6, 7, 4], [5, 6, 4]]


def test_string_prompts_and_metrics(target):
    llm = make_llm(target)
    out = llm.generate("w5 w6 w7 w5 w6", SamplingParams(temperature=0, max_tokens=10,
                                                        ignore_eos=True), use_tqdm=False)
    assert out[0].prompt == "w5 w6 w7 w5 w6" and out[0].prompt_token_ids == PROMPTS[0]
    assert out[0].outputs[0].token_ids == hf_greedy(target, PROMPTS[0], 10)
    m = llm.get_metrics(baseline_tokens_per_s=1.0)
    assert m.num_generated == 10 and m.tokens_per_s > 0
    assert m.measured_speedup == pytest.approx(m.tokens_per_s)
    r = out[0].metrics
    assert r.num_generated == 10 and r.num_steps <= 10 and r.num_accepted <= r.num_drafted


def test_vllm_dict_prompts(target):
    """vLLM's TextPrompt / TokensPrompt dicts give what a string / a token list gives."""
    llm = make_llm(target)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate([{"prompt": "w5 w6 w7 w5 w6"}, {"prompt_token_ids": PROMPTS[1]}], params,
                       use_tqdm=False)
    assert out[0].prompt == "w5 w6 w7 w5 w6" and out[0].prompt_token_ids == PROMPTS[0]
    assert out[1].prompt is None and out[1].prompt_token_ids == PROMPTS[1]
    assert ids(out) == [[hf_greedy(target, p, 6)] for p in PROMPTS[:2]]
    single = llm.generate({"prompt_token_ids": PROMPTS[2]}, params, use_tqdm=False)
    assert ids(single) == [[hf_greedy(target, PROMPTS[2], 6)]]
    # vLLM's TokensPrompt with the text it stands for, and a cache_salt (no prefix cache here)
    both = llm.generate({"prompt_token_ids": PROMPTS[0], "prompt": "five six", "cache_salt": "x"},
                        params, use_tqdm=False)[0]
    assert both.prompt == "five six" and both.prompt_token_ids == PROMPTS[0]
    for bad, error in (({"text": "w5"}, ValueError), ({"multi_modal_data": {}}, ValueError),
                       ({"prompt_token_ids": "w5"}, TypeError), ({"prompt": 5}, TypeError)):
        with pytest.raises(error, match="prompt 0"):
            llm.generate([bad], params, use_tqdm=False)


def test_from_config_file_uses_the_presets_sampling(target, tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("max_num_seqs: 3\nspeculative_config:\n  method: ngram\n"
                      "  num_speculative_tokens: 2\nsampling:\n  temperature: 0.0\n"
                      "  max_tokens: 5\n  ignore_eos: true\n")
    llm = LLM.from_config_file(preset, model=target, tokenizer=tiny_tokenizer(VOCAB))
    assert llm.config.max_num_seqs == 3
    assert llm.config.speculative_config.num_speculative_tokens == 2
    out = llm.generate([PROMPTS[0]], use_tqdm=False)[0].outputs[0]
    assert out.token_ids == hf_greedy(target, PROMPTS[0], 5)
    with pytest.raises(ValueError, match="unknown key 'max_num_seq'"):
        bad = tmp_path / "bad.yaml"
        bad.write_text("max_num_seq: 3\n")
        LLM.from_config_file(bad, model=target, tokenizer=tiny_tokenizer(VOCAB))


def test_seeded_samples_are_steered_like_the_others(target):
    """Drafting priced out (a fixed verify cost of 2): greedy, unseeded and seeded requests
    alike draft only in the controller's probes (at most one in 24 steps: a probe of 3 drafts
    costs 7 plain steps, so it waits 192 steps, 48 for a new request). A seeded request's
    output does not depend on its drafts (``samplers.keyed_random``), so it needs no fixed k:
    it equals its run without speculation."""
    spec = dict(NGRAM, verify_cost_per_token=2.0)
    drafted = {}
    for name, extra in [("greedy", {"temperature": 0}), ("unseeded", {"temperature": 1.0}),
                        ("seeded", {"temperature": 1.0, "seed": 3})]:
        params = SamplingParams(max_tokens=24, ignore_eos=True, **extra)
        out = make_llm(target, spec).generate([PROMPTS[0]], params, use_tqdm=False)[0]
        drafted[name] = out.metrics.num_drafted
        if name == "seeded":
            plain = make_llm(target).generate([PROMPTS[0]], params, use_tqdm=False)[0]
            assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    assert all(n <= 3 for n in drafted.values()), drafted  # one probe of k = 3 at most


def test_an_abandoned_stream_leaves_nothing_in_the_engine(target):
    """Found in review: a consumer that stopped early left its requests running in later calls."""
    llm = make_llm(target)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    stream = llm.generate_stream(PROMPTS[:3], params)
    next(stream)
    stream.close()  # what a `break` out of the loop does once the generator is collected
    assert llm.engine.requests == {} and not llm.engine.has_work()
    assert llm.engine.runner.num_cached_tokens == 0
    out = llm.generate([PROMPTS[3]], params, use_tqdm=False)
    assert out[0].outputs[0].token_ids == hf_greedy(target, PROMPTS[3], 12)
    assert llm.engine.requests == {}


def test_generate_that_raises_mid_flight_leaves_nothing(target, monkeypatch):
    llm = make_llm(target)
    calls = []

    def failing_step():
        calls.append(1)
        raise RuntimeError("a step failed")

    monkeypatch.setattr(llm.engine, "step", failing_step)
    with pytest.raises(RuntimeError, match="a step failed"):
        llm.generate(PROMPTS[:2], SamplingParams(max_tokens=4), use_tqdm=False)
    monkeypatch.undo()
    assert calls and llm.engine.requests == {} and not llm.engine.has_work()


def test_engines_never_touch_the_global_rng(target):
    """Found in review: every LLM reseeded torch's global RNG and drew from it. Each engine now
    draws from its own generator, seeded with EngineConfig.seed. (Same output from the engine
    seed needs the same drafts: the controller's k follows measured step times, so it is off
    here; a request's own seed keeps its k either way.)"""
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    fixed_k = {**NGRAM, "adaptive_k": False}
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = make_llm(target, fixed_k, seed=5).generate(PROMPTS[:2], params, use_tqdm=False)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(999)  # the global state does not matter either
    second = make_llm(target, fixed_k, seed=5).generate(PROMPTS[:2], params, use_tqdm=False)
    assert ids(first) == ids(second)


def test_logprob_texts_are_decoded_once_a_token_and_a_tokenizer():
    """Entries' texts come from a cache of each tokenizer's decode of one id: the same text,
    one decode a token, and two tokenizers' texts kept apart."""
    from engine.logprobs import entries_of

    class Counted:
        def __init__(self, prefix: str) -> None:
            self.prefix, self.calls = prefix, []

        def decode(self, ids: list[int]) -> str:
            self.calls.append(ids)
            return f"{self.prefix}{ids[0]}"

    a, b = Counted("a"), Counted("b")
    for tokenizer in (a, b, a):
        entries = entries_of([-0.1, -0.2], [1, 2], [[-0.1, -0.5], [-0.3, -0.2]],
                             [[4, 6], [5, 7]], [4, 7], tokenizer)
        assert [{t: e.decoded_token for t, e in entry.items()} for entry in entries] == [
            {4: f"{tokenizer.prefix}4", 6: f"{tokenizer.prefix}6"},
            {7: f"{tokenizer.prefix}7", 5: f"{tokenizer.prefix}5"}]
    assert sorted(a.calls) == [[4], [5], [6], [7]] and sorted(b.calls) == [[4], [5], [6], [7]]
