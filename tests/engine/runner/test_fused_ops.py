"""The fused RMSNorm and rotary kernels (Triton; on CPU through its interpreter, on a GPU
compiled) against transformers' own modules and functions: bit for bit in bfloat16 on CPU, within
one unit in the last place on a GPU, within float32 rounding in float32; a runner that uses them
against the plain full forward; and what is left alone."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from engine.runner import fused_ops
from engine.runner.fused_ops import (
    _fused_rotary,
    _rounded,
    _same,
    fused_forward,
    install_fused_ops,
    rms_norm,
    rms_norm_reference,
    rotary,
    rotary_reference,
)
from engine.runner.model_runner import ModelRunner
from tests.conftest import DEVICE, INTERPRETED, needs_triton, tiny_model
from tests.engine.runner.test_model_runner import random_schedule

pytestmark = needs_triton


@pytest.mark.parametrize("hidden", [64, 96, 576])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_is_transformers_bit_for_bit_in_bf16(hidden, weight_dtype):
    torch.manual_seed(hidden)
    norm = LlamaRMSNorm(hidden, eps=1e-5).to(DEVICE, weight_dtype)
    norm.weight.data.normal_()
    x = torch.randn(3, 7, hidden, dtype=torch.bfloat16, device=DEVICE) * 5  # [3, 7, hidden]
    want = norm(x)
    got = rms_norm(x, norm.weight, norm.variance_epsilon)
    assert got.dtype == want.dtype and got.shape == want.shape
    if INTERPRETED:
        assert torch.equal(got, want)
        assert torch.equal(rms_norm_reference(x, norm.weight, norm.variance_epsilon), want)
    else:  # (compiled: the sum of squares in another order, rsqrt approximated)
        assert _same(got, want)


def test_rms_norm_in_float32_and_on_strided_rows():
    torch.manual_seed(1)
    norm = LlamaRMSNorm(48, eps=1e-6).to(DEVICE)
    norm.weight.data.normal_()
    x = torch.randn(6, 96, device=DEVICE)[:, ::2]  # [6, 48] rows whose last dimension is strided
    torch.testing.assert_close(rms_norm(x, norm.weight, 1e-6), norm(x), rtol=2e-6, atol=2e-6)
    wrong = rms_norm(x, norm.weight, 1.0)  # (an eps that matters: the check can fail)
    assert not torch.allclose(wrong, norm(x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("cos_batch,dim", [(1, 32), (2, 32), (2, 24)])
def test_rotary_is_transformers_bit_for_bit(dtype, cos_batch, dim):
    if dtype == torch.float16 and not INTERPRETED:
        pytest.skip("compiled, fp16 is left to transformers (fused_ops._COMPILED_DTYPES; "
                    "test_float16_models_keep_transformers_code_on_a_gpu)")
    gen = torch.Generator().manual_seed(3)
    # transformers' layout: [batch, seq, heads, dim] projections, transposed to [b, h, s, d]
    q = torch.randn(2, 5, 4, dim, generator=gen).to(DEVICE, dtype).transpose(1, 2)
    k = torch.randn(2, 5, 2, dim, generator=gen).to(DEVICE, dtype).transpose(1, 2)
    angles = torch.randn(cos_batch, 5, dim, generator=gen) * 3  # [cos_batch, seq, dim]
    cos, sin = angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)
    want = apply_rotary_pos_emb(q, k, cos, sin)
    got = rotary(q, k, cos, sin)
    for g, w in zip(got, want, strict=True):
        assert g.stride() == w.stride()
        # (float32 compiled: the GPU may fuse a product and the sum into one rounding)
        assert torch.equal(g, w) if INTERPRETED or dtype != torch.float32 else _same(g, w)
    for r, w in zip(rotary_reference(q, k, cos, sin), want, strict=True):
        assert torch.equal(r, w)
    swapped = rotary(q, k, sin, cos)  # (the tables' roles matter: the check can fail)
    assert not torch.equal(swapped[0], want[0])


@triton.jit
def _round_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, _rounded(tl.load(x_ptr + i), 1))


def test_the_bf16_rounding_is_round_to_nearest_even_and_keeps_nan():
    bits = torch.tensor([0x7FFFFFFF, -1, 0x7F800001, 0x7FC00000], dtype=torch.int32)
    nans = bits.view(torch.float32)  # four NaN patterns (0x7FFFFFFF is a GPU's NaN)
    values = torch.tensor([1.0, 1.00390625, 1.01171875, -3.3e-5, 6.5e4, 3.0e38, 1e-40])
    x = torch.cat([nans, values, torch.randn(5)]).to(DEVICE)  # [16]: ties, subnormal, large
    out = torch.empty_like(x)
    _round_kernel[(1,)](x, out, N=16)
    assert torch.isnan(out[:4]).all()
    assert torch.equal(out[4:], x[4:].to(torch.bfloat16).float())


def test_the_rotary_patch_passes_any_other_call_through_unchanged():
    seen = []

    def original(*args, **kwargs):  # (a model whose rotary takes other arguments)
        seen.append((len(args), sorted(kwargs)))
        return "original"

    patched = _fused_rotary(original)
    q = torch.randn(1, 2, 3, 8, device=DEVICE)
    cos = sin = torch.randn(1, 3, 8, device=DEVICE)
    with fused_forward():
        assert patched(q, cos=cos, sin=sin, unsqueeze_dim=2) == "original"  # (no k)
        assert patched(q, q, cos, sin, None) == "original"  # (position_ids)
        assert patched(q, q, cos, sin, unsqueeze_dim=2) == "original"
        assert patched(q, q, cos[..., :4], sin[..., :4]) == "original"  # (partial rotary)
        assert patched(q, q, cos, sin) != "original"  # (LLaMA's call: the kernel)
    assert patched(q, q, cos, sin) == "original"  # (outside a runner forward)
    assert seen == [(1, ["cos", "sin", "unsqueeze_dim"]), (5, []), (4, ["unsqueeze_dim"]),
                    (4, []), (4, [])]


class Olmo2LikeRMSNorm(LlamaRMSNorm):
    """OLMo-2's form: the weight multiplies in float32, one rounding at the end (not LLaMA's)."""

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (self.weight.float() * (x.float() * torch.rsqrt(variance + self.variance_epsilon))
                ).to(x.dtype)


class OffsetRMSNorm(nn.Module):
    """Gemma's form, ``(1 + weight) * x / rms``: named like an RMSNorm, not LLaMA's formula."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return (1 + self.weight) * rms_norm_reference(x, torch.ones_like(self.weight),
                                                      self.variance_epsilon)


