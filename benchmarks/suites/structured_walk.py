"""The grammar's host work for one engine step, without a model: ``python -m benchmarks
structured --walk-only``.

``batch`` samples under the extraction schema, each at its own point of a real JSON answer
tokenized by the model's tokenizer, each with the next ``k`` tokens of that answer as drafts.
Per step, as the engine does it: the forced tokens' look-up, the walk
(``engine.grammar_steps.GrammarMasks.start`` without its worker thread: masks of the k + 1
positions into the step's host buffer), applying them to a ``[batch * (k + 1), vocab_size]``
logits tensor on the device (``apply``: the copy, on a GPU, and the op), and the matchers'
advance by the drafts and the bonus token; then their rollback to the step's start (untimed,
so that every timed step is the same). The walk is split into the library's batched fills and
accepts and the Python around them; on a GPU the copy is timed apart from the op.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch

PARTS = ("forced", "walk", "apply", "advance")


def answer_ids(tokenizer: Any) -> list[int]:
    """A compact JSON answer of the extraction schema, tokenized."""
    text = json.dumps({"name": "Kenji Watanabe", "age": 51, "email": "k.watanabe@example.org",
                       "city": "Osaka"}, separators=(", ", ": "))
    return list(tokenizer.encode(text, add_special_tokens=False))


class TimedBatcher:
    """A ``BatchGrammarMatcher`` whose fills and accepts add up their seconds."""

    def __init__(self, batcher: Any) -> None:
        self.batcher, self.fill_s, self.accept_s = batcher, 0.0, 0.0

    def batch_fill_next_token_bitmask(self, *args: Any) -> None:
        start = time.perf_counter()
        self.batcher.batch_fill_next_token_bitmask(*args)
        self.fill_s += time.perf_counter() - start

    def batch_accept_token(self, *args: Any) -> list[bool]:
        start = time.perf_counter()
        try:
            return self.batcher.batch_accept_token(*args)
        finally:
            self.accept_s += time.perf_counter() - start


def walk_rows(tokenizer: Any, vocab_size: int, schema: dict, batches: list[int], k: int,
              device: str, steps: int, any_whitespace: bool) -> list[dict]:
    from engine.grammar_steps import GrammarMasks
    from engine.step_records import SeqStep
    from samplers.structured import Grammars, GrammarState, StructuredOutputsParams

    grammars = Grammars(tokenizer, vocab_size, [tokenizer.eos_token_id])
    compiled = grammars.compile(StructuredOutputsParams(
        json=schema, disable_any_whitespace=not any_whitespace))
    timed = TimedBatcher(grammars.batcher)
    grammars._batcher = timed
    masks = GrammarMasks(grammars, torch.device(device), overlap=False)
    ids = answer_ids(tokenizer)
    cuda = device.startswith("cuda")
    rows = []
    for batch in batches:
        items, kept = [], []
        for i in range(batch):
            s = GrammarState(compiled, vocab_size)
            at = (i * 3) % max(1, len(ids) - k - 1)
            assert s.advance(ids[:at])
            # (all the masks read of a sequence)
            seq = type("Seq", (), {"grammar": s, "is_finished": False})()
            items.append(SeqStep(seq, 1, True, k, drafts=ids[at:at + k]))
            kept.append(ids[at:at + k + 1])  # (the drafts and the bonus token)
        logits = torch.zeros(batch * (k + 1), vocab_size, device=device)
        times: dict[str, list[float]] = {n: [] for n in (*PARTS, "fill", "accept", "copy")}
        for _ in range(steps):
            timed.fill_s = timed.accept_s = 0.0
            t0 = time.perf_counter()
            for item in items:
                item.seq.grammar.forced_tokens(8)
            t1 = time.perf_counter()
            masks.start(items)
            t2 = time.perf_counter()
            copy = 0.0
            if cuda:  # (the copy alone, untimed in the parts; apply copies again)
                torch.cuda.synchronize()
                c0 = time.perf_counter()
                masks.host[:batch * (k + 1)].to(device, non_blocking=True)
                torch.cuda.synchronize()
                copy = time.perf_counter() - c0
            t3 = time.perf_counter()
            masks.apply(logits)
            if cuda:
                torch.cuda.synchronize()
            t4 = time.perf_counter()
            for item, tokens in zip(items, kept, strict=True):
                item.seq.grammar.advance(tokens)
            t5 = time.perf_counter()
            for tokens, item in zip(kept, items, strict=True):
                item.seq.grammar.matcher.rollback(len(tokens))
            for name, value in (("forced", t1 - t0), ("walk", t2 - t1), ("apply", t4 - t3),
                                ("advance", t5 - t4), ("fill", timed.fill_s),
                                ("accept", timed.accept_s), ("copy", copy)):
                times[name].append(value)
        row = {"batch_size": batch, "k": k, "vocab_size": vocab_size, "device": device,
               **{f"{n}_us": 1e6 * statistics.median(v) for n, v in times.items()}}
        row["walk_python_us"] = row["walk_us"] - row["fill_us"] - row["accept_us"]
        row["total_us"] = sum(row[f"{n}_us"] for n in PARTS)
        row["per_position_us"] = row["total_us"] / (batch * (k + 1))
        rows.append(row)
        copied = f" (copy alone {row['copy_us']:.0f})" if cuda else ""
        print(f"batch {batch:3d} k {k}: forced {row['forced_us']:7.0f} walk {row['walk_us']:7.0f}"
              f" (fill {row['fill_us']:.0f} accept {row['accept_us']:.0f} python "
              f"{row['walk_python_us']:.0f}) apply {row['apply_us']:7.0f}{copied} advance "
              f"{row['advance_us']:7.0f} -> {row['total_us']:7.0f} us a step "
              f"({row['per_position_us']:.1f} us a position)")
    return rows
