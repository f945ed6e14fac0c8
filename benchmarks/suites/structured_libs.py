"""The grammar libraries side by side: ``python -m benchmarks structured --compare-libraries``.

One JSON answer of the extraction schema, tokenized by the model's tokenizer, walked token by
token through xgrammar's and llguidance's matchers (whichever is installed): microseconds to
fill one token's mask (the cost the engine pays per verified position; both libraries with
free JSON whitespace, their defaults), over ``rounds`` walks
after a first one (which fills the libraries' caches), and the one-off costs (reading the
vocabulary, compiling the schema).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.suites.structured_walk import answer_ids


def _xgrammar(tokenizer: Any, vocab_size: int, schema: dict, ids: list[int],
              rounds: int) -> dict:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    t1 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info).compile_json_schema(schema, any_whitespace=True)
    t2 = time.perf_counter()
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    times = []
    for r in range(rounds + 1):
        matcher = xgr.GrammarMatcher(compiled)
        for token in ids:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            if r:
                times.append(time.perf_counter() - start)
            assert matcher.accept_token(token)
    return _row("xgrammar", t1 - t0, t2 - t1, times)


def _llguidance(tokenizer: Any, vocab_size: int, schema: dict, ids: list[int],
                rounds: int) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    t1 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": True})
    t2 = time.perf_counter()
    bitmask = llguidance.torch.allocate_token_bitmask(1, lltok.vocab_size)
    times = []
    for r in range(rounds + 1):
        matcher = llguidance.LLMatcher(lltok, grammar)
        for token in ids:
            start = time.perf_counter()
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
            if r:
                times.append(time.perf_counter() - start)
            assert matcher.consume_token(token), matcher.get_error()
    return _row("llguidance", t1 - t0, t2 - t1, times)


def _row(library: str, vocab_s: float, compile_s: float, times: list[float]) -> dict:
    times = sorted(times)
    return {"library": library, "vocab_ms": 1e3 * vocab_s, "compile_ms": 1e3 * compile_s,
            "mask_us_mean": 1e6 * statistics.fmean(times),
            "mask_us_median": 1e6 * times[len(times) // 2],
            "mask_us_p99": 1e6 * times[int(0.99 * (len(times) - 1))], "tokens": len(times)}


def library_rows(tokenizer: Any, vocab_size: int, schema: dict, rounds: int) -> list[dict]:
    ids = answer_ids(tokenizer)
    rows = []
    for name, fn in (("xgrammar", _xgrammar), ("llguidance", _llguidance)):
        try:
            row = fn(tokenizer, vocab_size, schema, ids, rounds)
        except ImportError:
            print(f"{name}: not installed")
            continue
        except ValueError as exc:  # (llguidance reads only the common tokenizer decoders)
            print(f"{name}: cannot read this tokenizer: {exc}")
            continue
        rows.append(row)
        print(f"{name:<11} mask {row['mask_us_mean']:6.1f} us mean, {row['mask_us_median']:6.1f} "
              f"median, {row['mask_us_p99']:7.1f} p99 a token; vocabulary "
              f"{row['vocab_ms']:.0f} ms, compile {row['compile_ms']:.1f} ms")
    return rows
