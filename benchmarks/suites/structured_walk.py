"""The grammar's host work for one engine step, without a model: ``python -m benchmarks
structured --walk-only``.

``batch`` samples under the extraction schema, each at its own point of a real JSON answer
tokenized by the model's tokenizer, each with the next ``k`` tokens of that answer as drafts
: per step, the forced
tokens' look-up, the batched walk (masks of the k + 1 positions), applying the masks to a
``[batch * (k + 1), vocab_size]`` logits tensor on the device, and the matchers' advance by the
drafts, then their rollback to the step's start (so that every timed step is the same).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch


def answer_ids(tokenizer: Any) -> list[int]:
    """A compact JSON answer of the extraction schema, tokenized."""
    text = json.dumps({"name": "Kenji Watanabe", "age": 51, "email": "k.watanabe@example.org",
                       "city": "Osaka"}, separators=(", ", ": "))
    return list(tokenizer.encode(text, add_special_tokens=False))


def walk_rows(tokenizer: Any, vocab_size: int, schema: dict, batches: list[int], k: int,
              device: str, steps: int, any_whitespace: bool) -> list[dict]:
    from samplers.structured import (
        Grammars,
        GrammarState,
        StructuredOutputsParams,
        apply_bitmask,
        walk_drafts,
    )

    grammars = Grammars(tokenizer, vocab_size, [tokenizer.eos_token_id])
    compiled = grammars.compile(StructuredOutputsParams(
        json=schema, disable_any_whitespace=not any_whitespace))
    ids = answer_ids(tokenizer)
    rows = []
    for batch in batches:
        states, drafts = [], []
        for i in range(batch):
            s = GrammarState(compiled, vocab_size)
            at = (i * 3) % max(1, len(ids) - k)
            assert s.advance(ids[:at])
            states.append(s)
            drafts.append(ids[at:at + k])
        logits = torch.zeros(batch * (k + 1), vocab_size, device=device)
        times: dict[str, list[float]] = {"forced": [], "walk": [], "apply": [], "advance": []}
        for _ in range(steps):
            t0 = time.perf_counter()
            for s in states:
                s.forced_tokens(8)
            t1 = time.perf_counter()
            _, masks = walk_drafts(states, drafts, grammars.batcher)
            t2 = time.perf_counter()
            apply_bitmask(logits, torch.cat(masks), list(range(batch * (k + 1))))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t3 = time.perf_counter()
            for s, d in zip(states, drafts, strict=True):
                s.advance(d)
            t4 = time.perf_counter()
            for s, d in zip(states, drafts, strict=True):
                s.matcher.rollback(len(d))
            for name, a, b in (("forced", t0, t1), ("walk", t1, t2), ("apply", t2, t3),
                               ("advance", t3, t4)):
                times[name].append(b - a)
        row = {"batch_size": batch, "k": k, "vocab_size": vocab_size,
               **{f"{n}_us": 1e6 * statistics.median(v) for n, v in times.items()}}
        row["total_us"] = sum(row[f"{n}_us"] for n in times)
        row["per_position_us"] = row["total_us"] / (batch * (k + 1))
        rows.append(row)
        print(f"batch {batch:3d} k {k}: forced {row['forced_us']:7.0f} walk {row['walk_us']:7.0f}"
              f" apply {row['apply_us']:7.0f} advance {row['advance_us']:7.0f} -> "
              f"{row['total_us']:7.0f} us a step ({row['per_position_us']:.1f} us a position)")
    return rows
