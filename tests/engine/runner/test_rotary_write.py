"""The rotary embedding and the paged cache's write in one launch (engine/runner/rotary_write.py):
the kernel against transformers' rotary and the pool write, bit for bit; a paged runner's LLaMA
attention taking it, with the same logits as the two launches; the paths that keep them."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from engine.runner import fused_layers, kv_cache
from engine.runner.fused_ops import fused_forward, install_fused_ops, rotary_reference
from engine.runner.kv_cache import PagedKVCache
from engine.runner.kv_write import write_kv_reference
from engine.runner.model_runner import ModelRunner
from engine.runner.rotary_write import rotary_write as fused_write
from engine.runner.rotary_write import rotary_write_reference
from tests.conftest import DEVICE, INTERPRETED, needs_triton, tiny_model
from tests.engine.runner.test_fused_ops import counting

pytestmark = needs_triton


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cos_batch,seq", [(1, 1), (3, 4)])
def test_queries_rotated_and_keys_rotated_into_the_pool_with_the_values(dtype, cos_batch, seq):
    gen = torch.Generator().manual_seed(seq)
    batch, heads, kv_heads, dim = 3, 6, 2, 32
    # the stacked projection's layout: q, k, v strided views of one [batch, seq, width] product
    qkv = torch.randn(batch, seq, (heads + 2 * kv_heads) * dim, generator=gen).to(DEVICE, dtype)
    q = qkv[..., :heads * dim].view(batch, seq, heads, dim).transpose(1, 2)
    k = qkv[..., heads * dim:(heads + kv_heads) * dim].view(batch, seq, kv_heads, dim)
    k = k.transpose(1, 2)
    v = qkv[..., (heads + kv_heads) * dim:].view(batch, seq, kv_heads, dim).transpose(1, 2)
    angles = torch.randn(cos_batch, seq, dim, generator=gen) * 3
    cos, sin = angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)
    num_rows = 40
    rows = torch.randperm(num_rows, generator=gen)[:batch * seq].to(DEVICE)  # scattered rows
    pool = torch.randn(2, 1, kv_heads, num_rows, dim, generator=gen).to(DEVICE, dtype)
    want_pool = pool.clone()
    want_q = rotary_write_reference(q, k, v, cos, sin, want_pool, rows)
    got_q = fused_write(q, k, v, cos, sin, pool, rows)
    # the reference is transformers' rotary, then the index_copy_ write
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    by_hand = pool.clone()
    write_kv_reference(by_hand.copy_(want_pool), k_hf, v, rows)
    assert torch.equal(want_q, q_hf) and torch.equal(by_hand, want_pool)
    exact = INTERPRETED or dtype != torch.float32  # (compiled float32 may fuse a rounding)
    # (the memory layout of transformers' result; a size-1 dimension's stride is free)
    assert [st for st, n in zip(got_q.stride(), q.shape, strict=True) if n > 1] == [
        st for st, n in zip(q_hf.stride(), q.shape, strict=True) if n > 1]
    assert torch.equal(got_q, q_hf) if exact else torch.allclose(got_q, q_hf, atol=1e-6)
    assert torch.equal(pool, want_pool) if exact else torch.allclose(pool, want_pool, atol=1e-6)
    untouched = torch.ones(num_rows, dtype=torch.bool)
    untouched[rows.cpu()] = False
    assert torch.equal(pool[..., untouched.to(DEVICE), :], want_pool[..., untouched.to(DEVICE), :])
    swapped = fused_write(q, k, v, sin, cos, pool.clone(), rows)  # (the check can fail)
    assert not torch.equal(swapped, got_q)


def _logits(runner: ModelRunner, seed: int, steps: int) -> list[torch.Tensor]:
    """A random schedule of prompts and 1-5 token steps on ``runner``, its logits each step."""
    rng = random.Random(seed)
    vocab = runner._executor.model.config.vocab_size
    slots = [runner.allocate_slot() for _ in range(3)]
    out = [runner.forward(slots, [[rng.randrange(vocab) for _ in range(rng.randint(3, 7))]
                                  for _ in slots]).logits]
    for _ in range(steps):
        batch = rng.sample(slots, rng.randint(1, 3))
        new = [[rng.randrange(vocab) for _ in range(rng.choice([1, 1, 2, 5]))] for _ in batch]
        out.append(runner.forward(batch, new).logits)
        if rng.random() < 0.3:
            slot = rng.choice(batch)
            runner.truncate(slot, runner.seq_len(slot) - 1)
    return out


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_paged_runner_writes_through_the_one_launch_with_the_same_logits(monkeypatch, dtype):
    def runner() -> ModelRunner:
        return ModelRunner(tiny_model("llama", num_layers=2).to(dtype), max_num_seqs=3,
                           max_num_tokens=96, max_model_len=40, fused_ops=True,
                           attention_backend="paged")

    fused = runner()
    assert fused.fused["attention"] == 2
    calls = {"fused": 0}
    monkeypatch.setattr(PagedKVCache, "update_rotated", counting(
        calls, "fused", PagedKVCache.update_rotated))
    got = _logits(fused, seed=3, steps=8)
    assert calls["fused"] > 0
    monkeypatch.setattr(PagedKVCache, "update_rotated", lambda *args: None)
    want = _logits(runner(), seed=3, steps=8)  # (the fused rotary, then the cache's write)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
def test_where_the_one_launch_does_not_run(monkeypatch):
    calls = {"write": 0}
    monkeypatch.setattr(kv_cache, "rotary_write", counting(calls, "write", fused_write))
    model = tiny_model("llama", num_layers=2)
    # the gather backend's cache reads copies: the rotary and update as transformers runs them
    gather = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20,
                         fused_ops=True, attention_backend="gather")
    gather.forward([gather.allocate_slot()], [[3, 4, 5]])
    # a lone sequence on one run of rows is read as a slice (update's fast path)
    paged = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20,
                        fused_ops=True, attention_backend="paged")
    slot = paged.allocate_slot()
    paged.forward([slot], [[3, 4, 5]])
    assert calls["write"] == 0
    paged.forward([slot, paged.allocate_slot()], [[6], [7, 8]])
    assert calls["write"] == 2  # (a layer each)
    # another attention code keeps its forward
    attention = model.model.layers[0].self_attn
    assert attention.forward.__func__ is fused_layers._attention_forward
    other = tiny_model("llama", num_layers=1)
    other.model.layers[0].self_attn.forward = other.model.layers[0].self_attn.forward
    assert fused_layers.install_fused_attention(other) == 0


class _Cache:
    """A cache that keeps nothing: ``update`` returns what it is given; ``update_rotated`` (when
    ``rotates``) rotates by transformers' reference and returns the same, counting its calls."""

    def __init__(self, rotates: bool) -> None:
        self.rotates, self.calls = rotates, []

    def update(self, key, value, layer_idx, *args, **kwargs):
        return key, value

    def update_rotated(self, query, key, value, cos, sin, layer_idx):
        self.calls.append(layer_idx)
        if not self.rotates:
            return None
        rotated_query, rotated_key = rotary_reference(query, key, cos, sin)
        return rotated_query, rotated_key, value


