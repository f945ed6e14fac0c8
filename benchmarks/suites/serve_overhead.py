"""What the server adds over ``LLM.generate``: time per output token at the same batch.

For each system (the default preset, n-gram speculation; ``--method none``; each also with the
engine on a thread of the server's process, ``-thread``), ``--batch`` streamed chat completions
are sent at once to the real server process (``python -m engine.serve``), so they run as one
batch; then the same engine configuration (the server's own argument parsing) runs in this
process, the same prompts through ``LLM.generate_stream``. Each side is warmed up with one
identical round first. Per request: TPOT, the time per output token after the first, the same
definition on both sides. One row per (batch, system): p50 TPOT of each side and their ratio
(server over in-process).

    python -m benchmarks serve overhead --device cpu --batch 4 --max-tokens 32
    python -m benchmarks serve overhead --device cuda --batch 8,32 --max-tokens 128 --kind open
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

import httpx

from benchmarks.engines import release
from benchmarks.models import default_device
from benchmarks.record import Result
from benchmarks.suites.serve_client import one_request, pct, start_server, tpot
from benchmarks.workloads import PROMPT_KINDS, PROMPT_SETS, text_prompts

# (-thread: the server's engine on a thread of the server's process, not a process of its own)
SYSTEMS = {"ngram": [], "none": ["--method", "none"], "ngram-thread": ["--no-engine-process"],
           "none-thread": ["--method", "none", "--no-engine-process"]}


async def server_round(base: str, prompts: list[str], max_tokens: int) -> list[dict]:
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        return list(await asyncio.gather(*(one_request(client, base, p, max_tokens, 0.0, t0)
                                           for p in prompts)))


def in_process_round(llm, prompts: list[str], max_tokens: int) -> list[dict]:
    from engine import SamplingParams

    token_ids = [ids for _, ids in llm.chat_inputs(
        [[{"role": "user", "content": p}] for p in prompts])]
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    start = time.perf_counter()
    per: dict[str, dict] = {}
    for delta in llm.generate_stream(token_ids, params):
        now = time.perf_counter()
        r = per.setdefault(delta.request_id, {"sent": start, "first": None, "tokens": 0})
        if delta.token_ids and r["first"] is None:
            r["first"] = now
        r["tokens"] += len(delta.token_ids)
        r["done"] = now
    return list(per.values())


def server_side(args: argparse.Namespace, extra: list[str], prompts: list[str]) -> list[float]:
    proc, base = start_server(args, extra)
    try:
        asyncio.run(server_round(base, prompts, args.max_tokens))  # warm-up
        return tpot(asyncio.run(server_round(base, prompts, args.max_tokens)))
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def in_process_side(args: argparse.Namespace, extra: list[str], prompts: list[str]) -> list[float]:
    from engine import LLM
    from engine.cli.serve import parse

    _, config = parse(["--model", args.model, "--device", args.device, *extra])
    llm = LLM(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
    in_process_round(llm, prompts, args.max_tokens)  # warm-up
    out = tpot(in_process_round(llm, prompts, args.max_tokens))
    release(llm)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--batch", default="4", help="requests at once, comma list")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kind", default="open", choices=PROMPT_KINDS)
    parser.add_argument("--prompt-set", default="examples", choices=PROMPT_SETS,
                        help="whose texts: examples/prompt_sets.py's, the workload's (bench), "
                             "or the real-text workload's held-out split (real: copy, open)")
    parser.add_argument("--systems", default="ngram,none", help=f"of {sorted(SYSTEMS)}")


def run(args: argparse.Namespace) -> Result:
    texts = text_prompts(args.kind, args.prompt_set)
    rows = []
    for batch in [int(b) for b in args.batch.split(",")]:
        prompts = [texts[i % len(texts)] for i in range(batch)]
        for system in args.systems.split(","):
            extra = SYSTEMS[system]
            served = server_side(args, extra, prompts)
            local = in_process_side(args, extra, prompts)
            row = {"batch": batch, "system": system, "server_tpot_p50": pct(served, 0.5),
                   "in_process_tpot_p50": pct(local, 0.5)}
            row["ratio"] = row["server_tpot_p50"] / row["in_process_tpot_p50"]
            rows.append(row)
            print(f"batch {batch:3d} {system:6s} TPOT p50: server "
                  f"{1e3 * row['server_tpot_p50']:.2f} ms, LLM.generate_stream "
                  f"{1e3 * row['in_process_tpot_p50']:.2f} ms, ratio {row['ratio']:.3f}",
                  flush=True)
    return Result(rows, args.model)
