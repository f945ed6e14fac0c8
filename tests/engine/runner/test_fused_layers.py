"""Decoder layers whose residual adds run in the next norm's kernel (engine/runner/fused_layers.py):
the add-and-norm kernel against PyTorch's add and transformers' norm, whole models against the
fused norms alone (the same bits) and transformers, the stored norm result taken only by its own
input, and the layers left alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from engine.runner import fused_layers, fused_ops
from engine.runner.fused_layers import add_rms_norm, add_rms_norm_reference, install_fused_layers
from engine.runner.fused_ops import (
    PRECOMPUTED,
    _same,
    fused_forward,
    install_fused_ops,
    rms_norm,
)
from engine.runner.model_runner import ModelRunner
from tests.conftest import DEVICE, INTERPRETED, needs_triton, tiny_model
from tests.engine.runner.test_fused_ops import counting
from tests.engine.runner.test_model_runner import random_schedule

pytestmark = needs_triton


@pytest.mark.parametrize("hidden", [64, 576])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rms_norm_is_the_add_then_the_norm(hidden, dtype):
    torch.manual_seed(hidden)
    norm = LlamaRMSNorm(hidden, eps=1e-5).to(DEVICE, dtype)
    norm.weight.data.normal_()
    x = torch.randn(3, 5, hidden, dtype=dtype, device=DEVICE) * 4  # [3, 5, hidden]
    residual = torch.randn(3, 5, hidden, dtype=dtype, device=DEVICE) * 4
    total, normed = add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)
    assert total.dtype == dtype and normed.dtype == dtype and normed.shape == x.shape
    assert torch.equal(total, residual + x)  # (rounded as PyTorch's add, compiled too)
    # the fused norm's own arithmetic on the sum: what a fused norm after a separate add gives
    assert torch.equal(normed, rms_norm(residual + x, norm.weight, norm.variance_epsilon))
    want = norm(residual + x)
    reference = add_rms_norm_reference(x, residual, norm.weight, norm.variance_epsilon)
    assert torch.equal(reference[0], residual + x) and torch.equal(reference[1], want)
    if INTERPRETED and dtype == torch.bfloat16:
        assert torch.equal(normed, want)
    else:  # (float32, or compiled: the sum of squares in another order, rsqrt approximated)
        assert _same(normed, want)
    swapped = add_rms_norm(x, residual, norm.weight.flip(0), norm.variance_epsilon)[1]
    assert not torch.equal(swapped, normed)  # (the weight matters: the checks can fail)


def test_add_rms_norm_takes_strided_rows_and_refuses_mismatched_inputs():
    torch.manual_seed(2)
    weight = torch.randn(48, device=DEVICE)
    x = torch.randn(6, 96, device=DEVICE)[:, ::2]  # [6, 48] with a strided last dimension
    residual = torch.randn(48, 6, device=DEVICE).t()  # [6, 48] transposed
    total, normed = add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(total, residual + x)
    torch.testing.assert_close(normed, rms_norm(residual + x, weight, 1e-6), rtol=0, atol=0)
    with pytest.raises(ValueError, match="one shape and dtype"):
        add_rms_norm(x, residual.double(), weight, 1e-6)


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layers_give_the_fused_norms_bits(family, dtype):
    model = tiny_model(family, num_layers=3, dtype=dtype)
    ids = torch.tensor([[5, 9, 2, 77, 31, 4]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        install_fused_ops(model, torch.device("cpu"))
        with fused_forward():
            norms_only = model(input_ids=ids).logits
        assert install_fused_layers(model) == 3
        assert install_fused_layers(model) == 3  # (a second runner finds them taken)
        assert torch.equal(model(input_ids=ids).logits, before)  # (outside a runner forward)
        with fused_forward():
            fused = model(input_ids=ids).logits
    assert torch.equal(fused, norms_only)
    # (and close to transformers' own; the layers' state dict is unchanged)
    torch.testing.assert_close(fused, before, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                               atol=2e-2 if dtype == torch.bfloat16 else 1e-5)
    assert list(model.state_dict()) == list(tiny_model(family, num_layers=3).state_dict())


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
def test_each_add_runs_in_a_norms_kernel(monkeypatch):
    model = tiny_model("llama", num_layers=2)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20,
                         fused_ops=True)
    assert runner.fused["layers"] == 2
    calls = {"norm": 0, "add_norm": 0}
    monkeypatch.setattr(fused_layers, "add_rms_norm", counting(calls, "add_norm", add_rms_norm))
    monkeypatch.setattr(fused_ops, "rms_norm", counting(calls, "norm", rms_norm))
    slot = runner.allocate_slot()
    runner.forward([slot], [[3, 4, 5]])
    # the first layer's input norm alone runs on its own; two adds a layer, each with a norm
    # (the post-attention one, then the next layer's input norm or the final norm)
    assert calls == {"norm": 1, "add_norm": 4}


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
def test_a_norm_takes_the_stored_result_for_its_own_input_only():
    norm = LlamaRMSNorm(16, eps=1e-6)
    norm.weight.data.normal_()
    model = nn.Sequential(norm)
    install_fused_ops(model, torch.device("cpu"))
    x, other = torch.randn(2, 16), torch.randn(2, 16)
    stored = torch.full((2, 16), 7.0)
    with fused_forward():
        norm.__dict__[PRECOMPUTED] = (x, stored)
        assert norm(x) is stored
        assert PRECOMPUTED not in norm.__dict__  # (taken once)
        norm.__dict__[PRECOMPUTED] = (x, stored)
        # another tensor (a caller that ran part of the layers): computed, the stored pair gone
        assert torch.equal(norm(other), rms_norm(other, norm.weight, 1e-6))
        assert torch.equal(norm(x.clone()), rms_norm(x, norm.weight, 1e-6))
        assert PRECOMPUTED not in norm.__dict__


class ScaledResidualLayer(LlamaDecoderLayer):
    """Another layer code (a scaled residual): not transformers' LLaMA layer, left alone."""

    def forward(self, hidden_states, **kwargs):
        attended, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states = hidden_states + 0.5 * attended
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
def test_other_layers_and_unfused_norms_are_left_alone():
    model = tiny_model("llama", num_layers=3)
    layers = model.model.layers
    layers[1].__class__ = ScaledResidualLayer
    layers[2].forward = layers[2].forward  # (an instance forward: another's hook)
    ids = torch.tensor([[5, 9, 2, 17]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    assert install_fused_layers(model) == 0  # (norms not in the fused kernel yet)
    install_fused_ops(model, torch.device("cpu"))
    # layer 0 fuses (its successor norm is a fused one); 1 has other code; 2 has a hook
    assert install_fused_layers(model) == 1
    assert fused_layers._layer_forward is layers[0].forward.__func__
    assert "forward" not in layers[1].__dict__
    with torch.no_grad(), fused_forward():
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
def test_a_runner_with_fused_layers_matches_full_forward():
    model = tiny_model("llama", num_layers=2)
    runner = ModelRunner(model, max_num_seqs=3, max_num_tokens=96, max_model_len=40,
                         fused_ops=True)
    assert runner.fused["layers"] == 2
    random_schedule(runner, model, seed=7, num_steps=10, vocab_size=model.config.vocab_size)
