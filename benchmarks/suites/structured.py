"""Structured output: tokens/s under a JSON Schema with and without speculation, and what the
grammar work costs a step.

Two kinds of request, each a chat prompt and a JSON Schema: ``extract`` (copy-heavy: the
values are in the given text) and ``generate`` (open-ended: a record to invent). Systems, each
an engine over the same model: ``grammar`` (no speculation, forced tokens off: the baseline),
``forced`` (no speculative method; the tokens the grammar forces are verified as drafts),
``ngram`` (n-gram drafts, forced tokens off), ``ngram_forced`` (forced tokens, n-gram drafts
after them) and ``free`` (no grammar, no speculation: what structure costs). Requests stop at
EOS or ``--max-tokens``; one row per (system, kind, batch size) with tokens/s, its ratio to
``grammar``, the share of outputs that parse and hold the schema's keys, tokens per step, and
the host time of the grammar work (forced tokens, the draft walk, applying masks, advancing the
matchers) on the step's thread per engine step and as a share of the step, and the walk's own
time per step (on a GPU in a worker thread, beside the forward). It prints numbers and asserts
nothing.

    python -m benchmarks structured --device cpu --quick          # smoke run
    python -m benchmarks structured --walk-only --batch-sizes 1,32  # the grammar work alone
    python -m benchmarks structured --compare-libraries             # xgrammar and llguidance
    python -m benchmarks structured --device cuda --batch-sizes 1,32 --json structured.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks import models
from benchmarks.record import Result
from benchmarks.workloads import chat_ids

SYSTEMS = ("grammar", "forced", "ngram", "ngram_forced", "free")
PEOPLE = [("Maria Gonzalez", 34, "maria.gonzalez@example.com", "Valencia"),
          ("Kenji Watanabe", 51, "k.watanabe@example.org", "Osaka"),
          ("Amara Okafor", 27, "amara.okafor@example.net", "Lagos"),
          ("Lukas Novak", 45, "lukas.novak@example.com", "Brno")]
EXTRACT_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "city": {"type": "string"}}, "required": ["name", "age", "email", "city"],
    "additionalProperties": False}
GENERATE_SCHEMA = {"type": "object", "properties": {
    "product": {"type": "string"}, "price": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    "description": {"type": "string"}}, "required": ["product", "price", "tags", "description"],
    "additionalProperties": False}
PRODUCTS = ["a hiking backpack", "a desk lamp", "a pair of running shoes", "a coffee grinder"]


def prompts(kind: str, count: int) -> list[tuple[str, dict]]:
    """``count`` (text, schema) pairs of ``kind``."""
    out = []
    for i in range(count):
        if kind == "extract":
            name, age, email, city = PEOPLE[i % len(PEOPLE)]
            text = (f"Extract the person's name, age, email and city as JSON with keys name, "
                    f"age, email, city.\n\nText: {name} is {age} years old and lives in {city}. "
                    f"You can reach {name.split()[0]} at {email}.")
            out.append((text, EXTRACT_SCHEMA))
        else:
            text = (f"Invent a product listing for {PRODUCTS[i % len(PRODUCTS)]} as JSON with "
                    "keys product, price, tags and description.")
            out.append((text, GENERATE_SCHEMA))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    models.add_model_arguments(p, "smollm2-135m")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of " +
                   ",".join(SYSTEMS))
    p.add_argument("--kinds", default="extract,generate")
    p.add_argument("--batch-sizes", default=None, help="comma list (default 1,32; --quick 1)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4, dest="k")
    p.add_argument("--forced-tokens", type=int, default=8,
                   help="structured_forced_tokens of the *forced systems")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--any-whitespace", action="store_true",
                   help="JSON with free whitespace (vLLM's default; fewer forced tokens)")
    p.add_argument("--warmup-rounds", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="smoke run: batch 1, 2 prompts, 48 tokens")
    p.add_argument("--walk-only", action="store_true",
                   help="time the grammar's host work of one step alone, no model "
                        "(benchmarks/suites/structured_walk.py)")
    p.add_argument("--steps", type=int, default=50, help="--walk-only: timed steps")
    p.add_argument("--compare-libraries", action="store_true",
                   help="mask time per token of xgrammar and llguidance, no model "
                        "(benchmarks/suites/structured_libs.py)")


class GrammarClock:
    """Host seconds of the engine's grammar work on the step's own thread, by wrapping its
    entry points (restored by :meth:`close`): the forced tokens, the masks' start (the walk
    itself on a CPU; on a GPU handing it to a worker thread) and apply (on a GPU, joining the
    walk: what of it the forward did not hide), the matchers' advance."""

    NAMES = ("forced_drafts", "prepend_forced")

    def __init__(self) -> None:
        import engine.llm_engine as module
        from engine.grammar_steps import GrammarMasks

        self.module, self.seconds, self.saved = module, 0.0, {}
        self.owners = [(module, name) for name in self.NAMES] + [
            (GrammarMasks, "start"), (GrammarMasks, "apply"),
            (module.LLMEngine, "_advance_grammar")]
        for owner, name in self.owners:
            self.saved[owner, name] = getattr(owner, name)
            setattr(owner, name, self._timed(self.saved[owner, name]))

    def _timed(self, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return run

    def close(self) -> None:
        for owner, name in self.owners:
            setattr(owner, name, self.saved[owner, name])


def build(system: str, model: Any, tokenizer: Any, args: argparse.Namespace, batch: int) -> Any:
    from engine import LLM

    spec = ({"method": "ngram", "num_speculative_tokens": args.k}
            if system.startswith("ngram") else None)
    forced = args.forced_tokens if system.endswith("forced") else 0
    return LLM(model=model, tokenizer=tokenizer, speculative_config=spec, device=args.device,
               max_num_seqs=max(batch, 1), structured_forced_tokens=forced)


def valid(text: str, schema: dict) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and set(value) == set(schema["required"])


def run_one(llm: Any, system: str, tokenizer: Any, pairs: list[tuple[str, dict]],
            args: argparse.Namespace) -> dict:
    from engine import SamplingParams

    batch = [{"prompt_token_ids": chat_ids(tokenizer, text)} for text, _ in pairs]
    params = [SamplingParams(temperature=0, max_tokens=args.max_tokens,
                             structured_outputs=None if system == "free" else {
                                 "json": schema, "disable_any_whitespace": not args.any_whitespace})
              for _, schema in pairs]
    llm.reset_metrics()
    walked = llm.engine.grammar_masks.walk_seconds
    clock = GrammarClock()
    try:
        start = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    finally:
        clock.close()
    m = llm.get_metrics()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "valid": sum(valid(o.outputs[0].text, s) for o, (_, s) in zip(outs, pairs,
                                                                           strict=True))
            / len(outs),
            "tokens_per_step": tokens / max(m.num_steps, 1), "steps": m.num_steps,
            "grammar_ms_per_step": 1e3 * clock.seconds / max(m.num_steps, 1),
            "grammar_share": clock.seconds / seconds,
            "walk_ms_per_step": 1e3 * (llm.engine.grammar_masks.walk_seconds - walked)
            / max(m.num_steps, 1),
            "acceptance": m.num_accepted / m.num_drafted if m.num_drafted else None,
            "sample": outs[0].outputs[0].text[:120]}


