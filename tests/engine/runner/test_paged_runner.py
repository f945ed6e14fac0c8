"""The runner with ``attention_backend="paged"``: logits equal a plain full forward of each
sequence (random joins, leaves, rollbacks and appends, the graph buckets' padded layout, draft
trees against the gather backend), the pool read in place, and the options it refuses.

On CPU the attention runs the PyTorch reference; under ``TRITON_INTERPRET=1`` the ``kernel``
cases run the Triton kernel itself (on a GPU, the CUDA-graph case does)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.runner import paged_attention
from engine.runner.model_runner import ModelRunner
from tests.conftest import INTERPRETED, tiny_model
from tests.engine.runner.test_model_runner import ATOL, full_logits, random_schedule

PATHS = ["reference", pytest.param("kernel", marks=pytest.mark.skipif(
    not INTERPRETED, reason="the kernel on CPU tensors needs TRITON_INTERPRET=1"))]


@pytest.fixture
def path(request, monkeypatch):
    """Which attention a CPU forward runs: the reference, or the kernel through Triton's
    interpreter."""
    monkeypatch.setattr(paged_attention, "_INTERPRETED", request.param == "kernel")
    return request.param


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_random_interleavings_match_full_forward(family, path):
    model = tiny_model(family, vocab_size=96, seed=1)
    runner = ModelRunner(model, max_num_seqs=4, max_num_tokens=96, max_model_len=40,
                         attention_backend="paged")
    random_schedule(runner, model, seed=11, num_steps=20, vocab_size=96)


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_graph_bucket_layout_matches_full_forward(path):
    """Padded buckets (scratch sequences, key lengths rounded up) read the pool in place too."""
    model = tiny_model("qwen3", vocab_size=96, seed=4)
    runner = ModelRunner(model, max_num_seqs=5, max_num_tokens=160, max_model_len=40,
                         attention_backend="paged")
    runner.use_graph_buckets(3, capture=False)
    random_schedule(runner, model, seed=14, num_steps=20, vocab_size=96)
    assert runner.graphs.num_replays > 5


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_a_draft_tree_step_matches_the_gather_backend(path):
    """A step with a draft tree on one row and a chain on another: the paged runner's logits
    are the gather runner's (its 4-D mask built from the same limits and ancestor bits)."""
    model = tiny_model("llama", vocab_size=96, seed=6)
    runners = [ModelRunner(model, max_num_seqs=3, max_num_tokens=120, max_model_len=40,
                           attention_backend=backend) for backend in ("paged", "gather")]
    rng = random.Random(3)
    prompts = [[rng.randrange(96) for _ in range(n)] for n in (9, 4)]
    new = [[rng.randrange(96) for _ in range(6)], [rng.randrange(96) for _ in range(2)]]
    trees = [(1, [-1, 0, 0, 1, -1]), None]  # (row 0: a token, then 5 nodes)
    outs = []
    for runner in runners:
        slots = [runner.allocate_slot() for _ in prompts]
        runner.forward(slots, prompts)
        outs.append(runner.forward(slots, new, trees=trees).logits)
    torch.testing.assert_close(outs[0], outs[1], atol=ATOL, rtol=ATOL)
    # the chain row against a plain forward too
    expected = full_logits(model, prompts[1] + new[1])[-2:]
    torch.testing.assert_close(outs[0][-2:], expected, atol=ATOL, rtol=ATOL)


def test_update_returns_the_pool_itself_and_gathers_nothing():
    model = tiny_model("llama", vocab_size=96, seed=2)
    runner = ModelRunner(model, max_num_seqs=3, max_num_tokens=60, max_model_len=20,
                         attention_backend="paged")
    slots = [runner.allocate_slot() for _ in range(2)]
    runner.forward(slots, [[5, 6, 7], [8, 9]])  # (two rows: off the lone-sequence fast path)
    cache = runner.cache
    assert cache._run is None and cache._read_rows == {}
    # (the last step's layout: 2 rows padded to 3 new tokens)
    keys, values = cache.update(torch.zeros(2, 2, 3, 16), torch.zeros(2, 2, 3, 16), 0)
    assert keys.data_ptr() == cache.pools[0][0].data_ptr()
    assert keys.shape == (1, 2, 61, 16) and values.shape == keys.shape


def test_bad_backends_are_refused_by_name():
    with pytest.raises(ValueError, match="attention_backend must be one of.*'flash'"):
        ModelRunner(tiny_model("llama"), max_num_seqs=1, max_num_tokens=8, max_model_len=8,
                    attention_backend="flash")
    eager = tiny_model("llama", attn_implementation="eager")
    with pytest.raises(ValueError, match="attn_implementation='sdpa', got 'eager'"):
        ModelRunner(eager, max_num_seqs=1, max_num_tokens=8, max_model_len=8,
                    attention_backend="paged")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_match_the_gather_backend(dtype):
    """On a GPU: decode, verification and prefill steps replay captured graphs whose attention
    is the kernel; float32 logits match a full forward, bf16 ones the gather backend's."""
    model = tiny_model("llama", vocab_size=96, seed=5, dtype=dtype).cuda()
    runner = ModelRunner(model, max_num_seqs=5, max_num_tokens=400, max_model_len=300,
                         cuda_graph_max_new=4, attention_backend="paged")
    if dtype == torch.float32:
        random_schedule(runner, model, seed=15, num_steps=40, vocab_size=96)
        assert runner.graphs.num_graphs > 0 and runner.graphs.num_replays > 10
        return
    gather = ModelRunner(model, max_num_seqs=5, max_num_tokens=400, max_model_len=300,
                         cuda_graph_max_new=4)
    rng = random.Random(1)
    slots = [[r.allocate_slot() for _ in range(3)] for r in (runner, gather)]
    prompts = [[rng.randrange(96) for _ in range(n)] for n in (30, 7, 120)]
    for r, s in zip((runner, gather), slots, strict=True):
        r.forward(s, prompts)
    for step in range(8):
        new = [[rng.randrange(96) for _ in range(1 + step % 4)] for _ in prompts]
        paged_out, gather_out = (r.forward(s, new).logits
                                 for r, s in zip((runner, gather), slots, strict=True))
        torch.testing.assert_close(paged_out, gather_out, atol=5e-2, rtol=5e-2)
    assert runner.graphs.num_replays > 4


def test_paged_graphs_are_keyed_by_the_launch_plan_only():
    """The paged kernel reads each row's length on the device, so a graph's key length only
    picks the launch plan: seven key lengths serve every context of a 16,384-token table (each
    one at least the step's own, never past the table), where the gather runner's rounding
    (a copy of that many columns a layer) keeps 15."""
    from engine.runner.cuda_graphs import kv_bucket

    limit = 16385
    buckets = {n: paged_attention.split_bucket(n, limit) for n in range(1, limit + 1)}
    assert all(n <= b <= limit for n, b in buckets.items())
    assert sorted(set(buckets.values())) == [256, 512, 1024, 2048, 4096, 8192, limit]
    assert len({kv_bucket(n, limit) for n in range(1, limit + 1)}) == 15
    model = tiny_model("llama", vocab_size=96, seed=2)
    for backend, expected in (("paged", 512), ("gather", kv_bucket(300, 601))):
        runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=64, max_model_len=600,
                             attention_backend=backend)
        runner.use_graph_buckets(3, capture=False)
        assert runner.graphs.bucket(1, 1, 300) == (1, 1, expected)
