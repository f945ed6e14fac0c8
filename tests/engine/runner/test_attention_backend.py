"""The runner's CPU attention for grouped-query models with a mask, and its packed CPU head."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.runner import attention_backend
from engine.runner.attention_backend import (
    GQA_SDPA,
    folded_gqa_sdpa,
    gqa_attention,
    gqa_sdpa_attention,
    install_gqa_attention,
    without_cudnn_attention,
)
from engine.runner.cpu_lm_head import output_head
from engine.runner.model_runner import ModelRunner
from tests.conftest import tiny_model


def attention_inputs(num_new, kv_len, heads=6, kv_heads=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(2, heads, num_new, 16, generator=gen)  # [batch, heads, num_new, dim]
    key = torch.randn(2, kv_heads, kv_len, 16, generator=gen)  # [batch, kv_heads, kv_len, dim]
    value = torch.randn(2, kv_heads, kv_len, 16, generator=gen)
    # [batch, 1, num_new, kv_len]: causal over the last num_new keys, sequence 1 shorter by 3
    mask = torch.zeros(2, 1, num_new, kv_len)
    future = torch.triu(torch.ones(num_new, num_new, dtype=torch.bool), 1)
    mask[:, 0, :, kv_len - num_new:].masked_fill_(future, torch.finfo(torch.float32).min)
    mask[1, 0, :, :3] = torch.finfo(torch.float32).min
    return query, key, value, mask


class Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize("num_new,kv_len", [(1, 7), (5, 40), (3, 3)])
def test_masked_gqa_equals_repeated_heads_bit_for_bit(num_new, kv_len):
    query, key, value, mask = attention_inputs(num_new, kv_len)
    want, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.25)
    got, _ = gqa_sdpa_attention(Module(), query, key, value, mask, scaling=0.25)
    assert got.shape == want.shape == (2, num_new, 6, 16)
    assert torch.equal(got, want)
    # (no mask: transformers' own path, which already passes enable_gqa)
    got, _ = gqa_sdpa_attention(Module(), query, key, value, None, scaling=0.25)
    want, _ = sdpa_attention_forward(Module(), query, key, value, None, scaling=0.25)
    assert torch.equal(got, want)


@pytest.mark.parametrize("num_new,kv_len", [(1, 7), (5, 40), (3, 3)])
def test_folded_gqa_equals_repeated_heads(num_new, kv_len):
    """The CUDA path's layout (group heads folded into the query rows), checked on CPU."""
    query, key, value, mask = attention_inputs(num_new, kv_len)
    want, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.25)
    got = folded_gqa_sdpa(query, key, value, mask, scaling=0.25)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    shared = folded_gqa_sdpa(query, key, value, mask[:1], scaling=0.25)  # one mask for the batch
    want, _ = sdpa_attention_forward(Module(), query, key, value, mask[:1], scaling=0.25)
    torch.testing.assert_close(shared, want, rtol=1e-6, atol=1e-6)


def test_the_switch_is_scoped_to_sdpa_models_and_to_the_runners_forwards():
    """Found in review: every forward flipped the model's attention implementation (and the
    cuDNN flag on CPU too). A runner now points an sdpa model at its function once, and the
    function reads the shared heads in place only inside the runner's own forwards."""
    model = tiny_model("llama")
    install_gqa_attention(model.config)
    assert model.config._attn_implementation == GQA_SDPA
    query, key, value, mask = attention_inputs(5, 40)
    with pytest.MonkeyPatch.context() as patch:
        calls = []
        patch.setattr(attention_backend, "sdpa_attention_forward",
                      lambda *a, **k: calls.append(1) or sdpa_attention_forward(*a, **k))
        gqa_sdpa_attention(Module(), query, key, value, mask)  # outside: transformers' sdpa
        assert calls == [1]
        with gqa_attention():
            gqa_sdpa_attention(Module(), query, key, value, mask)  # inside: heads in place
        assert calls == [1]
        with pytest.raises(RuntimeError), gqa_attention():
            raise RuntimeError("a failing forward")
        gqa_sdpa_attention(Module(), query, key, value, mask)  # the switch did not leak
        assert calls == [1, 1]
    eager = tiny_model("llama", attn_implementation="eager")
    install_gqa_attention(eager.config)
    assert eager.config._attn_implementation == "eager"


def test_a_cpu_forward_leaves_the_cudnn_flag_alone(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp",
                        lambda _: pytest.fail("the flag was written on a CPU forward"))
    with without_cudnn_attention(torch.device("cpu")):
        pass


def test_hf_generate_on_a_model_a_runner_took_is_unchanged():
    model = tiny_model("llama", vocab_size=256)
    prompt = torch.tensor([[5, 9, 3, 7, 1, 2]])
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        before = model.generate(prompt, **kwargs)
        ModelRunner(model, max_num_seqs=1, max_num_tokens=64, max_model_len=64)
        assert model.config._attn_implementation == GQA_SDPA
        assert torch.equal(model.generate(prompt, **kwargs), before)


def test_runner_scores_like_the_model_with_grouped_query_attention():
    """Verification-shaped steps (several new tokens, a mask) through the switched attention
    and the packed head give the model's own logits."""
    model = tiny_model("llama", vocab_size=256)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=128, max_model_len=64)
    a, b = runner.allocate_slot(), runner.allocate_slot()
    prompts = [[5, 9, 3, 7, 1, 2], [8, 8, 4]]
    runner.forward([a, b], prompts)
    steps = [[11, 12, 13, 14, 15], [21, 22]]
    got = runner.forward([a, b], steps).logits  # [7, vocab_size]
    with torch.no_grad():
        for row, (prompt, step) in zip((0, 5), zip(prompts, steps, strict=True), strict=True):
            want = model(torch.tensor([prompt + step])).logits[0, len(prompt):]
            torch.testing.assert_close(got[row:row + len(step)], want, rtol=1e-4, atol=1e-4)


def test_packed_head_matches_the_linear_head():
    model = tiny_model("qwen2", vocab_size=300)
    head = output_head(model)
    assert head is not model.lm_head  # packed on CPU in float32
    hidden = torch.randn(5, 64)
    for rows in (0, 1, 2, 5):
        torch.testing.assert_close(head(hidden[:rows]), model.lm_head(hidden[:rows]),
                                   rtol=1e-5, atol=1e-5)
    assert torch.equal(head(hidden[:1]), model.lm_head(hidden[:1]))  # one row: nn.Linear
    assert output_head(tiny_model("qwen2", dtype=torch.bfloat16)) is not None
    bf16 = tiny_model("qwen2", dtype=torch.bfloat16)
    assert output_head(bf16) is bf16.lm_head  # only float32 is packed
