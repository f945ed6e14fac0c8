"""The draft head's fused rotary (Triton; on CPU through its interpreter, on a GPU compiled)
against its PyTorch reference, when it is used, and the head's attention with grouped key/value
heads read in place against the attention written out with the heads repeated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from proposers.head_kernels import fused_rotate, fused_rotate_applies
from proposers.head_model import DraftHead, rotate
from tests.conftest import DEVICE, INTERPRETED, needs_triton


def frequencies(head_dim: int) -> torch.Tensor:
    return 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 3, 64), (2, 5, 9, 32), (4, 1, 2, 16)])
def test_fused_rotate_is_the_reference(dtype, shape):
    gen = torch.Generator().manual_seed(len(shape))
    x = (torch.randn(*shape, generator=gen) * 2).to(DEVICE, dtype)  # [..., heads, head_dim]
    positions = torch.randint(0, 3000, shape[:-2], generator=gen).to(DEVICE)  # [...]
    inv_freq = frequencies(shape[-1]).to(DEVICE)
    with torch.no_grad():
        assert fused_rotate_applies(x, positions)
        got = fused_rotate(x, positions, inv_freq)
    want = rotate(x, positions, inv_freq)
    assert got.shape == want.shape and got.dtype == want.dtype
    if dtype == torch.float32:  # (cos / sin may differ in the last float32 place)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    else:  # after rounding to bf16: equal but for rare ties
        apart = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
        assert int(apart.max()) <= 1 and int((apart > 0).sum()) * 100 <= apart.numel()
    # (the check can fail: other positions give other values)
    with torch.no_grad():
        assert not torch.allclose(fused_rotate(x, positions + 1, inv_freq).float(),
                                  want.float(), atol=1e-2)


def test_the_fused_rotate_is_not_used_where_a_gradient_is_wanted_or_shapes_differ():
    x = torch.randn(3, 2, 8, device=DEVICE)
    positions = torch.arange(3, device=DEVICE)
    with torch.enable_grad():
        assert not fused_rotate_applies(x, positions)  # (training: the reference)
    with torch.no_grad():
        assert fused_rotate_applies(x, positions) == (INTERPRETED or x.is_cuda)
        assert not fused_rotate_applies(x, positions[:2])
        assert not fused_rotate_applies(x[..., ::2], positions)  # (a strided head dimension)


def repeated_heads_attention(head: DraftHead, x, positions, keys, values, mask):
    """:meth:`DraftHead.attend` written out as before: each key/value head repeated for its
    query heads, the rotary by the PyTorch reference."""
    q = rotate(head.q_proj(head.attn_norm(x)).unflatten(-1, (head.num_heads, head.head_dim)),
               positions, head.inv_freq)
    groups = head.num_heads // head.num_kv_heads
    k = keys.repeat_interleave(groups, dim=-2).transpose(1, 2)
    v = values.repeat_interleave(groups, dim=-2).transpose(1, 2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None])
    h = x + head.o_proj(out.transpose(1, 2).flatten(-2))
    gate, up = head.gate_up(head.mlp_norm(h)).chunk(2, dim=-1)
    return h + head.down(F.silu(gate) * up)


@pytest.mark.parametrize("queries", [1, 3])
def test_attention_reads_grouped_heads_in_place(queries):
    torch.manual_seed(queries)
    head = DraftHead(48, 96, num_heads=6, num_kv_heads=2).eval()  # 3 query heads per kv head
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    b, n = 2, 10
    x = torch.randn(b, queries, 48)
    positions = torch.tensor([[7], [9]]) + torch.arange(queries)  # [b, queries]
    keys, values = torch.randn(b, n, 2, 8), torch.randn(b, n, 2, 8)  # [b, keys, kv, dim]
    mask = torch.rand(b, queries, n) < 0.6
    mask[..., 0] = True  # (every query sees a key)
    with torch.enable_grad():  # (the reference rotary on every device: only the heads differ)
        got = head.attend(x, positions, keys, values, mask)
        want = repeated_heads_attention(head, x, positions, keys, values, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the query heads read their own key/value head: swapping the kv heads changes the output
    with torch.enable_grad():
        swapped = head.attend(x, positions, keys.flip(2), values.flip(2), mask)
    assert not torch.allclose(swapped, want, atol=1e-3)
