"""The inputs of chosen decoder layers (an EAGLE-3 head's features), returned by the runner's
forward itself in every step layout, equal Hugging Face's ``hidden_states`` of the whole
sequence at the same positions."""

from __future__ import annotations

import random

import pytest
import torch

from engine.runner import step_layout
from engine.runner.model_runner import ModelRunner
from tests.conftest import tiny_model

LAYERS = (0, 2, 3)
ATOL = 2e-5


def hf_layer_inputs(model, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, 3 * hidden]``: the inputs of LAYERS (hidden_states[i]: layer i's input) and the
    final normed states ``[n, hidden]`` of a whole sequence."""
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    return (torch.cat([out.hidden_states[i][0] for i in LAYERS], -1),
            out.last_hidden_state[0])


def check(model, contexts: dict[int, list[int]], slots: list[int], new: list[list[int]],
          out) -> None:
    row = 0
    for slot, ids in zip(slots, new, strict=True):
        contexts[slot] = contexts.get(slot, []) + ids
        aux, final = hf_layer_inputs(model, contexts[slot])
        n = len(ids)
        torch.testing.assert_close(out.aux_hidden[row:row + n], aux[-n:], atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(out.hidden[row:row + n], final[-n:], atol=ATOL, rtol=ATOL)
        row += n
    assert out.aux_hidden.shape == (row, 3 * model.config.hidden_size)


@pytest.mark.parametrize("layout", ["padded", "graph_buckets_folded", "split"])
def test_kept_layer_inputs_equal_hugging_face_in_every_layout(monkeypatch, layout):
    model = tiny_model("llama", vocab_size=96, seed=6, num_layers=4)
    runner = ModelRunner(model, max_num_seqs=5, max_num_tokens=200, max_model_len=60)
    runner.keep_aux_layers(LAYERS)
    runner.fold_mixed = layout == "graph_buckets_folded"
    runner.split_mixed = layout == "split"
    if layout == "graph_buckets_folded":  # (the graphs' padded layout, run eagerly)
        runner.use_graph_buckets(5, capture=False)
    splits = []
    if layout == "split":
        monkeypatch.setattr(step_layout, "SPLIT_MIN_SAVED", 1)
        forward_split = ModelRunner._forward_split
        monkeypatch.setattr(ModelRunner, "_forward_split", lambda self, plan, *a: (
            splits.append(plan.groups), forward_split(self, plan, *a))[1])
    rng = random.Random(3)
    prompts = [[rng.randrange(96) for _ in range(n)] for n in (5, 7, 30, 3)]
    slots = [runner.allocate_slot() for _ in range(4)]
    contexts: dict[int, list[int]] = {}
    steps = [(slots[:2], prompts[:2]), (slots[:2], [[1], [2]]),
             ([slots[0], slots[2], slots[1], slots[3]], [[4, 5], prompts[2], [6], prompts[3]]),
             (slots, [[7, 8, 9], [10], [11, 12], [13]])]
    for step_slots, new in steps:
        out = runner.forward(step_slots, new, keep_hidden=True)
        check(model, contexts, step_slots, new, out)
    if layout == "graph_buckets_folded":
        assert runner.graphs.num_replays >= 3
    assert bool(splits) == (layout == "split")
    assert runner.forward([slots[0]], [[3]]).aux_hidden is None  # (not asked for features)


def test_kept_layers_are_checked_and_the_default_keeps_none():
    model = tiny_model("llama", vocab_size=96, seed=6, num_layers=4)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20)
    slot = runner.allocate_slot()
    assert runner.forward([slot], [[1, 2]], keep_hidden=True).aux_hidden is None
    for bad in ([], [4], [-1]):
        with pytest.raises(ValueError, match="aux layer ids"):
            runner.keep_aux_layers(bad)