def test_a_near_miss_norm_is_left_alone_in_bf16():
    model = tiny_model("llama", num_layers=1, dtype=torch.bfloat16).to(DEVICE)
    model.model.extra = Olmo2LikeRMSNorm(64).to(DEVICE, torch.bfloat16)
    model.model.extra.weight.data.normal_()
    taken = install_fused_ops(model, torch.device(DEVICE))
    assert taken["norms"] == 3  # (2 per layer and the final one: not the OLMo-2-like one)
    assert "forward" not in model.model.extra.__dict__
    # a second runner on the same model finds its norms taken already
    assert install_fused_ops(model, torch.device(DEVICE)) == taken


@pytest.mark.skipif(INTERPRETED, reason="compiled kernels only: the interpreter takes fp16")
def test_float16_models_keep_transformers_code_on_a_gpu():
    model = tiny_model("llama", num_layers=1, dtype=torch.float16).to(DEVICE)
    assert install_fused_ops(model, torch.device(DEVICE)) == {"norms": 0, "rotary_modules": 0}
    assert "forward" not in model.model.layers[0].input_layernorm.__dict__
    # and a rotary patched by a bf16 model before passes fp16 calls to transformers
    q = torch.randn(1, 2, 3, 8, device=DEVICE, dtype=torch.float16)
    cos = sin = torch.randn(1, 3, 8, device=DEVICE, dtype=torch.float16)
    patched = _fused_rotary(lambda *args: "original")
    with fused_forward():
        assert patched(q, q, cos, sin) == "original"
        assert patched(q.bfloat16(), q.bfloat16(), cos.bfloat16(), sin.bfloat16()) != "original"


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
def test_install_takes_llama_norms_and_rotary_and_leaves_the_rest():
    model = tiny_model("llama", num_layers=2)
    model.model.extra = OffsetRMSNorm(64)
    ids = torch.tensor([[5, 9, 2, 77, 31]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    taken = install_fused_ops(model, torch.device("cpu"))
    assert taken == {"norms": 5, "rotary_modules": 1}  # 2 per layer and the final one
    assert "forward" not in model.model.extra.__dict__
    assert isinstance(model.model.layers[0].input_layernorm.forward.__self__, LlamaRMSNorm)
    with torch.no_grad():
        # outside a runner forward: transformers' code, bit for bit
        assert torch.equal(model(input_ids=ids).logits, before)
        with fused_forward():
            torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-5,
                                       atol=1e-5)


def counting(calls: dict[str, int], name: str, real):
    """``real`` that adds one to ``calls[name]`` per call."""
    def wrapped(*args):
        calls[name] += 1
        return real(*args)
    return wrapped


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
def test_the_fused_kernels_run_inside_the_runner_only(monkeypatch):
    model = tiny_model("llama", num_layers=1)
    calls = {"norm": 0, "rotary": 0}
    monkeypatch.setattr(fused_ops, "rms_norm", counting(calls, "norm", fused_ops.rms_norm))
    monkeypatch.setattr(fused_ops, "rotary", counting(calls, "rotary", fused_ops.rotary))
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20,
                         fused_ops=True)
    checks = dict(calls)  # (the install's own checks call them too)
    slot = runner.allocate_slot()
    runner.forward([slot], [[3, 4, 5]])
    # (the layer's input norm; its post-attention and the final norm run with the residual
    # adds: engine/runner/fused_layers.py)
    assert calls["norm"] - checks["norm"] == 1 and calls["rotary"] - checks["rotary"] == 1
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2]]))  # (the same model outside the runner)
    assert calls["norm"] - checks["norm"] == 1 and calls["rotary"] - checks["rotary"] == 1
    # a layer that runs on CPU without Triton's interpreter (accelerate's CPU compute on a GPU
    # machine) keeps transformers' code: the kernels are not called
    monkeypatch.setattr(fused_ops, "_INTERPRETED", False)
    runner.forward([slot], [[6]])
    assert calls["norm"] - checks["norm"] == 1 and calls["rotary"] - checks["rotary"] == 1
    plain = ModelRunner(tiny_model("llama", num_layers=1), max_num_seqs=2, max_num_tokens=40,
                        max_model_len=20)
    assert plain.fused == {}  # (None: CUDA only)
    with pytest.raises(ValueError, match="fused_ops"):
        ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20, fused_ops="yes")


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
@pytest.mark.parametrize("family", ["qwen3"])  # (its q/k norms too: both norm shapes)
def test_a_fused_runner_matches_full_forward(family):
    model = tiny_model(family)
    runner = ModelRunner(model, max_num_seqs=3, max_num_tokens=96, max_model_len=40,
                         fused_ops=True)
    assert runner.fused["norms"] >= 5 and runner.fused["rotary_modules"] == 1
    random_schedule(runner, model, seed=5, num_steps=10, vocab_size=model.config.vocab_size)
