"""The one-launch KV write (Triton; through its interpreter on CPU) against the two
``index_copy_`` calls it replaces: the pool equal bit for bit, from contiguous and strided
states, and nothing else of the pool touched."""

from __future__ import annotations

import pytest
import torch

from engine.runner.kv_write import write_kv, write_kv_reference
from tests.conftest import DEVICE, needs_triton

pytestmark = needs_triton


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch_size,num_new,head_dim", [(1, 1, 64), (3, 4, 16), (2, 5, 24)])
def test_write_kv_is_the_index_copies(dtype, batch_size, num_new, head_dim):
    torch.manual_seed(batch_size * 10 + num_new)
    heads, num_rows = 3, 40
    pool = torch.randn(2, 1, heads, num_rows, head_dim, device=DEVICE).to(dtype)
    want = pool.clone()
    # keys strided as the stacked projections leave them: [batch, heads, num_new, head_dim]
    stacked = torch.randn(batch_size, num_new, 3 * heads * head_dim, device=DEVICE).to(dtype)
    keys = stacked[..., :heads * head_dim].view(batch_size, num_new, heads, head_dim)
    keys = keys.transpose(1, 2)
    values = torch.randn(batch_size, heads, num_new, head_dim, device=DEVICE).to(dtype)
    rows = torch.randperm(num_rows, device=DEVICE)[:batch_size * num_new]
    write_kv(pool, keys, values, rows)
    write_kv_reference(want, keys, values, rows)
    assert torch.equal(pool, want)
    untouched = torch.ones(num_rows, dtype=torch.bool, device=DEVICE)
    untouched[rows] = False
    assert not torch.equal(pool[:, :, :, rows], torch.zeros_like(pool[:, :, :, rows]))
    # (the rows not written keep their values: a kernel writing past its rows fails here)
    assert torch.equal(pool[:, :, :, untouched], want[:, :, :, untouched])
    assert torch.equal(pool[0, 0][:, rows[0]], keys[0, :, 0])
    assert torch.equal(pool[1, 0][:, rows[-1]], values[-1, :, -1])
