"""``LLM(attention_backend="paged")``: greedy output is the target's own HF greedy output (plain
decoding and speculation, staggered arrivals: rows of different lengths in one step), and the
option is checked by name. On CPU the paged reads run the PyTorch reference (or the kernel
through Triton's interpreter under ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from engine.config import ATTENTION_BACKENDS, EngineConfig
from engine.runner import kv_cache
from tests.engine.llm_helpers import hf_greedy, staggered_samples, tiny_tokenizer

VOCAB = 32
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


@pytest.mark.parametrize("method", [None, "ngram"])
def test_paged_greedy_equals_hf_with_staggered_arrivals(target, method):
    batch = [[5, 9, 3], [7, 7, 2, 8, 30, 4, 4, 11, 6], [12, 3, 3, 3, 3], [20, 21]]
    spec = None if method is None else {"method": method, "num_speculative_tokens": 3,
                                        "adaptive_k": False}
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), speculative_config=spec,
              max_num_seqs=4, attention_backend="paged")
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = staggered_samples(llm, batch, [params] * len(batch), [0, 0, 2, 5])
    assert [o[0] for o in outs] == [hf_greedy(target, p, MAX_TOKENS) for p in batch]
    if method is not None:
        assert llm.get_metrics().num_accepted > 0  # (verification steps ran)


def test_paged_reads_of_cached_prefixes_equal_hf(target):
    """With the prefix cache a sequence's first slot-table columns point at rows another
    request left (shared, never written); paged attention reads them in place like its own."""
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4,
              attention_backend="paged", enable_prefix_caching=True,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    shared = [5, 9, 3, 7, 7, 2, 8, 30, 4, 4, 11, 6]
    prompts = [shared + [12], shared + [20, 21], shared[:8] + [3]]
    for prompt in prompts:  # (one after another: each later one reads the earlier's rows)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, MAX_TOKENS)
    assert llm.get_metrics().prefix_cache_hits > 0


def test_the_option_is_checked_by_name():
    with pytest.raises(ValueError, match=r"EngineConfig.attention_backend='flash' is invalid: "
                                         r"allowed auto \| gather \| paged"):
        EngineConfig(attention_backend="flash")
    assert EngineConfig().attention_backend == "auto"
    with pytest.raises(ValueError, match=r"attention_backend='paged' is invalid: allowed "
                                         r"'gather' with tensor_parallel_size > 1"):
        EngineConfig(attention_backend="paged", tensor_parallel_size=2)
    assert ATTENTION_BACKENDS == kv_cache.ATTENTION_BACKENDS  # (the runner's own list)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the paged kernel is compiled on a CUDA device only"))])
def test_auto_reads_in_place_on_cuda_and_gathers_elsewhere(device):
    """``attention_backend="auto"`` (the default): paged on one CUDA device, gather on CPU."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=0).to(device)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(VOCAB), device=device, max_num_seqs=2)
    assert llm.engine.runner._executor.paged == (device == "cuda")
    prompt = [5, 9, 3, 7]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(model, prompt, MAX_TOKENS)
