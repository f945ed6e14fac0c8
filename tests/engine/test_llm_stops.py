"""Every stop condition through the engine, including a stop inside an accepted draft run.

The prompt is a seed text followed by the target's own greedy continuation, which has fallen into
a loop: n-gram drafts (k = 5) of the loop are accepted from the first step on, so stops on the
first output tokens fall inside an accepted run and must cut it there. ``dropped_after_stop``
proves the cut happened mid-run: tokens the verifier had accepted were not returned.
"""

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer, words

VOCAB = 32
SEED_TEXT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
K5 = {"method": "ngram", "num_speculative_tokens": 5, "adaptive_k": False}


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="module")
def prompt(target):
    return SEED_TEXT + hf_greedy(target, SEED_TEXT, 24)


@pytest.fixture(scope="module")
def reference(target, prompt):
    return hf_greedy(target, prompt, 30)


def generate(model, prompt, **params):
    llm = LLM(model=model, tokenizer=tiny_tokenizer(VOCAB), speculative_config=K5)
    out = llm.generate([prompt], SamplingParams(temperature=0, **params), use_tqdm=False)[0]
    return out.outputs[0], out.metrics


def dropped_after_stop(metrics) -> int:
    """Verified tokens (accepted drafts + one per step) that were not kept."""
    return metrics.num_accepted + metrics.num_steps - metrics.num_generated


def test_the_prompt_loops_so_runs_are_accepted(target, prompt, reference):
    out, metrics = generate(target, prompt, max_tokens=30, ignore_eos=True)
    assert out.token_ids == reference
    assert metrics.num_accepted >= 10
    assert reference[1] not in reference[:1] and reference[2] not in reference[:2]


def test_stop_token_inside_an_accepted_run(target, prompt, reference):
    stop_id = reference[1]
    out, metrics = generate(target, prompt, max_tokens=30, stop_token_ids=[stop_id],
                            ignore_eos=True)
    assert out.token_ids == reference[:2]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    assert out.text == " " + words(reference[:1])
    assert dropped_after_stop(metrics) > 0


def test_stop_string_inside_an_accepted_run(target, prompt, reference):
    stop = words(reference[1:3])
    out, metrics = generate(target, prompt, max_tokens=30, stop=[stop], ignore_eos=True)
    assert out.token_ids == reference[:3]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == " " + words(reference[:1]) + " "
    assert dropped_after_stop(metrics) > 0
    included, _ = generate(target, prompt, max_tokens=30, stop=[stop], ignore_eos=True,
                           include_stop_str_in_output=True)
    assert included.text == " " + words(reference[:3])


def test_eos_inside_an_accepted_run(prompt, reference):
    model = tiny_model("llama", vocab_size=VOCAB, seed=0)
    model.generation_config.eos_token_id = reference[2]
    out, metrics = generate(model, prompt, max_tokens=30)
    assert out.token_ids == reference[:3]
    assert (out.finish_reason, out.stop_reason) == ("stop", None)
    assert dropped_after_stop(metrics) > 0
    ignored, _ = generate(model, prompt, max_tokens=30, ignore_eos=True)
    assert ignored.token_ids == reference


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 13])
def test_max_tokens(target, prompt, reference, max_tokens):
    out, metrics = generate(target, prompt, max_tokens=max_tokens, ignore_eos=True)
    assert out.token_ids == reference[:max_tokens]
    assert out.finish_reason == "length"


def test_context_length_ends_with_length(target, prompt, reference):
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=K5,
              max_model_len=len(prompt) + 9)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == reference[:9] and out.finish_reason == "length"


def test_min_tokens_masks_stops_like_hf(target, prompt, reference):
    stop_id = reference[1]
    out, _ = generate(target, prompt, max_tokens=30, min_tokens=6, stop_token_ids=[stop_id],
                      ignore_eos=True)
    with torch.inference_mode():
        hf = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=30,
                             min_new_tokens=6, eos_token_id=stop_id, pad_token_id=0)
    expected = hf[0, len(prompt):].tolist()
    assert out.token_ids == expected
    assert stop_id not in out.token_ids[:6]
    assert out.token_ids[-1] == stop_id and out.finish_reason == "stop"
