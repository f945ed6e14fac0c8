"""Sampled output follows the target's distribution, with every logits-processing option.

The first two tokens of many seeded samples are histogrammed and compared (chi-square) with the
exact joint probabilities, computed here from full forwards of the target and a plain
re-statement of each option (not the engine's code). Drafts are proposed from the first step on,
so the second token is often an accepted draft scored at a position whose penalties depend on the
first, and rejections exercise the recovered distribution.
"""

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import EOS_ID, chi_square_pvalue, random_head_dir, tiny_tokenizer
from tests.engine.test_llm_greedy import noisy_copy

VOCAB = 8
PROMPT = [3, 4, 5, 3, 4]  # n-gram lookup drafts [5, 3, 4] at the first step
NUM_SAMPLES = 1500


@pytest.fixture(scope="module")
def target():
    model = tiny_model("llama", vocab_size=VOCAB, seed=4)
    model.generation_config.eos_token_id = EOS_ID
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # peakier next-token distributions than random init gives
    return model


def reference_probs(logits: torch.Tensor, p: SamplingParams, out: list[int]) -> torch.Tensor:
    """The processed next-token distribution after ``PROMPT + out`` (float64)."""
    z = logits.double().clone()
    if p.allowed_token_ids is not None:
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        keep[p.allowed_token_ids] = True
        z[~keep] = -torch.inf
    for word in p.bad_words or []:
        z[int(word[1:])] = -torch.inf  # one-token words "w<i>"
    if len(out) < p.min_tokens:
        for t in p.stop_token_ids + ([] if p.ignore_eos else [EOS_ID]):
            z[t] = -torch.inf
    for t, b in (p.logit_bias or {}).items():
        z[t] += b
    for t in set(PROMPT + out):
        z[t] = z[t] / p.repetition_penalty if z[t] > 0 else z[t] * p.repetition_penalty
    for t in set(out):
        z[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
    z = z / p.temperature
    if p.top_k > 0:
        z[z < torch.topk(z, p.top_k).values[-1]] = -torch.inf
    probs = torch.softmax(z, dim=0)
    if p.top_p < 1.0:
        order = torch.argsort(probs, descending=True)
        mass_before = torch.cumsum(probs[order], 0) - probs[order]
        drop = order[mass_before >= p.top_p]
        probs[drop] = 0.0
        probs = probs / probs.sum()
    return probs


@torch.inference_mode()
def exact_joint(model, p: SamplingParams) -> torch.Tensor:
    """``[VOCAB, VOCAB]``: P(first = a, second = b) from full forwards."""
    first = reference_probs(model(torch.tensor([PROMPT])).logits[0, -1], p, [])
    seqs = torch.tensor([PROMPT + [a] for a in range(VOCAB)])
    last = model(seqs).logits[:, -1]  # [VOCAB, VOCAB]
    second = torch.stack([reference_probs(last[a], p, [a]) for a in range(VOCAB)])
    return first[:, None] * second


def sampled_joint(llm: LLM, p: SamplingParams) -> torch.Tensor:
    """Counts of the first two tokens of every sample (of ``p.max_tokens``)."""
    out = llm.generate([PROMPT], p, use_tqdm=False)[0]
    counts = torch.zeros(VOCAB, VOCAB)
    for sample in out.outputs:
        assert len(sample.token_ids) == p.max_tokens
        counts[sample.token_ids[0], sample.token_ids[1]] += 1
    return counts


CASES = {
    "temperature": dict(temperature=0.7),
    "top_k_top_p": dict(temperature=1.3, top_k=5, top_p=0.8),
    "penalties": dict(repetition_penalty=1.6, frequency_penalty=0.7, presence_penalty=0.5),
    "bias_allowed_bad_words": dict(logit_bias={5: 1.5, 6: -1.0}, bad_words=["w7"],
                                   allowed_token_ids=[0, 3, 4, 5, 6, 7]),
    "min_tokens": dict(min_tokens=2, ignore_eos=False, stop_token_ids=[6], temperature=1.5),
}


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, target):
    """A random draft head for the target (method eagle): its drafts are right by chance."""
    return random_head_dir(tmp_path_factory, target.config)


