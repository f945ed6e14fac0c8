"""A vLLM offline script, unchanged but for its import, against the embedded default model: its
keywords run, and its outputs have vLLM's types and values (raw logprobs and prompt logprobs
against a plain forward of the model)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams  # was: from vllm import LLM, SamplingParams
from engine.logprobs import Logprob


@pytest.mark.slow
def test_a_vllm_offline_script(default_model):
    # ---- the script, as written for vLLM
    llm = LLM(model="smollm2-135m", dtype="float32", gpu_memory_utilization=0.8,
              max_model_len=512, seed=0, trust_remote_code=False, tensor_parallel_size=1,
              enforce_eager=True, disable_log_stats=True)
    prompts = ["The capital of France is", "Write a haiku about the sea."]
    params = SamplingParams(n=2, temperature=0.8, top_p=0.95, seed=42, max_tokens=16,
                            stop=["\n\n"], logprobs=3, prompt_logprobs=2)
    outputs = llm.generate(prompts, params)
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    chat = llm.chat([{"role": "user", "content": "Say hello."}],
                    SamplingParams(temperature=0, max_tokens=8))
    # ---- what a vLLM user reads back
    model = llm.llm_engine.model
    for output, prompt in zip(outputs, prompts, strict=True):
        assert output.prompt == prompt and len(output.outputs) == 2
        ids = output.prompt_token_ids
        with torch.inference_mode():
            logits = model(torch.tensor([ids], device=model.device)).logits[0]
            prompt_rows = torch.log_softmax(logits.double(), -1).cpu()
        assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(ids)
        for pos in range(1, len(ids)):
            entry = output.prompt_logprobs[pos]
            assert isinstance(entry[ids[pos]], Logprob) and len(entry) in (2, 3)
            assert entry[ids[pos]].logprob == pytest.approx(float(prompt_rows[pos - 1, ids[pos]]),
                                                            abs=1e-3)
        for sample in output.outputs:
            assert isinstance(sample.text, str) and sample.finish_reason in ("stop", "length")
            assert len(sample.logprobs) == len(sample.token_ids) <= 16
            context = ids + sample.token_ids
            with torch.inference_mode():
                logits = model(torch.tensor([context], device=model.device)).logits[0]
                rows = torch.log_softmax(logits.double(), -1).cpu()
            total = 0.0
            for j, (token, entry) in enumerate(zip(sample.token_ids, sample.logprobs,
                                                   strict=True)):
                row = rows[len(ids) - 1 + j]  # raw: before temperature and top-p
                assert entry[token].logprob == pytest.approx(float(row[token]), abs=1e-3)
                assert entry[token].rank == int((row > row[token]).sum()) + 1
                assert entry[token].decoded_token == llm.get_tokenizer().decode([token])
                assert len(entry) in (3, 4)
                total += entry[token].logprob
            assert sample.cumulative_logprob == pytest.approx(total, abs=1e-3)
    for output in greedy:
        with torch.inference_mode():
            want = model.generate(torch.tensor([output.prompt_token_ids], device=model.device),
                                  do_sample=False,
                                  max_new_tokens=8)[0, len(output.prompt_token_ids):].tolist()
        assert output.outputs[0].token_ids == want[:len(output.outputs[0].token_ids)]
    assert chat[0].prompt.startswith("<|im_start|>") and "Say hello." in chat[0].prompt
    assert chat[0].outputs[0].text
