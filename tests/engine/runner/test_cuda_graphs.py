"""CUDA graphs in the engine: greedy output stays HF's, with graphs and with enforce_eager.

The graph path itself (capture and replay) needs a CUDA device; its padded bucket layout is also
checked on CPU in ``test_model_runner.py``.
"""

import copy

import pytest
import torch
from conftest import tiny_model

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from tests.engine.llm_helpers import tiny_tokenizer
from tests.engine.test_llm_greedy import VOCAB, noisy_copy, prompts, run_staggered, spec

MAX_TOKENS = 24
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device")


def test_enforce_eager_is_checked_and_cpu_runs_eager():
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(model="x", enforce_eager="yes")
    llm = LLM(model=tiny_model("llama", vocab_size=VOCAB), tokenizer=tiny_tokenizer(VOCAB),
              device="cpu", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert llm.engine.runner.graphs is None


@torch.inference_mode()
def hf_greedy_on(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=MAX_TOKENS, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@needs_cuda
@pytest.mark.parametrize("method", [None, "ngram", "draft_model", "early_exit"])
def test_greedy_with_cuda_graphs_equals_hf(method):
    target = tiny_model("llama", vocab_size=VOCAB, seed=0).cuda()
    draft = noisy_copy(copy.deepcopy(target).cpu(), 0.3, seed=1).cuda()
    batch = prompts(12)
    arrivals = [0, 0, 0, 1, 2, 3, 5, 8, 9, 13, 14, 20]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [hf_greedy_on(target, p) for p in batch]
    for eager in (False, True):
        llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=12,
                  enforce_eager=eager,
                  speculative_config=None if method is None else spec(method, 3, draft))
        assert (llm.engine.runner.graphs is None) == eager
        assert run_staggered(llm, batch, params, arrivals) == expected
        if not eager:
            assert llm.engine.runner.graphs.num_replays >= MAX_TOKENS // 4
            proposer_runner = getattr(llm.engine.proposer, "runner", None)
            if proposer_runner is not None:  # the draft's small forwards replay graphs too
                assert proposer_runner.graphs.num_replays >= MAX_TOKENS // 4



@needs_cuda
def test_a_bucket_is_captured_when_it_comes_back():
    from engine.runner.model_runner import ModelRunner

    model = tiny_model("llama", vocab_size=VOCAB, seed=0).cuda()
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=256, max_model_len=64,
                         cuda_graph_max_new=2)
    slot = runner.allocate_slot()
    runner.forward([slot], [[3, 4, 5, 6]])  # a prefill: its bucket's first step, eager
    assert runner.graphs.decision[0] == (1, 16, 65)  # (a prefill bucket)
    first = runner.forward([slot], [[7]]).logits  # the bucket's first step: eager, no capture
    assert runner.graphs.num_graphs == 0 and runner.graphs.capture_seconds == 0
    runner.truncate(slot, 4)
    again = runner.forward([slot], [[7]]).logits  # the same bucket again: captured, replayed
    # (with its verification twin, 2 new tokens at the same batch and key length)
    assert runner.graphs.num_graphs == 2 and runner.graphs.capture_seconds > 0
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    runner.truncate(slot, 4)
    assert torch.equal(runner.forward([slot], [[7]]).logits, first)  # replayed, no capture
    runner.truncate(slot, 4)
    verify = runner.forward([slot], [[7, 8]]).logits  # the twin: replayed at its first step
    assert runner.graphs.num_graphs == 2 and runner.graphs.num_replays == 5  # (prefill too)
    torch.testing.assert_close(verify[0], first[0], rtol=1e-4, atol=1e-4)


@needs_cuda
def test_packed_verification_steps_replay_graphs_and_equal_hf(monkeypatch):
    """Requests capped at 0, 1 and 3 drafts (n-gram, every cap verified): their unequal steps
    are packed, one token a row (at any saving here), into captured decode buckets; greedy
    output stays Hugging Face's."""
    from engine.runner import step_layout

    monkeypatch.setattr(step_layout, "PACK_MIN_BATCH", 1)  # (packed at any size)
    monkeypatch.setattr(step_layout, "PACK_MAX_EXTRA", 100)
    target = tiny_model("llama", vocab_size=VOCAB, seed=0).cuda()
    batch = prompts(12)
    caps = [0, 1, None] * 4
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                             num_speculative_tokens=c) for c in caps]
    llm = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=12,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                  "adaptive_k": False})
    runner = llm.engine.runner
    packed, forward = [], runner.forward

    def counted(*args, **kwargs):
        out = forward(*args, **kwargs)
        packed.append(out.packed_rows)
        return out

    runner.forward = counted
    outs = llm.generate(batch, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy_on(target, p) for p in batch]
    assert sum(rows is not None for rows in packed) >= 3
    # (a decode bucket past the 12 sequences' 16 rows: a packed step's graph)
    assert any(key[0] > 16 and key[1] == 1 for key in runner.graphs._graphs)


def test_the_collector_is_paused_inside_a_capture_and_restored_after():
    """Graph captures run with the cyclic collector off (``samplers.graph_capture``): garbage
    holding another graph must not be destroyed mid-capture; the collector's state returns."""
    import gc

    from samplers.graph_capture import gc_paused

    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
    gc.enable()
