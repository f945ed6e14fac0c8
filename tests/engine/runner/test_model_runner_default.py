"""The runner on the embedded default model (SmolLM2-135M-Instruct, float32): a prefill, then
(k+1)-token verification steps with rollbacks, match one plain full-sequence forward."""

from __future__ import annotations

import random

import pytest
import torch

from engine.runner.model_runner import ModelRunner

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Speculative decoding lets a small model propose tokens that a large model",
]
# Logits reach ~28 here; float32 rounding differs between a padded batch and a single sequence:
# Hugging Face's own right-padded batch forward differs from the single-sequence one by 4e-5, and
# oneDNN's blocked sums (engine/runner/cpu_linears.py, one of its routes) from MKL's by up to
# 1.1e-4 (a relative 8e-6: float32's rounding over sums of 576-1536 terms).
ATOL = 2e-4


@pytest.mark.slow
def test_default_model_steps_match_full_forward(default_model):
    model, tokenizer = default_model
    runner = ModelRunner(model, max_num_seqs=4, max_num_tokens=512, max_model_len=128)
    rng = random.Random(0)
    seqs = {runner.allocate_slot(): [] for _ in PROMPTS}
    for step in range(4):
        if step == 0:  # prefill every prompt at once
            new = {slot: tokenizer(p)["input_ids"] for slot, p in zip(seqs, PROMPTS, strict=True)}
        else:  # verification: 5 tokens (last token + 4 drafts) per sequence
            vocab = model.config.vocab_size
            new = {slot: [rng.randrange(vocab) for _ in range(5)] for slot in seqs}
        starts = {slot: runner.seq_len(slot) for slot in seqs}
        out = runner.forward(list(new), list(new.values())).logits
        row = 0
        for slot, tokens in new.items():
            seqs[slot] += tokens
            with torch.no_grad():
                full = model(input_ids=torch.tensor([seqs[slot]])).logits[0]  # [len, vocab_size]
            start, n = starts[slot], len(tokens)
            torch.testing.assert_close(out[row:row + n], full[start:start + n], atol=ATOL, rtol=0)
            row += n
        if step > 0:  # keep the accepted prefix: 1..5 of the new tokens
            for slot in seqs:
                keep = starts[slot] + rng.randint(1, 5)
                runner.truncate(slot, keep)
                del seqs[slot][keep:]
