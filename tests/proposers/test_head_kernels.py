"""The draft head's fused kernels (Triton; on CPU through its interpreter, on a GPU compiled):
the rotary, the RMSNorm, silu times up, the chain's attention and the argmax, each against its
PyTorch reference, and when each is used; the head's attention with grouped key/value heads read
in place against the attention written out with the heads repeated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from proposers.head_kernels import (
    chain_attention,
    chain_attention_applies,
    draft_argmax,
    fused_norm_applies,
    fused_rms_norm,
    fused_rotate,
    fused_rotate_applies,
    fused_rotate_write,
    fused_silu_mul,
    fused_silu_mul_applies,
    rotate_write_applies,
)
from proposers.head_model import ChainView, DraftHead, grouped_attention, rotate
from tests.conftest import DEVICE, INTERPRETED, needs_triton

pytestmark = pytest.mark.head_kernels  # (the kernels themselves, on CPU too: tests/conftest.py)


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


def ulps_apart(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two bf16 tensors of one sign each, elementwise."""
    return (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()


def assert_rounded_alike(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32: close; bf16: at most one unit apart, in at most 1% of the elements (compiled
    exp / rsqrt may differ from PyTorch's in the last float32 place before the rounding)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        apart = ulps_apart(got, want)
        assert int(apart.max()) <= 1 and int((apart > 0).sum()) * 100 <= apart.numel()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rms_norm_is_torchs_rms_norm_and_writes_half_a_row(dtype):
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 5, 96, generator=gen) * 3).to(DEVICE, dtype)  # [..., size]
    norm = torch.nn.RMSNorm(96, eps=1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=gen))
        assert fused_norm_applies(x, norm.weight)
        got = fused_rms_norm(x, norm.weight, 1e-5)
        want = norm(x)
        assert_rounded_alike(got, want)
        # into the right half of wider rows, the left half untouched
        both = torch.full((20, 192), 7.0, dtype=dtype, device=DEVICE)
        fused_rms_norm(x, norm.weight, 1e-5, both[:, 96:])
        assert bool((both[:, :96] == 7.0).all())
        assert_rounded_alike(both[:, 96:].view(4, 5, 96), want)
        # (the check can fail: another epsilon gives other values)
        assert not torch.allclose(fused_rms_norm(x, norm.weight, 10.0).float(), want.float(),
                                  atol=1e-2)
        with pytest.raises(ValueError, match="out must be"):
            fused_rms_norm(x, norm.weight, 1e-5, both[:19, 96:])


def test_the_fused_norm_and_silu_are_not_used_where_a_gradient_is_wanted_or_dtypes_differ():
    x = torch.randn(3, 8, device=DEVICE)
    weight = torch.ones(8, device=DEVICE)
    with torch.enable_grad():
        assert not fused_norm_applies(x, weight) and not fused_silu_mul_applies(x)
    with torch.no_grad():
        assert fused_norm_applies(x, weight) == (INTERPRETED or x.is_cuda)
        assert fused_silu_mul_applies(x) == (INTERPRETED or x.is_cuda)
        assert not fused_norm_applies(x, weight.double())  # (PyTorch would promote)
        assert not fused_norm_applies(x, weight[:4])
        assert not fused_silu_mul_applies(x[:, :7])  # (an odd width has no halves)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_silu_mul_is_silu_of_the_gate_times_up(dtype):
    gen = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(3, 2, 2 * 1500, generator=gen) * 3).to(DEVICE, dtype)
    with torch.no_grad():
        got = fused_silu_mul(gate_up)  # (1500: two blocks a row)
    gate, up = gate_up.chunk(2, dim=-1)
    assert_rounded_alike(got, F.silu(gate) * up)
    assert not torch.allclose(got.float(), (F.silu(up) * gate).float(), atol=1e-2)


def masked_attention(q, keys, values, upto):
    """The chain's attention written out: each key/value head repeated for its query heads,
    float32, a boolean mask of the keys ``0 .. upto[r]``."""
    groups = q.shape[2] // keys.shape[2]
    k = keys.float().repeat_interleave(groups, dim=2).transpose(1, 2)  # [b, heads, n, d]
    v = values.float().repeat_interleave(groups, dim=2).transpose(1, 2)
    mask = torch.arange(keys.shape[1], device=keys.device)[None, :] <= upto[:, None]  # [b, n]
    out = F.scaled_dot_product_attention(q.float().transpose(1, 2), k, v,
                                         attn_mask=mask[:, None, None])  # [b, heads, 1, d]
    return out.transpose(1, 2).flatten(2)  # [b, 1, heads * d]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_keys", [1, 50, 300])