@pytest.fixture(scope="module")
def eagle3_dir(tmp_path_factory, target):
    """A random EAGLE-3 head in the speculators layout whose draft vocabulary is 5 of the 8
    tokens (its drafts are right by chance, and never one of the other 3)."""
    from tests.proposers.speculators_helpers import write_eagle3_dir

    directory = tmp_path_factory.mktemp("eagle3")
    write_eagle3_dir(directory, target.config, [6, 3, 4, 5, 0], seed=2)
    return directory


@pytest.mark.parametrize("method, case", [("ngram", case) for case in CASES] + [
    ("draft_model", "top_k_top_p"), ("draft_model", "penalties"),
    ("eagle", "top_k_top_p"), ("eagle", "penalties"),
    ("eagle3", "top_k_top_p"), ("eagle3", "penalties")])
def test_sampled_tokens_follow_the_target(target, head_dir, eagle3_dir, method, case):
    kwargs = dict(ignore_eos=True) | CASES[case]
    # (a draft head's first drafts come at the second token, from the prompt's feature: a third
    # token gives them a draft to verify at the second position)
    params = SamplingParams(n=NUM_SAMPLES, seed=1234,
                            max_tokens=3 if method in ("eagle", "eagle3") else 2, **kwargs)
    spec = {"method": method, "num_speculative_tokens": 3, "adaptive_k": False}
    if method == "draft_model":
        spec.update(model=noisy_copy(target, 0.5, seed=2), tokenizer=tiny_tokenizer(VOCAB))
    if method == "eagle":
        spec.update(model=str(head_dir))
    if method == "eagle3":
        spec.update(model=str(eagle3_dir))
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec,
              max_num_seqs=256)
    counts = sampled_joint(llm, params)
    expected = exact_joint(target, params)
    metrics = llm.get_metrics()
    assert 0 < metrics.num_accepted < metrics.num_drafted
    assert chi_square_pvalue(counts, expected) > 1e-3


def test_a_wrong_distribution_is_detected(target):
    """The test has power: samples at temperature 0.7 do not pass as temperature 1."""
    params = SamplingParams(n=NUM_SAMPLES, seed=1234, max_tokens=2, temperature=0.7,
                            ignore_eos=True)
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=256)
    counts = sampled_joint(llm, params)
    wrong = exact_joint(target, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(counts, wrong) < 1e-6


@pytest.mark.parametrize("case", ["temperature", "top_k_top_p"])
def test_sampled_tokens_through_draft_trees_follow_the_target(target, head_dir, monkeypatch,
                                                              case):
    """Unseeded samples (the engine's seed) verified through the head's draft trees, by
    multi-candidate rejection: the first two tokens' joint distribution is the target's. Trees
    go to every sequence here (the batch limit is a speed policy, not a correctness one)."""
    from engine import llm_engine
    from samplers import tree_verify

    monkeypatch.setattr(llm_engine, "TREE_MAX_SEQS", 10_000)
    params = SamplingParams(n=NUM_SAMPLES, max_tokens=3, ignore_eos=True, **CASES[case])
    spec = {"method": "eagle", "model": str(head_dir), "num_speculative_tokens": 3,
            "adaptive_k": False, "draft_tree": [3, 2], "draft_tree_sampling": True}
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec,
              max_num_seqs=256, seed=77)
    kept = []  # every tree's kept branch
    walk = tree_verify.walk

    def recording(*args):
        path, tokens = walk(*args)
        kept.append(path)
        return path, tokens

    monkeypatch.setattr(tree_verify, "walk", recording)
    counts = sampled_joint(llm, params)
    moved = [p for p in kept if p and p != list(range(len(p)))]
    metrics = llm.get_metrics()
    # (some kept a candidate other than the head's likeliest)
    assert 0 < metrics.num_accepted < metrics.num_drafted and len(moved) > 50
    assert chi_square_pvalue(counts, exact_joint(target, params)) > 1e-3
