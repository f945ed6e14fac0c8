"""The paged-attention kernel (Triton; on CPU through its interpreter) and its PyTorch reference
against dense masked SDPA built here, by hand, from each sequence's own keys and values: pool rows
shuffled, grouped-query heads, rows of different lengths, chains, a draft tree, a prefill-like
chunk, split-K on and off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.runner import paged_attention as pa
from engine.runner.paged_attention import (
    SplitPlan,
    paged_attention,
    paged_attention_reference,
    split_plan,
)
from engine.runner.step_inputs import tree_columns
from tests.conftest import DEVICE, needs_triton


class Pool:
    """A layer's pool ``[kv_heads, num_rows, head_dim]`` of random keys and values, and a slot
    table whose sequences own shuffled pool rows (nothing in position order)."""

    def __init__(self, kv_heads: int, head_dim: int, num_slots: int, width: int, seed: int,
                 dtype: torch.dtype = torch.float32):
        g = torch.Generator().manual_seed(seed)
        num_rows = num_slots * width + 7  # (rows nobody owns too)
        self.keys = torch.randn(kv_heads, num_rows, head_dim, generator=g).to(dtype)
        self.values = torch.randn(kv_heads, num_rows, head_dim, generator=g).to(dtype)
        # [num_slots, width]: every cell a distinct pool row, in random order
        self.table = torch.randperm(num_rows, generator=g)[:num_slots * width].view(
            num_slots, width).contiguous()


def dense_expected(q: torch.Tensor, pool: Pool, slots: list[int], visible: list[list[set[int]]],
                   scale: float) -> torch.Tensor:
    """``[batch, num_new, heads, head_dim]`` float32: for each row, its slot's keys and values
    read cell by cell through the table, the key heads repeated per group, SDPA with a boolean
    mask whose token ``t`` sees exactly the columns ``visible[b][t]``."""
    batch, heads, num_new, head_dim = q.shape
    groups = heads // pool.keys.shape[0]
    outs = []
    for b, slot in enumerate(slots):
        width = max(max(cols) for cols in visible[b]) + 1
        rows = [int(pool.table[slot, j]) for j in range(width)]
        k = pool.keys[:, rows].float().repeat_interleave(groups, 0)  # [heads, width, head_dim]
        v = pool.values[:, rows].float().repeat_interleave(groups, 0)
        mask = torch.zeros(num_new, width, dtype=torch.bool)
        for t, cols in enumerate(visible[b]):
            mask[t, sorted(cols)] = True
        out = F.scaled_dot_product_attention(q[b].float(), k, v, attn_mask=mask, scale=scale)
        outs.append(out.transpose(0, 1))  # [num_new, heads, head_dim]
    return torch.stack(outs)


def chain_inputs(lengths: list[int], num_new: int) -> tuple[torch.Tensor, torch.Tensor,
                                                             list[list[set[int]]]]:
    """Limits and (zero) ancestors ``[batch, num_new]`` of rows whose new tokens follow
    ``lengths[b]`` cached ones, and what each token sees: every column up to its own."""
    limits = torch.tensor([[n + t for t in range(num_new)] for n in lengths])
    visible = [[set(range(n + t + 1)) for t in range(num_new)] for n in lengths]
    return limits, torch.zeros_like(limits), visible


def tree_visible(root_end: int, parents: list[int]) -> list[set[int]]:
    """What the root (the token before the nodes) and each node see, by walking the parents
    here: the columns ``0 .. root_end - 1`` (the context through the root), and a node its own
    and its ancestors' columns (node ``j`` in column ``root_end + j``)."""
    visible = [set(range(root_end))]
    for i in range(len(parents)):
        cols, j = set(range(root_end)), i
        while j >= 0:
            cols.add(root_end + j)
            j = parents[j]
        visible.append(cols)
    return visible


def run_both(q, pool, slots, limits, ancestors, scale, **kernel_args):
    args = (q.to(DEVICE), pool.keys.to(DEVICE), pool.values.to(DEVICE), pool.table.to(DEVICE),
            torch.tensor(slots, device=DEVICE), limits.to(DEVICE), ancestors.to(DEVICE), scale)
    return paged_attention(*args, **kernel_args).cpu(), paged_attention_reference(*args).cpu()


