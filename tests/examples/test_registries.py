"""Registries as the only switch: a proposer and a sampler registered from user code (no package
file edited) are accepted by SpeculativeConfig, listed by the CLI and run by the engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cli.args import build_parser
from engine.config import SpeculativeConfig
from samplers import RejectionSampler, register_sampler
from tests.conftest import tiny_model
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from custom_proposer import OracleProposer, register_oracle  # noqa: E402

VOCAB = 48
MAX_TOKENS = 24
PROMPTS = [[5, 9, 13, 7], [20, 21, 3]]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=3)


@pytest.fixture(scope="module")
def references(target):
    return [p + hf_greedy(target, p, MAX_TOKENS) for p in PROMPTS]


def run(target, method: str, **spec) -> LLM:
    return LLM(target, tokenizer=tiny_tokenizer(VOCAB), device="cpu", speculative_config={
        "method": method, "num_speculative_tokens": 4, "adaptive_k": False, **spec})


def greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.6])
def test_a_proposer_registered_from_a_script_runs(target, references, alpha):
    name = f"oracle_{int(alpha * 100)}"
    register_oracle(name, references, alpha)
    llm = run(target, name)
    assert greedy(llm) == [r[len(p):] for r, p in zip(references, PROMPTS, strict=True)]
    metrics = llm.get_metrics()
    assert metrics.num_drafted > 20
    if alpha in (0.0, 1.0):
        assert metrics.acceptance_rate == alpha
    else:
        assert 0.2 < metrics.acceptance_rate < 0.95


def test_the_cli_lists_registered_proposers_and_samplers(references):
    register_oracle("oracle_cli", references, 0.5)
    parser, _ = build_parser()
    method = next(a for a in parser._actions if a.dest == "spec__method")
    assert {"oracle_cli", "ngram", "draft_model", "early_exit", "none"} <= set(method.choices)
    acceptance = next(a for a in parser._actions if a.dest == "spec__acceptance_method")
    assert {"rejection", "greedy", "typical"} <= set(acceptance.choices)


def test_unregistered_names_are_refused_with_the_registered_ones():
    with pytest.raises(ValueError, match=r"SpeculativeConfig\.method='oracle_nope'.*ngram"):
        SpeculativeConfig(method="oracle_nope")
    with pytest.raises(ValueError, match="already registered"):
        register_oracle("ngram", [], 0.5)


class CountingSampler(RejectionSampler):
    """Rejection sampling that counts its verification calls."""

    calls = 0

    def verify(self, *args, **kwargs) -> torch.Tensor:
        type(self).calls += 1
        return super().verify(*args, **kwargs)


def test_a_sampler_registered_from_a_script_verifies(target, references):
    register_sampler("counting_rejection")(CountingSampler)
    llm = run(target, "ngram", acceptance_method="counting_rejection")
    params = SamplingParams(temperature=0.8, seed=11, max_tokens=MAX_TOKENS)
    out = llm.generate(PROMPTS, params, use_tqdm=False)
    assert CountingSampler.calls > 0
    baseline = run(target, "ngram").generate(PROMPTS, params, use_tqdm=False)
    # the same rule with the same seeds: the same tokens
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in baseline]


def test_the_oracle_checks_alpha():
    with pytest.raises(ValueError, match="alpha=1.5"):
        OracleProposer([], 1.5, VOCAB)
