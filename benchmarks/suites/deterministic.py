"""Deterministic mode: greedy speculation against plain decoding, bit for bit, and its price.

For each speculation method and batch size, the held-out real-text prompts (both kinds) run
greedy through an engine with ``deterministic=True`` in closed batches of b; every output is
compared token for token with plain decoding of the same prompt *at batch 1* in the same mode
(so a batch's rounding and a method's both count). Beside it, tokens/s of the deterministic
engine against the default one for the systems of ``--compare`` (the overhead).

    python -m benchmarks deterministic --device cuda --batch-sizes 1,8,32,64 --max-tokens 256
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import models
from benchmarks.engines import release, speculative_config
from benchmarks.record import Result
from benchmarks.workloads import build_prompts, text_prompts
from engine import LLM, SamplingParams


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bf16 on CUDA")
    p.add_argument("--methods", default="ngram,eagle,ngram_eagle,eagle_tree",
                   help="comma list of speculation methods compared with plain decoding")
    p.add_argument("--compare", default="none,eagle",
                   help="comma list of systems (none or a method) also timed in the default "
                        "mode, for the overhead")
    p.add_argument("--batch-sizes", default="1,8,32,64")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--batch1-prompts", type=int, default=0,
                   help="prompts run at batch 1 (0: all; the larger batches run all)")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 prompts, batch 1 and 2, "
                                                        "8 tokens")


def held_out_prompts(model_name: str, tokenizer, vocab: int) -> list[list[int]]:
    """Every held-out real-text prompt, open kinds then copy kinds."""
    return [p for kind in ("open", "copy")
            for p in build_prompts(kind, len(text_prompts(kind, "real")), model_name, tokenizer,
                                   vocab, prompt_set="real")]


def generate(llm: LLM, prompts: list[list[int]], b: int, max_tokens: int
             ) -> tuple[list[list[int]], float]:
    """``prompts`` in closed batches of ``b``: outputs and seconds (a short warm-up batch of
    ``b`` first, untimed, so that graph captures and compiles are not timed)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate(prompts[:b], warm, use_tqdm=False)
    outs, start = [], time.perf_counter()
    for i in range(0, len(prompts), b):
        outs += [o.outputs[0].token_ids
                 for o in llm.generate(prompts[i:i + b], params, use_tqdm=False)]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return outs, time.perf_counter() - start


def run(args: argparse.Namespace) -> Result:
    args = models.resolve(args)
    if args.quick:
        args.batch_sizes, args.max_tokens, args.batch1_prompts = "1,2", 8, 2
    batches = [int(b) for b in args.batch_sizes.split(",")]
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    prompts = held_out_prompts(args.model, tokenizer, models.vocab_size(model))
    if args.quick:
        prompts = prompts[:2]
    methods = [m for m in args.methods.split(",") if m]
    compare = [m for m in args.compare.split(",") if m]
    runs = [(s, True) for s in ["none", *methods]] + [(s, False) for s in compare]
    outputs: dict[tuple, list[list[int]]] = {}
    rows = []
    for system, deterministic in runs:
        llm = LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=args.dtype,
                  speculative_config=speculative_config(system, 4), max_num_seqs=max(batches),
                  deterministic=deterministic)
        for b in batches:
            these = prompts[:args.batch1_prompts or None] if b == 1 else prompts
            outs, seconds = generate(llm, these, b, args.max_tokens)
            outputs[system, deterministic, b] = outs
            plain = outputs.get(("none", deterministic, 1))
            equal = None if plain is None else sum(
                o == p for o, p in zip(outs, plain, strict=False))
            rows.append({"system": system, "deterministic": deterministic, "batch_size": b,
                         "prompts": len(these), "tokens": sum(map(len, outs)),
                         "seconds": seconds, "tokens_per_s": sum(map(len, outs)) / seconds,
                         "equal_to_plain_batch1": equal,
                         "compared": None if plain is None else min(len(plain), len(outs))})
            print_row(rows[-1])
        release(llm)
    for r in rows:  # the overhead: the default mode's tokens/s over the deterministic one's
        base = next((x for x in rows if x["system"] == r["system"] and not x["deterministic"]
                     and x["batch_size"] == r["batch_size"]), None)
        r["deterministic_over_default"] = (r["tokens_per_s"] / base["tokens_per_s"]
                                           if base and r["deterministic"] else None)
    for r in rows:
        if r["deterministic_over_default"] is not None:
            print(f"{r['system']:<12} b={r['batch_size']:<3} deterministic / default tokens/s: "
                  f"{r['deterministic_over_default']:.3f}")
    return Result(rows, args.model, {"max_tokens": args.max_tokens})


def print_row(r: dict) -> None:
    eq = "-" if r["equal_to_plain_batch1"] is None else (
        f"{r['equal_to_plain_batch1']}/{r['compared']} equal to plain at batch 1")
    mode = "deterministic" if r["deterministic"] else "default"
    print(f"{r['system']:<12} {mode:<13} b={r['batch_size']:<3} {r['prompts']:>3} prompts "
          f"{r['tokens_per_s']:9.1f} tok/s  {eq}", flush=True)
