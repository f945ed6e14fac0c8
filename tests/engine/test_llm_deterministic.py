"""``deterministic=True``: every token's logits bitwise the same whatever the step holds.

Checked through what a user sees of the logits: each token's raw log-probability (a float32
value of its row's logits) must be *equal*, not close, whether the request runs alone without
speculation or among others arriving at other steps, with n-gram chains, a draft head's chains
or trees, a draft model, and preemption; so the greedy tokens are equal too. Seeded samples
likewise. On CPU the Triton kernels run through the interpreter (``TRITON_INTERPRET=1``, as
``make test`` sets); on a GPU compiled, in bf16, where plain decoding and verification would
otherwise round differently.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.runner import executor
from tests.engine.llm_helpers import staggered_outputs, tiny_tokenizer
from tests.engine.test_llm_greedy import noisy_copy
from tests.proposers.test_draft_head import VOCAB, save_repeating_head

MAX_TOKENS = 8
PROMPTS = [[5, 9, 3, 5, 9, 3], [7, 7, 2, 8, 30, 4, 4, 11, 6], [12, 3, 3, 3, 3], [20, 21]]
ARRIVALS = [0, 0, 2, 5]

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1",
        reason="on CPU the deterministic kernels run through Triton's interpreter "
               "(TRITON_INTERPRET=1, as make test sets)")),
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="the compiled kernels need a CUDA device")),
]


@pytest.fixture(scope="module")
def cpu_target():
    """A tiny target that repeats tokens often, and a head whose drafts repeat the newest token
    (``tests.proposers.test_draft_head``): drafts, tree branches included, are accepted and
    rejected, so tree steps keep nodes other than the root."""
    return tiny_model("llama", vocab_size=VOCAB, num_layers=2, seed=3)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, cpu_target):
    directory = tmp_path_factory.mktemp("head")
    save_repeating_head(cpu_target.config, directory)
    return directory


def on(model, device: str):
    """The model on ``device``: float32 on CPU, bf16 on a GPU (where rounding differs most)."""
    return model if device == "cpu" else tiny_model("llama", vocab_size=VOCAB, num_layers=2,
                                                    seed=3).to(device=device, dtype=torch.bfloat16)


def spec_for(method: str | None, target, head_dir) -> dict | None:
    if method is None:
        return None
    spec = {"method": method.removesuffix("_tree"), "num_speculative_tokens": 3,
            "adaptive_k": False}
    if method.startswith("eagle"):
        spec["model"] = str(head_dir)
    if method.endswith("_tree"):
        spec["draft_tree"] = [3, 2]
    if method == "draft_model":  # (perturbed on CPU, then where the target is)
        draft = noisy_copy(tiny_model("llama", vocab_size=VOCAB, num_layers=2, seed=3), 0.3,
                           seed=1).to(device=target.device, dtype=target.dtype)
        spec.update(model=draft, tokenizer=tiny_tokenizer(VOCAB))
    return spec


def make_llm(target, device: str, spec: dict | None = None, **kwargs) -> LLM:
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), device=device, max_num_seqs=4,
               speculative_config=spec, deterministic=True, **kwargs)


def staggered(llm: LLM, params: list[SamplingParams]) -> list[list[tuple[list[int], list]]]:
    """Prompt ``i`` added before engine step ``ARRIVALS[i]``; per request, per sample: its
    token ids and each token's raw logprob."""
    return [[(c.token_ids, chosen_logprobs(c)) for c in out.outputs]
            for out in staggered_outputs(llm, PROMPTS, params, ARRIVALS)]


def chosen_logprobs(sample) -> list[float]:
    return [entry[token].logprob for token, entry in zip(sample.token_ids, sample.logprobs,
                                                          strict=True)]


_ALONE: dict[tuple, list] = {}


def alone(target, device: str, params: list[SamplingParams]):
    """Each prompt alone, without speculation, one engine per prompt (kept per device and
    parameters: the tests compare against the same runs)."""
    key = (device, tuple(map(repr, params)))
    if key not in _ALONE:
        out = []
        for prompt, p in zip(PROMPTS, params, strict=True):
            (result,) = make_llm(target, device).generate([prompt], p, use_tqdm=False)
            out.append([(c.token_ids, chosen_logprobs(c)) for c in result.outputs])
        _ALONE[key] = out
    return _ALONE[key]


GREEDY = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)] * 4
SEEDED = [SamplingParams(temperature=0.9, top_k=12, seed=11, max_tokens=MAX_TOKENS,
                         ignore_eos=True, logprobs=0),
          SamplingParams(temperature=1.1, top_p=0.9, seed=3, max_tokens=MAX_TOKENS,
                         ignore_eos=True, logprobs=0),
          SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0),
          SamplingParams(temperature=0.7, seed=5, n=2, max_tokens=MAX_TOKENS, ignore_eos=True,
                         logprobs=0)]


@pytest.mark.parametrize("device", DEVICES)
# (a tree engine drafts chains too, once more than two sequences run: eagle's chains are in it)
@pytest.mark.parametrize("method", [None, "ngram", "eagle_tree", "draft_model"])
def test_greedy_logprobs_are_bitwise_those_of_each_request_alone(cpu_target, head_dir, device,
                                                                 method):
    target = on(cpu_target, device)
    expected = alone(target, device, GREEDY)
    llm = make_llm(target, device, spec_for(method, target, head_dir))
    assert staggered(llm, GREEDY) == expected  # (token ids and float logprobs: ==, not close)
    if method is not None:
        assert llm.get_metrics().num_accepted > 0  # (drafts were kept)


@pytest.mark.parametrize("device", DEVICES)
def test_preempted_and_recomputed_requests_keep_their_logprobs(cpu_target, device):
    """A KV cache too small for the four requests at once: some are preempted and recomputed
    (their prompt and output so far in a prefill chunk), and every value stays the same. (With
    speculation the engine trims drafts to the spare rows first, and these requests then finish
    without preemption.)"""
    target = on(cpu_target, device)
    expected = alone(target, device, GREEDY)
    llm = make_llm(target, device, kv_cache_tokens=32, max_model_len=20)
    assert staggered(llm, GREEDY) == expected
    assert llm.get_metrics().num_preemptions > 0


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_samples_are_bitwise_those_of_each_request_alone(cpu_target, head_dir, device):
    target = on(cpu_target, device)
    expected = alone(target, device, SEEDED)
    llm = make_llm(target, device, spec_for("eagle", target, head_dir))
    assert staggered(llm, SEEDED) == expected


def test_the_option_names_what_it_cannot_run_with(cpu_target, monkeypatch):
    for kwargs, field in (({"attention_backend": "gather"}, "attention_backend='gather'"),
                          ({"fused_ops": False}, "fused_ops=False"),
                          ({"tensor_parallel_size": 2, "model": "m"}, "tensor_parallel_size=2")):
        with pytest.raises(ValueError, match=f"EngineConfig.{field} is invalid"):
            EngineConfig(deterministic=True, **kwargs)
    with pytest.raises(ValueError, match="EngineConfig.deterministic='yes' is invalid"):
        EngineConfig(deterministic="yes")
    monkeypatch.setattr(executor, "_INTERPRETED", False)
    with pytest.raises(ValueError, match=r"deterministic=True needs a CUDA device \(or "
                                         r"TRITON_INTERPRET=1 on CPU\), got cpu"):
        make_llm(cpu_target, "cpu")
