"""The batch-invariant linear map (Triton; on CPU through its interpreter) and its PyTorch
reference: a row's result bit for bit the same whatever the number of rows, its index and its
neighbours; the values against float64 sums; the routing of a model's maps through the kernel."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.runner import invariant_matmul as im
from engine.runner.invariant_matmul import (
    InvariantLinears,
    invariant_linear,
    invariant_linear_reference,
    linear_modules,
    tile_config,
)
from tests.conftest import DEVICE, INTERPRETED, needs_triton, tiny_model

N, K = 80, 160  # (80: a last column block of 16 of 32; 160: K tiles of 64, 64, 32 in bf16)
ROW_COUNTS = (1, 2, 5, 17, 64, 65, 130)
PROBES = 3


def weights(dtype: torch.dtype, with_bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g).to(DEVICE, dtype)  # [N, K]
    b = torch.randn(N, generator=g).to(DEVICE, dtype) if with_bias else None  # [N]
    return w, b


def batch_with_probes(probes: torch.Tensor, m: int, seed: int) -> tuple[torch.Tensor, dict]:
    """``[m, K]`` random rows (new ones for each ``seed``) with the probe rows ``[PROBES, K]``
    at the first, middle and last index and either side of the block boundary 64; returns the
    batch and {index: probe}."""
    g = torch.Generator().manual_seed(1000 + seed)
    x = (torch.randn(m, K, generator=g) * 4).to(probes.dtype)
    at = {i: i % PROBES for i in {0, m // 2, m - 1, 63, 64} if i < m}
    for i, p in at.items():
        x[i] = probes[p]
    return x, at


def shaped(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x [m, K]`` as the caller's input: 3-D when ``m`` is even; for some ``m`` a view whose
    rows are not contiguous (the launcher copies it)."""
    if m in (5, 65):
        wide = torch.zeros(m, 2 * K, dtype=x.dtype)
        wide[:, K:] = x
        x = wide[:, K:]  # (row stride 2K)
    x = x.to(DEVICE)
    return x.view(2, m // 2, K) if m % 2 == 0 else x


def check_row_invariant(linear, dtype: torch.dtype, with_bias: bool) -> None:
    w, b = weights(dtype, with_bias)
    probes = torch.randn(PROBES, K, generator=torch.Generator().manual_seed(7)).to(dtype)
    alone = [linear(probes[p:p + 1].to(DEVICE), w, b)[0] for p in range(PROBES)]  # [N] each
    for seed, m in enumerate(ROW_COUNTS):
        x, at = batch_with_probes(probes, m, seed)
        out = linear(shaped(x, m), w, b)
        assert out.shape == (m, N) if m % 2 else out.shape == (2, m // 2, N)
        assert out.dtype == dtype
        out = out.reshape(m, N)
        for i, p in at.items():
            assert torch.equal(out[i], alone[p]), f"row {i} of {m} differs from the row alone"


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_row_is_bitwise_the_same_whatever_the_batch(dtype, with_bias):
    check_row_invariant(invariant_linear, dtype, with_bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_row_is_bitwise_the_same_whatever_the_batch(dtype):
    check_row_invariant(invariant_linear_reference, dtype, with_bias=True)


def float64_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> tuple:
    """The exact-ish result and the scale of its terms (``|x| |w|^T + |b|``), in float64."""
    x, w = x.double().cpu(), w.double().cpu()
    b = torch.zeros(w.shape[0], dtype=torch.float64) if b is None else b.double().cpu()
    return x @ w.T + b, x.abs() @ w.abs().T + b.abs()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_matches_float64(dtype, with_bias):
    w, b = weights(dtype, with_bias, seed=3)
    x = torch.randn(70, K, generator=torch.Generator().manual_seed(4)).to(DEVICE, dtype)
    got = invariant_linear(x, w, b).cpu()
    want, scale = float64_linear(x, w, b)
    # float32 accumulation (K roundings of float32 at most), then one rounding to the dtype
    error = (got.double() - want).abs()
    half_unit = torch.finfo(dtype).eps / 2
    assert bool((error <= half_unit * want.abs() + K * 2 ** -24 * scale).all())
    if dtype != torch.float32:  # rounded to nearest (a truncating cast misses about half)
        assert (got == want.to(dtype)).float().mean() > 0.97


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_is_close_to_the_reference(dtype):
    w, b = weights(dtype, True, seed=5)
    x = torch.randn(2, 9, K, generator=torch.Generator().manual_seed(6)).to(DEVICE, dtype)
    got, ref = invariant_linear(x, w, b), invariant_linear_reference(x, w, b)
    tolerance = 1e-5 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(got, ref, rtol=tolerance, atol=tolerance * 4)


@pytest.mark.skipif(INTERPRETED or not torch.cuda.is_available(),
                    reason="compiled kernels: CUDA without the interpreter")
def test_one_compiled_kernel_for_every_row_count():
    w = torch.randn(48, K, device="cuda", dtype=torch.bfloat16)
    compiled = im._invariant_linear_kernel.device_caches[torch.cuda.current_device()][0]
    # (the first row count compiles the kernel for this signature unless an earlier test of
    # the same dtype and divisibility did: counted from after it)
    invariant_linear(torch.randn(ROW_COUNTS[0], K, device="cuda", dtype=torch.bfloat16), w)
    before = len(compiled)
    for m in ROW_COUNTS[1:]:  # (1, 2, 5, 17, 64, ...: specialising M would compile several)
        invariant_linear(torch.randn(m, K, device="cuda", dtype=torch.bfloat16), w)
    assert len(compiled) == before


@needs_triton
def test_empty_inputs():
    w, b = weights(torch.float32, True)
    assert invariant_linear(torch.empty(0, K, device=DEVICE), w, b).shape == (0, N)
    x = torch.randn(3, 0, device=DEVICE)
    torch.testing.assert_close(invariant_linear(x, torch.empty(N, 0, device=DEVICE), b),
                               b.expand(3, N))


def test_tiles_never_depend_on_the_rows():
    assert tile_config(80, torch.bfloat16) == {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4,
                                               "num_stages": 4}
    assert tile_config(14336, torch.bfloat16)["BLOCK_N"] == 64
    assert tile_config(128256, torch.bfloat16)["BLOCK_N"] == 128
    assert tile_config(4096, torch.float32)["BLOCK_K"] == 32


@pytest.mark.parametrize("make, problem", [
    (lambda: (torch.randn(3, K), torch.randn(N, K + 1), None), "weight"),
    (lambda: (torch.randn(3, K), torch.randn(N, K, 1), None), "weight"),
    (lambda: (torch.randn(3, K), torch.randn(N, K), torch.randn(N + 1)), "bias"),
    (lambda: (torch.randn(3, K), torch.randn(N, K).double(), None), "dtype"),
    (lambda: (torch.randn(3, K).int(), torch.randn(N, K).int(), None), "dtype"),
    (lambda: (torch.randn(3, K, device="meta"), torch.randn(N, K), None), "device"),
])
@pytest.mark.parametrize("linear", [invariant_linear, invariant_linear_reference])
def test_bad_inputs_are_refused(make, problem, linear):
    x, w, b = make()
    with pytest.raises(ValueError, match=problem):
        linear(x, w, b)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setattr(im, "_INTERPRETED", False)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        invariant_linear(torch.randn(2, K), torch.randn(N, K))


# ---- routing a model's maps ---------------------------------------------------------------------

@pytest.fixture
def kernel_calls(monkeypatch) -> list[tuple]:
    """Every call of :func:`invariant_linear` (still computed), as (rows, out_features)."""
    calls = []

    def counted(x, weight, bias=None):
        calls.append((x.numel() // x.shape[-1], weight.shape[0]))
        return invariant_linear(x, weight, bias)

    monkeypatch.setattr(im, "invariant_linear", counted)
    return calls


@needs_triton
def test_use_routes_the_maps_through_the_kernel_and_restores_them(kernel_calls):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(K, 40), nn.ReLU(), nn.Linear(40, N, bias=False)).to(DEVICE)
    x = torch.randn(5, K, device=DEVICE)
    linears = InvariantLinears(linear_modules(model))
    assert len(linears) == 2
    with torch.no_grad(), linears.use():
        got = model(x)
        assert all("forward" in m.__dict__ for m in linears.modules)
    assert kernel_calls == [(5, 40), (5, N)]
    expected = invariant_linear(torch.relu(invariant_linear(x, model[0].weight, model[0].bias)),
                                model[2].weight)
    assert torch.equal(got, expected)
    assert all("forward" not in m.__dict__ for m in model)
    with pytest.raises(RuntimeError, match="inside"), linears.use():
        raise RuntimeError("inside")
    assert all("forward" not in m.__dict__ for m in model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)  # (nn.Linear's own again)


def test_use_puts_back_an_instance_forward_set_after_construction():
    model = nn.Sequential(nn.Linear(K, N))
    linears = InvariantLinears(linear_modules(model))
    own = model[0].__dict__["forward"] = lambda x: x
    with linears.use():
        assert model[0].forward is not own
    assert model[0].forward is own


@pytest.mark.skipif(INTERPRETED or torch.cuda.is_available(),
                    reason="the reference route: CPU without the interpreter")
def test_use_runs_the_reference_where_the_kernel_cannot(kernel_calls):
    model = nn.Sequential(nn.Linear(K, N))
    x = torch.randn(4, K)
    with torch.no_grad(), InvariantLinears(linear_modules(model)).use():
        got = model(x)
    assert kernel_calls == []
    assert torch.equal(got, invariant_linear_reference(x, model[0].weight, model[0].bias))


@needs_triton
def test_llama_logits_of_a_row_are_those_of_the_row_alone(kernel_calls):
    model = tiny_model("llama", num_layers=1, attn_implementation="eager").to(DEVICE)
    modules = linear_modules(model)
    assert len(modules) == 7 + 1 and model.get_output_embeddings() in modules
    ids = torch.randint(0, 128, (3, 6), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad(), InvariantLinears(modules).use():
        together = model(ids).logits  # [3, 6, vocab]
        alone = model(ids[1:2]).logits  # [1, 6, vocab]
    assert len(kernel_calls) == 2 * len(modules)
    assert torch.equal(together[1], alone[0])
    assert all("forward" not in m.__dict__ for m in modules)


def test_linear_modules_leaves_out_subclasses():
    class Quantised(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(4, 4), Quantised(4, 4), nn.ReLU())
    model.append(model[0])  # (shared: listed once)
    assert linear_modules(model) == [model[0]]
    with pytest.raises(ValueError, match="plain nn.Linear"):
        InvariantLinears([model[1]])
