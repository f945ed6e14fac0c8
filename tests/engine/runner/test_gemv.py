"""The few-rows product kernel (``engine.runner.gemv``): the float32 sum rounded once (within
one unit in the last place of the exact product, as its PyTorch reference), each row's bits
the same at any row count; where ``linear`` takes it (CUDA, half dtypes, no bias, one row, or
a few of a small weight) and where it leaves the product to PyTorch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.runner import gemv as gemv_module
from engine.runner.fused_ops import fused_forward
from engine.runner.gemv import (
    GEMV_MANY_ROWS_ELEMENTS,
    GEMV_MAX_ROWS,
    gemv,
    gemv_reference,
    linear,
    module_product,
)
from tests.conftest import DEVICE, needs_triton


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 2, 3, GEMV_MAX_ROWS])
@pytest.mark.parametrize("shape", [(7, 40), (33, 3000)])  # (odd rows; columns past one load)
def test_the_kernel_is_the_float32_sum_rounded_once(dtype, rows, shape):
    n_out, n_in = shape
    gen = torch.Generator().manual_seed(rows * 1000 + n_in)
    x = torch.randn(1, rows, n_in, generator=gen).to(DEVICE, dtype)  # [1, rows, K]
    weight = (torch.randn(n_out, n_in, generator=gen) * 0.05).to(DEVICE, dtype)  # [N, K]
    got = gemv(x, weight)
    want = gemv_reference(x, weight)
    assert got.shape == (1, rows, n_out) and got.dtype == dtype
    # (the same float32 sum in another order: at most one unit in the last place apart)
    exact = x.double() @ weight.double().t()
    ulp = 2.0 ** (-7 if dtype == torch.bfloat16 else -10)
    scale = exact.abs().clamp_min(1e-2)
    assert bool(((got.double() - exact).abs() <= ulp * scale).all())
    assert bool(((want.double() - exact).abs() <= ulp * scale).all())
    # (rows are their own: a row's outputs depend on that row alone)
    alone = gemv(x[:, :1], weight)
    assert torch.equal(alone[0, 0], got[0, 0])


def test_the_reference_is_the_float32_product_rounded_once():
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    weight = torch.tensor([[0.5, 0.25, 1.0], [-1.0, 0.0, 2.0]], dtype=torch.bfloat16)
    assert gemv_reference(x, weight).tolist() == [[0.5 + 0.5 + 3.0, -1.0 + 6.0]]


class Calls:
    """Which route ``linear`` took: counts the kernel's and PyTorch's calls."""

    def __init__(self, monkeypatch) -> None:
        self.kernel = self.torch = 0
        real_gemv, real_linear = gemv_module.gemv, nn.functional.linear

        def kernel(*args):
            self.kernel += 1
            return real_gemv(*args)

        def pytorch(*args):
            self.torch += 1
            return real_linear(*args)

        monkeypatch.setattr(gemv_module, "gemv", kernel)
        monkeypatch.setattr(nn.functional, "linear", pytorch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel's route is CUDA's alone: "
                    "no GPU here")
def test_linear_takes_the_kernel_for_a_few_half_rows_on_cuda(monkeypatch):
    calls = Calls(monkeypatch)
    weight = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(GEMV_MAX_ROWS, 32, device="cuda", dtype=torch.bfloat16)
    linear(x, weight, None)
    assert (calls.kernel, calls.torch) == (1, 0)
    linear(torch.cat([x, x[:1]]), weight, None)  # (one row too many)
    linear(x, weight, torch.zeros(64, device="cuda", dtype=torch.bfloat16))  # (a bias)
    linear(x.float(), weight.float(), None)  # (float32)
    assert (calls.kernel, calls.torch) == (1, 3)
    large = torch.randn(GEMV_MANY_ROWS_ELEMENTS // 32 + 1, 32, device="cuda",
                        dtype=torch.bfloat16)
    linear(x[:2], large, None)  # (a large weight: two rows go to cuBLAS, one to the kernel)
    linear(x[:1], large, None)
    assert (calls.kernel, calls.torch) == (2, 4)


def test_linear_leaves_cpu_products_to_pytorch(monkeypatch):
    calls = Calls(monkeypatch)
    weight = torch.randn(8, 4, dtype=torch.bfloat16)
    x = torch.randn(1, 4, dtype=torch.bfloat16)
    assert torch.equal(linear(x, weight, None), nn.functional.linear(x, weight))
    assert calls.kernel == 0


def test_module_product_routes_plain_linears_inside_stacked_forwards_only(monkeypatch):
    seen = []
    monkeypatch.setattr(gemv_module, "linear", lambda x, w, b: seen.append(w) or x @ w.t())
    plain, hooked = nn.Linear(4, 3, bias=False), nn.Linear(4, 3, bias=False)
    hooked.register_forward_hook(lambda *args: None)
    x = torch.randn(1, 4)
    module_product(plain, x)  # (outside a runner forward: the module's own call)
    assert seen == []
    with fused_forward(projections=True):
        module_product(plain, x)
        module_product(hooked, x)  # (a hook must run: its own call)
    with fused_forward(projections=False):  # (deterministic mode's forwards)
        module_product(plain, x)
    assert seen == [plain.weight]
