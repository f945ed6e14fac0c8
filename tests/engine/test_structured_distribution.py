"""Sampling under a grammar with speculation follows the masked target distribution.

The grammar ``x[a-e]y[a-e]`` forces ``x`` and ``y`` (drafted with certainty) and leaves two free
letters. The expected joint distribution of the two letters comes from Hugging Face forwards of
the target alone, masked by hand to the five letters (softmax at temperature 1); the engine's
samples, drafted by n-gram (one-hot drafts) or by a draft model (sampled drafts, mostly refused
by the grammar: their rejection draws from the residual), must pass Pearson's test against it.
A control moves 1% of the probability between the two likeliest cells: the same samples must
fail against that, so the test has the power to see an error of that size.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from engine.overlap import Pending
from tests.engine.llm_helpers import chi_square_pvalue
from tests.engine.structured_helpers import EOS_ID, char_tokenizer, char_vocab
from tests.engine.test_llm_greedy import noisy_copy

VOCAB = 128
LETTERS = "abcde"
PROMPT = "xayb xcyd xbye xeya"
NUM_SAMPLES = 60000
ALPHA = 0.01  # (a 1% error is seen with a power near 1 at 60000 samples, 0.6 at 20000)


@pytest.fixture(scope="module")
def target():
    # (logits scaled up: a random model's are nearly flat, which a 1% error hides in)
    model = tiny_model("llama", vocab_size=VOCAB, seed=3, eos_token_id=EOS_ID)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model


@torch.inference_mode()
def masked_joint(model, prompt_ids: list[int]) -> torch.Tensor:
    """``[5, 5]``: P(first letter i, second letter j) of the target under the grammar."""
    vocab = char_vocab()
    letters = [vocab[c] for c in LETTERS]

    def letter_probs(ids: list[int]) -> torch.Tensor:
        logits = model(torch.tensor([ids])).logits[0, -1].double()
        return torch.softmax(logits[letters], dim=0)  # the mask keeps only the letters

    first = letter_probs(prompt_ids + [vocab["x"]])
    joint = torch.stack([first[i] * letter_probs(prompt_ids + [vocab["x"], c, vocab["y"]])
                         for i, c in enumerate(letters)])
    return joint


def counts_of(llm: LLM, prompt_ids: list[int], calls: int = 1) -> torch.Tensor:
    """The two letters' counts over ``NUM_SAMPLES`` samples, in ``calls`` generate calls."""
    per_request = 500
    params = SamplingParams(n=per_request, temperature=1.0, max_tokens=8,
                            structured_outputs={"regex": "x[a-e]y[a-e]"})
    requests = NUM_SAMPLES // per_request
    outs = [out for _ in range(calls)
            for out in llm.generate([{"prompt_token_ids": prompt_ids}] * (requests // calls),
                                    params, use_tqdm=False)]
    counts = torch.zeros(5, 5, dtype=torch.float64)
    for out in outs:
        for c in out.outputs:
            assert c.finish_reason == "stop" and len(c.text) == 4, c.text
            counts[LETTERS.index(c.text[1]), LETTERS.index(c.text[3])] += 1
    return counts


def one_percent_off(joint: torch.Tensor) -> torch.Tensor:
    """``joint`` with 0.01 of probability moved from its likeliest cell to the next one."""
    flat = joint.flatten().clone()
    top = torch.argsort(flat, descending=True)
    flat[top[0]] -= 0.01
    flat[top[1]] += 0.01
    return flat.reshape(joint.shape)


@pytest.mark.parametrize("method", ["ngram", "draft_model", "overlapped"])
def test_samples_follow_the_masked_target_distribution(target, method, monkeypatch):
    """``overlapped``: no speculation, steps overlapped (``async_scheduling``); a call's
    samples all run at once (nobody waits), so that every token after the first is masked and
    sampled after the step before it committed (``engine.overlap.Pending``)."""
    tokenizer = char_tokenizer()
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}
    if method == "draft_model":
        spec = {"method": "draft_model", "model": noisy_copy(target, 0.5, seed=2),
                "tokenizer": tokenizer, "num_speculative_tokens": 3}
    engine_args = {}
    if method == "overlapped":
        spec, engine_args = None, {"async_scheduling": True, "structured_forced_tokens": 0}
    llm = LLM(model=target, tokenizer=tokenizer, speculative_config=spec, max_model_len=64,
              max_num_seqs=512, seed=11, **engine_args)
    launch, pending = llm.llm_engine._launch_next, []
    monkeypatch.setattr(llm.llm_engine, "_launch_next",
                        lambda flight: pending.append(isinstance(r := launch(flight), Pending))
                        or r)
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    calls = NUM_SAMPLES // 500 if spec is None else 1
    counts = counts_of(llm, prompt_ids, calls)
    m = llm.get_metrics()
    if spec is None:  # (each call: after x, the letter, y, the letter, the end, and a step
        # launched before the end was read, then dropped)
        assert sum(pending) == 5 * calls
    else:
        assert m.num_drafted > 0 and m.num_accepted > 0  # speculation ran, and drafts stayed
    joint = masked_joint(target, prompt_ids)
    print(f"{method}: p-value {chi_square_pvalue(counts, joint):.3g}, against a 1% error "
          f"{chi_square_pvalue(counts, one_percent_off(joint)):.3g}; acceptance "
          f"{m.num_accepted}/{m.num_drafted}")
    assert chi_square_pvalue(counts, joint) > ALPHA
    assert chi_square_pvalue(counts, one_percent_off(joint)) < ALPHA  # the control