@needs_triton
@pytest.mark.parametrize("num_new", [1, 2, 3, 5])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_chains_of_rows_of_different_lengths_with_grouped_heads(num_new, num_splits):
    pool = Pool(kv_heads=2, head_dim=16, num_slots=4, width=48, seed=num_new)
    lengths, slots = [3, 40, 17], [2, 0, 3]  # (a short row, one past two key blocks)
    limits, ancestors, visible = chain_inputs(lengths, num_new)
    q = torch.randn(3, 4, num_new, 16, generator=torch.Generator().manual_seed(9))
    got, ref = run_both(q, pool, slots, limits, ancestors, 0.3, num_splits=num_splits,
                        block_n=16)
    want = dense_expected(q, pool, slots, visible, 0.3)
    assert got.shape == want.shape == (3, num_new, 4, 16)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref, want, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("num_splits", [1, 2])
def test_a_draft_tree_beside_a_padded_chain(num_splits):
    """Row 0: 2 cached tokens, then a token and a tree of 5 nodes (root at column 2, nodes in
    columns 3..7, parents -1, 0, 0, 1, 2); row 1: a chain of 2 tokens padded to 6 (the padding
    repeats the last limit, as the layout does)."""
    parents = [-1, 0, 0, 1, 2]
    positions, limits0, anc0 = tree_columns(2, 6, (1, parents))
    visible0 = tree_visible(3, parents)
    limits = torch.tensor([limits0, [9, 10, 10, 10, 10, 10]])
    ancestors = torch.tensor([anc0, [0] * 6])
    visible = [visible0, [set(range(10))] + [set(range(11))] * 5]
    pool = Pool(kv_heads=1, head_dim=16, num_slots=3, width=24, seed=5)
    q = torch.randn(2, 3, 6, 16, generator=torch.Generator().manual_seed(3))
    got, ref = run_both(q, pool, [1, 2], limits, ancestors, 0.25, num_splits=num_splits,
                        block_n=16)
    want = dense_expected(q, pool, [1, 2], visible, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref, want, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("chain_order", [False, True])
def test_chain_order_reads_the_same_keys_as_the_mask(chain_order):
    """The deterministic reading order changes where a tree node's keys sit, not which: the
    tree-beside-chains step of the test above and chains of different lengths, against SDPA."""
    parents = [-1, 0, 0, 1, 2, 3]
    positions, limits0, anc0 = tree_columns(20, 7, (1, parents))
    visible0 = tree_visible(21, parents)
    limits = torch.tensor([limits0, [30 + t for t in range(7)]])
    pool = Pool(kv_heads=2, head_dim=16, num_slots=3, width=48, seed=8)
    q = torch.randn(2, 6, 7, 16, generator=torch.Generator().manual_seed(4))
    got, _ = run_both(q, pool, [0, 2], limits, torch.tensor([anc0, [0] * 7]), 0.3, block_n=16,
                      chain_order=chain_order)
    want = dense_expected(q, pool, [0, 2], [visible0, [set(range(31 + t)) for t in range(7)]],
                          0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_chain_order_a_tree_node_equals_the_chain_token_with_its_keys_bitwise(dtype):
    """A node at depth 3 of a tree after 40 cached tokens (its ancestors in columns 41, 43, 46)
    and a token of a chain at depth 3 whose columns 40..43 hold the same pool rows as the
    node's root and ancestors: the same query gives the same output, bit for bit, although the
    steps differ (7 tree tokens after a root, against a chain of 4; the blocks of 16 columns
    split the node's keys elsewhere). That is what makes greedy trees equal plain decoding in
    deterministic mode."""
    parents = [-1, 0, 0, 1, 2, 4]  # node 5: parent 4, then 2, then 0
    positions, limits0, anc0 = tree_columns(40, 7, (1, parents))
    pool = Pool(kv_heads=2, head_dim=16, num_slots=2, width=64, seed=11, dtype=dtype)
    chain = pool.table[1].clone()
    chain[:41] = pool.table[0, :41]  # the context and the root
    chain[41:44] = pool.table[0, [41 + 0, 41 + 2, 41 + 4]]  # the node's ancestors, in depth order
    chain[44] = pool.table[0, 41 + 5]  # the node itself
    pool.table[1] = chain
    g = torch.Generator().manual_seed(6)
    q_tree = torch.randn(1, 4, 7, 16, generator=g).to(dtype)
    q_chain = torch.randn(1, 4, 5, 16, generator=g).to(dtype)
    q_chain[:, :, 4] = q_tree[:, :, 6]  # the chain's token at column 44: the node's query
    q_chain[:, :, 0] = q_tree[:, :, 0]  # and at column 40 the root's
    args = (pool.keys.to(DEVICE), pool.values.to(DEVICE), pool.table.to(DEVICE))
    tree = paged_attention(q_tree.to(DEVICE), *args, torch.tensor([0], device=DEVICE),
                           torch.tensor([limits0], device=DEVICE),
                           torch.tensor([anc0], device=DEVICE), 0.3, block_n=16,
                           chain_order=True).cpu()
    chain_limits = torch.tensor([[40, 41, 42, 43, 44]], device=DEVICE)
    line = paged_attention(q_chain.to(DEVICE), *args, torch.tensor([1], device=DEVICE),
                           chain_limits, torch.zeros_like(chain_limits), 0.3, block_n=16,
                           chain_order=True).cpu()
    assert anc0[6] == 1 << 0 | 1 << 2 | 1 << 4 | 1 << 5
    assert torch.equal(tree[0, 6], line[0, 4])
    assert torch.equal(tree[0, 0], line[0, 0])  # (the root: the chain's first token)


@needs_triton
def test_high_tree_bits_reach_columns_far_past_the_limit():
    """A token with limit 4 and bits 40 and 63 (the int64's sign bit) sees columns 0..4, 45
    and 68, and nothing between: the key loop must run past the limit to the highest bit."""
    bits = (1 << 40) | (1 << 63)
    ancestors = torch.tensor([[bits - (1 << 64)]])  # (as a signed int64)
    limits = torch.tensor([[4]])
    pool = Pool(kv_heads=2, head_dim=16, num_slots=1, width=80, seed=7)
    q = torch.randn(1, 2, 1, 16, generator=torch.Generator().manual_seed(1))
    got, ref = run_both(q, pool, [0], limits, ancestors, 0.5, block_n=16)
    want = dense_expected(q, pool, [0], [[{0, 1, 2, 3, 4, 45, 68}]], 0.5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref, want, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("groups,num_splits", [(3, 1), (4, 2)])
def test_a_prefill_chunk_of_17_tokens(groups, num_splits):
    """17 new tokens after 20 cached (and after 0): 51 or 68 folded rows, the latter two M
    blocks, each of which stops at its own rows' last column."""
    pool = Pool(kv_heads=2, head_dim=32, num_slots=2, width=40, seed=groups)
    limits, ancestors, visible = chain_inputs([20, 0], 17)
    q = torch.randn(2, 2 * groups, 17, 32, generator=torch.Generator().manual_seed(groups))
    got, ref = run_both(q, pool, [1, 0], limits, ancestors, 0.2, num_splits=num_splits,
                        block_n=16)
    want = dense_expected(q, pool, [1, 0], visible, 0.2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref, want, atol=1e-5, rtol=1e-5)


@needs_triton
def test_bf16_within_bf16_rounding_and_the_default_block():
    pool = Pool(kv_heads=2, head_dim=64, num_slots=2, width=100, seed=11, dtype=torch.bfloat16)
    limits, ancestors, visible = chain_inputs([90, 30], 2)
    q = torch.randn(2, 4, 2, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    got, _ = run_both(q, pool, [0, 1], limits, ancestors, 0.125, num_splits=2)
    want = dense_expected(q, pool, [0, 1], visible, 0.125)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_the_reference_alone_on_a_chain_and_with_a_cut_key_range():
    pool = Pool(kv_heads=2, head_dim=8, num_slots=3, width=30, seed=4)
    limits, ancestors, visible = chain_inputs([5, 21], 3)
    q = torch.randn(2, 6, 3, 8, generator=torch.Generator().manual_seed(4))
    args = (q, pool.keys, pool.values, pool.table, torch.tensor([2, 1]), limits, ancestors, 0.4)
    want = dense_expected(q, pool, [2, 1], visible, 0.4)
    torch.testing.assert_close(paged_attention_reference(*args), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(paged_attention_reference(*args, kv_len=24), want,
                               atol=1e-5, rtol=1e-5)


def test_the_launcher_refuses_bad_arguments():
    pool = Pool(kv_heads=2, head_dim=16, num_slots=1, width=8, seed=0)
    q = torch.randn(1, 3, 1, 16)  # (3 heads over 2 kv heads)
    limits = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="multiple"):
        paged_attention(q, pool.keys, pool.values, pool.table, torch.tensor([0]), limits,
                        limits, 1.0)
    q = torch.randn(1, 4, 1, 16)
    with pytest.raises(ValueError, match="integer"):
        paged_attention(q, pool.keys, pool.values, pool.table, torch.tensor([0]), limits.float(),
                        limits, 1.0)
    with pytest.raises(ValueError, match="num_splits"):
        paged_attention(q, pool.keys, pool.values, pool.table, torch.tensor([0]), limits,
                        limits, 1.0, num_splits=0)


def test_split_plan_fills_the_sms_only_when_the_programs_are_few(monkeypatch):
    monkeypatch.setattr(pa, "_sm_count", lambda device: 132)
    cuda = torch.device("cuda")

    def splits(*sizes) -> int:
        return split_plan(*sizes, cuda).num_splits

    # 1B shape (32 heads over 8), batch 1: 8 programs (fewer than 66, half the SMs), so a
    # share takes one 64-key block at least; up to 4 * 132 / 8 = 66 programs each
    assert splits(1, 32, 8, 1, 8192) == pa.MAX_SPLITS  # 128 blocks: capped
    assert splits(1, 32, 8, 1, 512) == 8  # 8 blocks
    assert splits(1, 32, 8, 1, 256) == 4
    assert splits(1, 32, 8, 1, 64) == 1  # one block: nothing to split
    assert splits(1, 32, 8, 1, 384) == 4  # 6 blocks -> a power of two
    assert split_plan(1, 32, 8, 1, 512, cuda) == SplitPlan(8, 64, False)
    assert split_plan(1, 32, 8, 1, 64, cuda) == SplitPlan(1, 64, True)  # (one share: ahead)
    # batch 32: 256 programs (more than 66): one share of 64-key blocks below 1,024 keys
    assert split_plan(32, 32, 8, 1, 512, cuda) == SplitPlan(1, 64, True)
    # from 1,024: 128-key blocks; 256 programs fill two waves (256 / 264), at most 2 an SM:
    # one share, loaded ahead
    assert split_plan(32, 32, 8, 1, 2048, cuda) == SplitPlan(1, 128, True)
    assert split_plan(32, 32, 8, 1, 8192, cuda) == SplitPlan(1, 128, True)
    # batch 16: 128 programs, fewer than the SMs: 64-key blocks, shares of 8 blocks at least,
    # 4 * 132 / 128 = 4 programs an SM at most
    assert split_plan(16, 32, 8, 1, 2048, cuda) == SplitPlan(4, 64, False)
    assert split_plan(16, 32, 8, 1, 8192, cuda) == SplitPlan(4, 64, False)
    assert split_plan(16, 32, 8, 1, 1024, cuda) == SplitPlan(2, 64, False)  # 16 blocks
    assert split_plan(16, 32, 8, 1, 512, cuda) == SplitPlan(1, 64, True)  # 8 blocks: one share
    # default model (9 heads over 3): batch 32 has 96 programs: the same
    assert split_plan(32, 9, 3, 1, 2048, cuda) == SplitPlan(4, 64, False)
    # batch 48, 144 programs: at most 528 / 144 = 3 -> 2 shares; no count fills 90% of its
    # waves (1: 144 of 264, 2: 288 of 396): the fuller, 2
    assert split_plan(48, 9, 3, 1, 2048, cuda) == SplitPlan(2, 128, False)
    # batch 64, 192 programs: at most 528 / 192 = 2 shares; 2 give 384 of 396 (at least 1.5 an
    # SM, 97% full), 2.9 an SM: not ahead
    assert split_plan(64, 9, 3, 1, 2048, cuda) == SplitPlan(2, 128, False)
    # a share of 128-key blocks holds 4 at least: 1,024 keys give 2 shares at most; neither
    # fills 90% (144 of 264, 288 of 396): the fuller, 2
    assert split_plan(48, 9, 3, 1, 1024, cuda) == SplitPlan(2, 128, False)
    # batch 32 of the 1B shape at 1,024 keys: 256 programs, one share fills 97% of two waves
    assert split_plan(32, 32, 8, 1, 1024, cuda) == SplitPlan(1, 128, True)
    assert split_plan(48, 9, 3, 1, 512, cuda) == SplitPlan(1, 64, True)  # below 1,024
    # batch 8: 24 programs (few): up to 22 shares of one block -> 16
    assert splits(8, 9, 3, 1, 8192) == 16
    # a verification of 4 tokens a row at batch 1: 9 * 4 = 36 rows in one 64-row tile
    assert splits(1, 36, 4, 4, 512) == 8
    assert split_plan(1, 32, 8, 1, 8192, torch.device("cpu")) == SplitPlan(1)


@needs_triton
@pytest.mark.parametrize("num_splits,block_n,prefetch", [(1, 32, True), (2, 32, True),
                                                         (3, 32, False), (2, 16, True),
                                                         (1, 16, False), (2, 128, True),
                                                         (1, 128, False)])
def test_every_launch_a_plan_can_choose_gives_dense_attention(num_splits, block_n, prefetch):
    """Other key blocks (the plans' own 128 too), and loading ahead with several shares (what
    :func:`split_plan` may choose), read the same columns: rows that end inside, at and past a
    block's end."""
    wide = block_n >= 128
    pool = Pool(kv_heads=2, head_dim=16, num_slots=4, width=300 if wide else 112, seed=5)
    lengths, slots = [3, 127, 290] if wide else [3, 63, 95], [2, 0, 3]
    limits, ancestors, visible = chain_inputs(lengths, 2)
    q = torch.randn(3, 8, 2, 16, generator=torch.Generator().manual_seed(4))
    got, _ = run_both(q, pool, slots, limits, ancestors, 0.3, num_splits=num_splits,
                      block_n=block_n, prefetch=prefetch)
    torch.testing.assert_close(got, dense_expected(q, pool, slots, visible, 0.3), atol=1e-5,
                               rtol=1e-5)


def _compiled(kernel) -> int:
    """Variants of a Triton kernel compiled in this process (every device)."""
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


def _index_views(batch: int, num_new: int, kv_len: int, device: torch.device):
    """``slots [batch]``, ``limits``, ``ancestors [batch, num_new]`` as the runner passes them:
    views into one index tensor (the ancestors' row 16-byte aligned only when ``batch *
    num_new`` is even), a chain's limits ending at ``kv_len - 1``."""
    n = batch * num_new
    flat = torch.zeros(2 * n + batch, dtype=torch.long, device=device)
    limits, ancestors = flat[:n].view(batch, num_new), flat[n:2 * n].view(batch, num_new)
    slots = flat[2 * n:]
    limits += kv_len - num_new + torch.arange(num_new, device=device)
    slots += torch.arange(batch, device=device)
    return slots, limits, ancestors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles CUDA kernels (a GPU)")
def test_after_warm_up_no_step_size_compiles_a_kernel():
    """What a server's first requests used to wait for: after :func:`pa.warm_up`, steps of any
    batch, width, context length and launch plan, their index tensors views at any alignment,
    compile nothing."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    heads, kv_heads, head_dim = 9, 3, 64
    # (3 tile heights, each with the plans a step can get: a table 301 columns wide gives one
    # split or 2 or 4 shares of 64-column blocks; at the default 16,384, 9 plans)
    assert pa.warm_up(device, dtype, heads, kv_heads, head_dim, max_kv_len=301) == 3 * 3
    assert pa.warm_up(device, dtype, heads, kv_heads, head_dim) == 3 * 9
    before = _compiled(pa._paged_attention_kernel), _compiled(pa._combine_splits_kernel)
    pool = Pool(kv_heads, head_dim, num_slots=64, width=2048, seed=3, dtype=dtype)
    keys, values, table = pool.keys.to(device), pool.values.to(device), pool.table.to(device)
    for batch in (1, 2, 3, 16, 33):
        for num_new in (1, 2, 5, 11):
            for kv_len in (40, 1000, 2000):
                q = torch.randn(batch, heads, num_new, head_dim, dtype=dtype, device=device)
                slots, limits, ancestors = _index_views(batch, num_new, kv_len, device)
                plan = split_plan(batch, heads, kv_heads, num_new, kv_len, device)
                paged_attention(q, keys, values, table, slots, limits, ancestors, 0.125,
                                plan.num_splits, plan.block_n, prefetch=plan.prefetch)
    # a prompt chunk: 64-row tiles
    q = torch.randn(1, heads, 300, head_dim, dtype=dtype, device=device)
    slots, limits, ancestors = _index_views(1, 300, 300, device)
    paged_attention(q, keys, values, table, slots, limits, ancestors, 0.125)
    torch.cuda.synchronize()
    assert (_compiled(pa._paged_attention_kernel), _compiled(pa._combine_splits_kernel)) == before


def test_warm_up_is_a_no_op_off_cuda():
    assert pa.warm_up(torch.device("cpu"), torch.float32, 4, 2, 16) == 0
