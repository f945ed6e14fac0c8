"""The rotary embedding's cos and sin from a table made once (engine/runner/rotary_table.py):
bit for bit transformers' own inside the runner's forwards, transformers' code outside them,
the same logits as a model without the table; a later runner's longer context grows the
table; rotary types whose frequencies change with the length keep their code."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.runner.fused_ops import fused_forward
from engine.runner.rotary_table import install_rotary_table
from tests.conftest import tiny_model


def rotary(model):
    return model.model.rotary_emb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tables_rows_are_transformers_cos_and_sin_bit_for_bit(dtype):
    model = tiny_model("llama", seed=1).to(dtype)
    module = rotary(model)
    original = module.forward
    assert install_rotary_table(model, 300) == 1
    positions = torch.randint(0, 300, (3, 7), generator=torch.Generator().manual_seed(0))
    x = torch.empty(0, dtype=dtype)
    with fused_forward():
        cos, sin = module(x, positions)
    want_cos, want_sin = original(x, positions)
    assert cos.dtype == dtype and cos.shape == want_cos.shape == (3, 7, want_cos.shape[-1])
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


def test_outside_the_runners_forwards_transformers_code_runs(monkeypatch):
    model = tiny_model("llama", seed=1)
    install_rotary_table(model, 64)
    module = rotary(model)
    calls = []
    original = module._specdec_original
    monkeypatch.setattr(module, "_specdec_original",
                        lambda *a: calls.append(1) or original(*a))
    module(torch.empty(0), torch.arange(5)[None])
    assert calls == [1]
    with fused_forward():
        module(torch.empty(0), torch.arange(5)[None])
    assert calls == [1]  # (the table's rows: no call)


def test_a_models_logits_are_the_same_with_the_table(monkeypatch):
    model = tiny_model("llama", seed=2)
    plain = copy.deepcopy(model)
    install_rotary_table(model, 128)
    monkeypatch.setattr(rotary(model), "_specdec_original", None)  # (the table's rows only)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(40, 49).repeat(2, 1)
    with torch.no_grad(), fused_forward():
        got = model(input_ids=ids, position_ids=positions).logits
    with torch.no_grad():
        want = plain(input_ids=ids, position_ids=positions).logits
    assert torch.equal(got, want)


def test_a_longer_context_remakes_the_table_and_a_shorter_one_keeps_it():
    model = tiny_model("llama", seed=1)
    install_rotary_table(model, 64)
    table = rotary(model)._specdec_table
    assert install_rotary_table(model, 32) == 1 and rotary(model)._specdec_table is table
    assert install_rotary_table(model, 200) == 1
    assert rotary(model)._specdec_table.shape[0] == 200
    positions = torch.tensor([[150, 199]])
    with fused_forward():
        cos, _ = rotary(model)(torch.empty(0), positions)
    assert torch.equal(cos, rotary(model)._specdec_original(torch.empty(0), positions)[0])


def test_a_rotary_type_that_rescales_with_the_length_keeps_its_code():
    model = tiny_model("llama", seed=1)
    rotary(model).rope_type = "dynamic"
    assert install_rotary_table(model, 64) == 0
    assert "forward" not in rotary(model).__dict__
