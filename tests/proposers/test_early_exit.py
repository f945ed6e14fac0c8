"""Early-exit self-draft: a weight-sharing view of the target's first N layers."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from proposers.base import ProposeRequest
from proposers.early_exit import early_exit_model
from samplers.sampling_params import SamplingParams
from tests.conftest import tiny_config, tiny_model
from tests.proposers.proposer_helpers import build, make_context

VOCAB = 80


def truncated_copy(family: str, target, num_layers: int):
    """Oracle: a fresh model built with num_layers layers, loaded with the target's weights."""
    config = tiny_config(family, vocab_size=VOCAB, num_layers=num_layers)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    wanted = model.state_dict()
    model.load_state_dict({k: v for k, v in target.state_dict().items() if k in wanted})
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_early_exit_shares_weights_and_equals_a_truncated_model(family):
    target = tiny_model(family, vocab_size=VOCAB, num_layers=4, seed=8)
    draft = early_exit_model(target, 2)
    target_ptrs = {p.data_ptr() for p in target.parameters()}
    draft_params = list(draft.parameters())
    assert draft_params and all(p.data_ptr() in target_ptrs for p in draft_params)
    assert len(list(target.parameters())) > len(draft_params)  # layers 2-3 are not in the draft
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4
    assert len(draft.base_model.layers if family != "gpt2" else draft.base_model.h) == 2
    ids = torch.tensor([[5, 17, 3, 60, 22, 9]])
    oracle = truncated_copy(family, target, 2)
    with torch.inference_mode():
        torch.testing.assert_close(draft(input_ids=ids).logits, oracle(input_ids=ids).logits,
                                   atol=1e-5, rtol=0)
        assert target(input_ids=ids).logits.shape == (1, 6, VOCAB)  # the target is untouched


def test_early_exit_proposer_drafts_like_the_truncated_model():
    target = tiny_model("llama", vocab_size=VOCAB, num_layers=4, seed=9)
    proposer = build("early_exit", make_context(target, 2, 64), num_early_exit_layers=1,
                     draft_sample_method="greedy")
    oracle = truncated_copy("llama", target, 1)
    contexts = [[1, 2, 3, 4, 5], [7, 7]]
    proposal = proposer.propose([ProposeRequest(i, c, 4, SamplingParams(temperature=0))
                                 for i, c in enumerate(contexts)])
    with torch.inference_mode():
        want = [oracle.generate(torch.tensor([c]), max_new_tokens=4, min_new_tokens=4,
                                do_sample=False, pad_token_id=0)[0, len(c):].tolist()
                for c in contexts]
    assert proposal.draft_token_ids == want
    assert proposal.draft_probs is None


@pytest.mark.parametrize("num_layers", [0, 5, 1.0])
def test_bad_depth(num_layers):
    target = tiny_model("llama", vocab_size=VOCAB, num_layers=4)
    with pytest.raises(ValueError, match="num_layers"):
        early_exit_model(target, num_layers)


@pytest.mark.slow
def test_early_exit_on_the_default_model(default_model):
    """Full depth drafts exactly the target's greedy tokens; a shallow draft shares its weights."""
    target, tokenizer = default_model
    context = tokenizer("The capital of France is Paris. The capital of Italy is")["input_ids"]
    shallow = early_exit_model(target, 8)
    target_ptrs = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in target_ptrs for p in shallow.parameters())
    proposer = build("early_exit", make_context(target, 1, 64), num_early_exit_layers=30,
                     draft_sample_method="greedy")
    drafts = proposer.propose([ProposeRequest(0, context, 4, SamplingParams(temperature=0))])
    with torch.inference_mode():
        want = target.generate(torch.tensor([context]), max_new_tokens=4, min_new_tokens=4,
                               do_sample=False)[0, len(context):].tolist()
    assert drafts.draft_token_ids == [want]
