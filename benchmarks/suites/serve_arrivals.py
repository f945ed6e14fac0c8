"""Serving under real arrivals: open-loop Poisson arrivals at several rates, with and without
speculation, through the real server process (``python -m engine.serve``) over HTTP.

For each system (a server with the preset's n-gram speculation, and one with ``--method none``)
and each arrival rate, requests arrive at exponential intervals whatever the server's progress
(open loop: a slow server builds a queue instead of slowing the arrivals), each a streamed chat
completion of one prompt of the chosen kind. One row per (system, rate): output tokens per
second over the run, time to first token (TTFT) and time per output token after the first
(TPOT), p50 and p99, medians over ``--repeats`` rounds. The two systems run the same arrival
schedule, one after the other, round after round; read the ratios between them.

    python -m benchmarks serve arrivals --device cpu --rates 0.5,1,2 --num-requests 24 --kind copy
    python -m benchmarks serve arrivals --device cuda --rates 2,8,32 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import httpx

from benchmarks.models import default_device
from benchmarks.record import Result
from benchmarks.suites.serve_client import one_request, pct, start_server, tpot
from benchmarks.workloads import PROMPT_KINDS, PROMPT_SETS, random_prompt, text_prompts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--rates", default="0.5,1,2", help="requests per second, comma list")
    parser.add_argument("--num-requests", type=int, default=24, help="per rate")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kind", default="copy", choices=PROMPT_KINDS)
    parser.add_argument("--prompt-set", default="examples", choices=PROMPT_SETS,
                        help="whose texts: examples/prompt_sets.py's, the workload's (bench), "
                             "or the real-text workload's held-out split (real: copy, open)")
    parser.add_argument("--server-args", default="", help="extra flags for both servers")
    parser.add_argument("--spec-server-args", default="", help="extra flags for the n-gram "
                        "server only (e.g. controller settings)")
    parser.add_argument("--token-prompts", type=int, metavar="VOCAB_SIZE", help="token-id "
                        "prompts of this vocabulary through /v1/completions (random-weight "
                        "checkpoints of `parallel save`): a 48-token passage twice then its "
                        "start (copy), or 104 unrelated tokens (open)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of both systems, "
                        "alternating, each on fresh arrival schedules; the table shows the "
                        "median of the rounds and each round's ratio")


async def run_rate(base: str, prompts: list[str], rate: float, args: argparse.Namespace,
                   seed: int) -> dict:
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(args.num_requests):
        t += rng.expovariate(rate)
        arrivals.append(t)
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(
            one_request(client, base, prompts[i % len(prompts)], args.max_tokens, a, t0)
            for i, a in enumerate(arrivals)))
    return {"rate": rate, "elapsed_s": time.perf_counter() - t0, "results": results}


def summarize(rows: list[dict]) -> list[dict]:
    """Per rate: output tokens/s over the run, TTFT and TPOT percentiles over the requests (each
    request's tokens from the usage the server reports)."""
    out = []
    for row in rows:
        done = [r for r in row["results"] if r["first"] is not None]
        ttft = [r["first"] - r["sent"] for r in done]
        per_token = tpot(done)
        out.append({"rate": row["rate"],
                    "tokens_per_s": sum(r["tokens"] for r in row["results"]) / row["elapsed_s"],
                    "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
                    "tpot_p50": pct(per_token, 0.5), "tpot_p99": pct(per_token, 0.99)})
    return out


def median_rounds(runs: list[list[dict]]) -> list[dict]:
    """Per rate: the median over rounds of each summary value, and every round's values."""
    out = []
    for per_rate in zip(*runs, strict=True):
        merged = {key: statistics.median(row[key] for row in per_rate) for key in per_rate[0]}
        merged["rounds"] = list(per_rate)
        out.append(merged)
    return out


def serve_rounds(args: argparse.Namespace, systems: dict[str, list[str]], prompts: list,
                 rates: list[float]) -> dict[str, list[list[dict]]]:
    """Per system, per round, per rate: the summary of one arrival schedule."""
    rounds: dict[str, list[list[dict]]] = {name: [] for name in systems}
    for r in range(args.repeats):
        for name, flags in systems.items():
            proc, base = start_server(args, flags + args.server_args.split())
            try:
                asyncio.run(run_rate(base, prompts, rates[0], argparse.Namespace(
                    num_requests=2, max_tokens=8), seed=99))  # warm-up (graphs, caches)
                rows = [asyncio.run(run_rate(base, prompts, rate, args, seed=i + 1000 * r))
                        for i, rate in enumerate(rates)]
                rounds[name].append(summarize(rows))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    return rounds


def run(args: argparse.Namespace) -> Result:
    rates = [float(r) for r in args.rates.split(",")]
    prompts = (text_prompts(args.kind, args.prompt_set) if args.token_prompts is None else
               [random_prompt(args.kind, i, args.token_prompts) for i in range(16)])
    systems = {"n-gram": args.spec_server_args.split(), "no speculation": ["--method", "none"]}
    rounds = serve_rounds(args, systems, prompts, rates)
    table = {name: median_rounds(runs) for name, runs in rounds.items()}
    print(f"\nserving {args.model} on {args.device}, {args.kind} prompts, {args.num_requests} "
          f"requests per rate, greedy, up to {args.max_tokens} tokens each")
    print(f"{'rate/s':>7} {'system':<15} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'TPOT p50':>9} {'TPOT p99':>9} {'TPOT p50 spec/none':>19}")
    rows = []
    for i, rate in enumerate(rates):
        for name in systems:
            r = table[name][i]
            ratio = r["tpot_p50"] / table["no speculation"][i]["tpot_p50"]
            each = [a[i]["tpot_p50"] / b[i]["tpot_p50"]
                    for a, b in zip(rounds[name], rounds["no speculation"], strict=True)]
            rows.append({"system": name, **r, "tpot_p50_over_none": ratio,
                         "tpot_p50_over_none_rounds": each})
            print(f"{rate:7.2f} {name:<15} {r['tokens_per_s']:8.1f} {r['ttft_p50']:9.3f} "
                  f"{r['ttft_p99']:9.3f} {r['tpot_p50']:9.4f} {r['tpot_p99']:9.4f} "
                  f"{ratio:19.2f}" + (f"  rounds: {' '.join(f'{e:.2f}' for e in each)}"
                                      if args.repeats > 1 else ""))
    return Result(rows, args.model)