def run(args: argparse.Namespace) -> Result:
    args = models.resolve(args)
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"--systems: unknown system {s!r}; allowed {', '.join(SYSTEMS)}")
    sizes = [int(b) for b in (args.batch_sizes or ("1" if args.quick else "1,32")).split(",")]
    if args.quick:
        args.max_tokens = 48
    if args.walk_only or args.compare_libraries:
        from benchmarks.suites.structured_libs import library_rows
        from benchmarks.suites.structured_walk import walk_rows

        model, tokenizer = models.build_model(args.model, "cpu", "float32")
        vocab = model.get_output_embeddings().weight.shape[0]
        del model
        if args.compare_libraries:
            return Result(library_rows(tokenizer, vocab, EXTRACT_SCHEMA, args.steps), args.model)
        return Result(walk_rows(tokenizer, vocab, EXTRACT_SCHEMA, sizes, args.k, args.device,
                                args.steps, args.any_whitespace), args.model)
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    rows = []
    for b in sizes:
        llms = {s: build(s, model, tokenizer, args, b) for s in systems}
        for kind in args.kinds.split(","):
            pairs = prompts(kind, 2 if args.quick else max(b, 4))
            for s in systems:  # (warm-up: graphs, grammars compiled and cached)
                for _ in range(args.warmup_rounds):
                    run_one(llms[s], s, tokenizer, pairs[:b], args)
            results = {s: run_one(llms[s], s, tokenizer, pairs, args) for s in systems}
            base = results.get("grammar")
            for s, r in results.items():
                r.update(system=s, kind=kind, batch_size=b,
                         vs_grammar=(r["tokens_per_s"] / base["tokens_per_s"]) if base else None)
                rows.append(r)
                print(f"b={b:<3} {kind:<8} {s:<13} {r['tokens_per_s']:8.1f} tok/s  "
                      f"x{r['vs_grammar'] or 0:.2f} vs grammar  valid {r['valid']:.2f}  "
                      f"{r['tokens_per_step']:.2f} tok/step  grammar "
                      f"{r['grammar_ms_per_step']:.3f} ms/step ({100 * r['grammar_share']:.1f}%)"
                      f" walk {r['walk_ms_per_step']:.3f} ms/step")
        del llms
    return Result(rows, args.model)