@pytest.mark.skipif(not INTERPRETED, reason="a CPU model: Triton's interpreter")
@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_the_attention_takes_the_cache_under_either_name(name):
    """Transformers passes the cache as ``cache`` (newer) or ``past_key_values`` (older): the
    fused attention finds it under both, and gives transformers' forward's output either way."""
    model = tiny_model("llama", num_layers=1)
    install_fused_ops(model, torch.device("cpu"))
    assert fused_layers.install_fused_attention(model) == 1
    attention = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, 3, model.config.hidden_size, generator=gen)
    position_ids = torch.arange(3).expand(2, 3)
    cos, sin = model.model.rotary_emb(hidden, position_ids)
    outputs = []
    for rotates in (True, False):
        cache = _Cache(rotates)
        with torch.no_grad(), fused_forward():
            outputs.append(attention(hidden_states=hidden, position_embeddings=(cos, sin),
                                     attention_mask=None, **{name: cache})[0])
        assert cache.calls == [0]
    with torch.no_grad():  # (transformers' own forward, with the cache as its name today)
        want = type(attention).forward(attention, hidden, position_embeddings=(cos, sin),
                                       attention_mask=None, cache=_Cache(False))[0]
    torch.testing.assert_close(outputs[0], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(outputs[0], outputs[1])