def test_chain_attention_is_the_masked_attention(dtype, num_keys):
    """Three query heads a key/value head (a group width that is not a power of two), rows
    seeing one key, some, or all of them; 300 keys take five key blocks."""
    gen = torch.Generator().manual_seed(num_keys)
    b, heads, kv_heads, dim = 3, 9, 3, 32
    q = torch.randn(b, 1, heads, dim, generator=gen).to(DEVICE, dtype)
    keys = torch.randn(b, num_keys, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    values = torch.randn(b, num_keys, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    upto = torch.tensor([0, num_keys // 2, num_keys - 1], device=DEVICE)
    with torch.no_grad():
        assert chain_attention_applies(q, keys, values)
        got = chain_attention(q, keys, values, upto)
        # the head's attention takes a chain's view as its mask and gives the same, the rows
        # reading slots of a whole cache (here in reverse)
        cache_k, cache_v = keys.flip(0), values.flip(0)
        slots = torch.arange(b - 1, -1, -1, device=DEVICE)
        assert torch.equal(chain_attention(q, cache_k, cache_v, upto, slots), got)
        assert torch.equal(grouped_attention(q, cache_k, cache_v, ChainView(slots, upto)), got)
    want = masked_attention(q, keys, values, upto)
    assert got.shape == (b, 1, heads * dim) and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=tolerance)
    if num_keys > 1:  # (the check can fail: other limits see other keys)
        assert not torch.allclose(got.float(), masked_attention(q, keys, values, upto * 0),
                                  atol=1e-2)


def test_a_chain_view_gathers_its_slots_and_builds_the_mask_where_the_kernel_does_not_apply():
    torch.manual_seed(5)
    q = torch.randn(2, 1, 4, 6)
    keys, values = torch.randn(3, 7, 2, 6), torch.randn(3, 7, 2, 6)  # (a cache of 3 slots)
    upto, slots = torch.tensor([2, 6]), torch.tensor([2, 0])
    with torch.enable_grad():  # (training: the reference on every device)
        assert not chain_attention_applies(q, keys, values)
        got = grouped_attention(q, keys, values, ChainView(slots, upto))
    mask = (torch.arange(7)[None, :] <= upto[:, None])[:, None]  # [b, 1, keys]
    torch.testing.assert_close(got, grouped_attention(q, keys[slots], values[slots], mask))
    torch.testing.assert_close(got, masked_attention(q, keys[slots], values[slots], upto))


@needs_triton
def test_draft_argmax_is_the_argmax_and_drafts_token_zero_for_a_row_without_a_maximum():
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 3000, generator=gen).to(DEVICE, torch.bfloat16)
    logits[1, 2999] = 50.0  # (the last chunk's)
    logits[3] = float("nan")
    with torch.no_grad():
        got = draft_argmax(logits)
    assert got[:3].tolist() == logits[:3].float().argmax(dim=-1).tolist()
    assert got[1] == 2999 and got[3] == 0


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rotate_write_puts_rotated_keys_and_values_at_their_slots_and_positions(dtype):
    gen = torch.Generator().manual_seed(7)
    rows, heads, dim = 5, 3, 16
    kv = torch.randn(rows, 2, heads, dim, generator=gen).to(DEVICE, dtype)
    k, v = kv[:, 0], kv[:, 1]  # (views with a row stride of two heads' rows: as the head's)
    positions = torch.tensor([0, 7, 3, 9, 9], device=DEVICE)
    slots = torch.tensor([2, 0, 2, 1, 3], device=DEVICE)
    inv_freq = frequencies(dim).to(DEVICE)
    keys = torch.zeros(4, 12, heads, dim, dtype=dtype, device=DEVICE)
    values = torch.zeros_like(keys)
    with torch.no_grad():
        assert rotate_write_applies(k, v, keys, values, positions, slots)
        fused_rotate_write(k, v, positions, inv_freq, keys, values, slots)
    want_keys, want_values = torch.zeros_like(keys), torch.zeros_like(values)
    want_keys[slots, positions] = rotate(k, positions, inv_freq)
    want_values[slots, positions] = v
    assert torch.equal(values, want_values)  # (copied as they are)
    assert_rounded_alike(keys, want_keys)  # (and nothing written elsewhere)
    assert not torch.allclose(keys[slots, positions].float(), k.float(), atol=1e-2)


def test_the_fused_rotate_write_is_not_used_where_a_gradient_is_wanted_or_dtypes_differ():
    k = v = torch.randn(3, 2, 8, device=DEVICE)
    keys = values = torch.zeros(2, 4, 2, 8, device=DEVICE)
    at = torch.zeros(3, dtype=torch.long, device=DEVICE)  # (positions, slots)
    with torch.enable_grad():
        assert not rotate_write_applies(k, v, keys, values, at, at)
    with torch.no_grad():
        assert rotate_write_applies(k, v, keys, values, at, at) == (INTERPRETED or k.is_cuda)
        assert not rotate_write_applies(k, v, keys.double(), values, at, at)
        assert not rotate_write_applies(k, v[:, :1], keys, values, at, at)
        assert not rotate_write_applies(k, v, keys, values, at[:2], at)  # (a position a pair)


@needs_triton
@pytest.mark.parametrize("shape", [(2, 2, 24, 4166, torch.bfloat16), (3, 1, 16, 90, torch.float16)],
                         ids=["many-keys-odd-dim", "one-head-a-group-fp16"])
def test_chain_attention_on_long_caches_odd_head_dims_and_lone_query_heads(shape):
    """4,166 keys: 66 blocks, more than MAX_SPLITS, so each program reads two blocks in turn;
    a head dimension of 24 (padded to 32 in the kernel); one query head a key/value head."""
    heads, kv_heads, dim, num_keys, dtype = shape
    gen = torch.Generator().manual_seed(num_keys)
    b = 2
    q = torch.randn(b, 1, heads, dim, generator=gen).to(DEVICE, dtype)
    keys = torch.randn(b, num_keys, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    values = torch.randn(b, num_keys, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    upto = torch.tensor([num_keys - 1, num_keys // 3], device=DEVICE)
    with torch.no_grad():
        assert chain_attention_applies(q, keys, values)
        got = chain_attention(q, keys, values, upto)
    want = masked_attention(q, keys, values, upto)
    assert got.shape == (b, 1, heads * dim) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    # (the check can fail: the last keys change the first row's answer)
    keys[0, -70:] = 5.0
    with torch.no_grad():
        assert not torch.allclose(chain_attention(q, keys, values, upto)[0].float(), want[0],
                                  atol=2e-2)
