"""Stacked projections (q/k/v, gate/up with SiLU-and-multiply): one product a group inside a
runner forward, transformers' values within the products' rounding, transformers' code outside,
and what is left alone (another activation, a member with a forward of its own, a broken
stack)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.runner.fused_ops import fused_forward, silu_mul, silu_mul_reference
from engine.runner.fused_projections import install_fused_projections, remove_fused_projections
from tests.conftest import DEVICE, needs_triton, tiny_model

pytestmark = needs_triton


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("width", [48, 1536])
def test_silu_mul_is_pytorchs_two_operations(dtype, width):
    torch.manual_seed(width)
    gate_up = (torch.randn(5, 2 * width, device=DEVICE) * 4).to(dtype)  # [5, 2 * width]
    got, want = silu_mul(gate_up), silu_mul_reference(gate_up)
    assert got.shape == (5, width) and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:  # (exp approximated where PyTorch's is exact: one unit in the last place, rarely)
        apart = (got.float() - want.float()).abs() / want.float().abs().clamp_min(1e-3)
        assert bool((apart <= 2 ** -7).all()) and int((got != want).sum()) * 16 <= got.numel()
    swapped = silu_mul(torch.cat(gate_up.chunk(2, dim=-1)[::-1], dim=-1))  # (the check can fail)
    assert not torch.allclose(swapped.float(), want.float(), rtol=1e-2, atol=1e-2)


class Products:
    """Counts ``nn.functional.linear`` calls (every projection, fused or not, is one)."""

    def __init__(self, monkeypatch) -> None:
        self.count, real = 0, nn.functional.linear

        def counted(*args, **kwargs):
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(nn.functional, "linear", counted)


@torch.no_grad()
def test_stacked_layers_compute_transformers_values_with_fewer_products(monkeypatch):
    model = tiny_model("llama", num_layers=2).to(DEVICE)
    ids = torch.tensor([[5, 9, 2, 77, 31], [8, 1, 1, 40, 3]], device=DEVICE)
    before = model(input_ids=ids).logits
    weights = {n: p.clone() for n, p in model.named_parameters()}
    taken = install_fused_projections(model)
    assert taken == {"qkv": 2, "gate_up": 2}
    for name, param in model.named_parameters():  # (views of the stacks: the same values)
        assert torch.equal(param, weights[name]), name
    layer = model.model.layers[0]
    assert layer.self_attn.k_proj.weight.data_ptr() == (
        layer.self_attn.q_proj.weight.data_ptr() + layer.self_attn.q_proj.weight.nbytes)
    products = Products(monkeypatch)
    assert torch.equal(model(input_ids=ids).logits, before)  # (outside: transformers' code)
    plain = products.count  # 7 a layer and the head
    products.count = 0
    with fused_forward(projections=True):
        fused = model(input_ids=ids).logits
    assert products.count == plain - 2 * 3  # (k, v and up: one product fewer each, a layer)
    torch.testing.assert_close(fused, before, rtol=1e-5, atol=1e-5)
    products.count = 0
    with fused_forward(projections=False):  # (deterministic mode's forwards: their own maps;
        # on a GPU an earlier runner's fused rotary may be in: close, not equal)
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-5, atol=1e-5)
    assert products.count == plain
    # q, k, v called on other inputs than one shared tensor: each its own product
    attention = layer.self_attn
    x = torch.randn(1, 3, 64, device=DEVICE)
    with fused_forward(projections=True):
        q = attention.q_proj(x)
        k = attention.k_proj(x.clone())
        v = attention.v_proj(x)
    torch.testing.assert_close(k, nn.Linear.forward(attention.k_proj, x))
    torch.testing.assert_close(v, nn.Linear.forward(attention.v_proj, x))
    torch.testing.assert_close(q, nn.Linear.forward(attention.q_proj, x))
    remove_fused_projections(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert torch.equal(model(input_ids=ids).logits, before)


@torch.no_grad()
def test_a_moved_model_runs_unfused_until_stacked_again(monkeypatch):
    model = tiny_model("llama", num_layers=1).to(DEVICE)
    ids = torch.tensor([[5, 9, 2]], device=DEVICE)
    want = model(input_ids=ids).logits
    install_fused_projections(model)
    model.to(torch.float64).to(torch.float32)  # (each parameter copied alone: views broken)
    products = Products(monkeypatch)
    with fused_forward(projections=True):
        torch.testing.assert_close(model(input_ids=ids).logits, want)
    assert products.count == 8
    assert install_fused_projections(model) == {"qkv": 1, "gate_up": 1}
    products.count = 0
    with fused_forward(projections=True):
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
    assert products.count == 5


class GeluMLP(nn.Module):
    """A gated MLP of another activation: the check must refuse it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(width, 32), nn.Linear(width, 32)
        self.down_proj = nn.Linear(32, width)

    def forward(self, x):
        return self.down_proj(nn.functional.gelu(self.gate_proj(x)) * self.up_proj(x))


def test_other_forms_and_hooked_members_are_left_alone():
    model = tiny_model("llama", num_layers=2).to(DEVICE)
    model.model.extra = GeluMLP(64).to(DEVICE)
    hooked = model.model.layers[1].self_attn.v_proj
    hooked.forward = lambda x: nn.Linear.forward(hooked, x)  # (as accelerate's hooks do)
    taken = install_fused_projections(model)
    assert taken == {"qkv": 1, "gate_up": 2}
    assert "forward" not in model.model.extra.__dict__
    assert "forward" not in model.model.layers[1].self_attn.q_proj.__dict__


@pytest.mark.skipif(DEVICE != "cuda", reason="the runner stacks projections on CUDA only")
def test_a_cuda_runner_stacks_and_a_deterministic_one_unstacks():
    from engine.runner.model_runner import ModelRunner

    model = tiny_model("llama", num_layers=2, dtype=torch.bfloat16).to(DEVICE)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=64, max_model_len=32)
    assert runner.fused["qkv"] == 2 and runner.fused["gate_up"] == 2
    ModelRunner(model, max_num_seqs=2, max_num_tokens=64, max_model_len=32, deterministic=True)
    assert all("forward" not in m.__dict__ for m in model.modules() if isinstance(m, nn.Linear))
