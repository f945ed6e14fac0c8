"""The engine on a model placed by accelerate (issue 19's pipeline layout): every proposer, the
verification sampler and rollback work when the embeddings, the layers and the output head
compute behind accelerate's hooks, and greedy output stays Hugging Face's.

On CPU the spread case is accelerate's offload (every weight waits on ``meta`` and is brought in
per forward, as for the ``cpu`` entries of a ``device_map``); with two GPUs the model is split
between them (embeddings and the first layer on one, the rest and the head on the other).
"""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate import cpu_offload, dispatch_model
from conftest import tiny_model

from engine import LLM, SamplingParams
from tests.engine.llm_helpers import tiny_tokenizer
from tests.engine.test_llm_greedy import (
    MAX_TOKENS,
    VOCAB,
    noisy_copy,
    prompts,
    reference,
    run_staggered,
    spec,
)
from tests.proposers.test_draft_head import save_repeating_head

LAYOUTS = [pytest.param("offload", id="cpu-offload"),
           pytest.param("two-gpus", id="two-gpus", marks=pytest.mark.skipif(
               torch.cuda.device_count() < 2, reason="splits a model over two GPUs"))]


def spread(model, layout: str):
    model = copy.deepcopy(model)
    if layout == "offload":
        return cpu_offload(model, execution_device="cpu")
    first, second = "cuda:0", "cuda:1"
    return dispatch_model(model.cuda(), {
        "model.embed_tokens": first, "model.rotary_emb": first, "model.layers.0": first,
        "model.layers.1": second, "model.norm": second, "lm_head": second})


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("method", [None, "ngram", "draft_model", "early_exit", "eagle"])
def test_speculation_on_a_spread_model_equals_hf(target, tmp_path, layout, method):
    model = spread(target, layout)
    # (offload: the weights wait on meta until a forward brings them in)
    assert next(model.model.layers[1].parameters()).device == torch.device(
        "meta" if layout == "offload" else "cuda:1")
    config = None if method is None else spec(method, 3, noisy_copy(target, 0.3, seed=1))
    if method == "eagle":
        save_repeating_head(target.config, tmp_path)
        config["model"] = str(tmp_path)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(VOCAB), speculative_config=config,
              max_num_seqs=4)
    batch = prompts(6)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run_staggered(llm, batch, params, [0, 0, 1, 2, 5, 9])
    assert outputs == [reference(target, p) for p in batch]
    stats = llm.engine.metrics
    if method is not None:  # (drafts verified, some rejected: rollback ran)
        assert 0 < stats.num_accepted < stats.num_drafted
