"""Serving under real arrivals: open-loop Poisson arrivals at several rates, with and without
speculation, through the real server process (``python -m engine.serve``) over HTTP.

For each system (a server with the preset's n-gram speculation, and one with ``--method none``)
and each arrival rate, requests arrive at exponential intervals whatever the server's progress
(open loop: a slow server builds a queue instead of slowing the arrivals), each a streamed chat
completion of one prompt of the chosen kind. Reported per rate: output tokens per second over the
run, time to first token (TTFT) and time per output token after the first (TPOT), p50 and p99.
The two systems run the same arrival schedule, one after the other, in one invocation; read the
ratios between them.

    python benchmarks/serve.py --rates 0.5,1,2 --num-requests 24 --kind copy
    python benchmarks/serve.py --device cuda --model smollm2-135m --rates 2,8,32 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from prompt_sets import PROMPT_KINDS  # noqa: E402

sys.path.insert(0, str(ROOT))
from benchmarks.e2e_workloads import random_prompt  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "engine.serve", "--model", args.model, "--device", args.device,
           "--port", str(port), "--served-model-name", "bench", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()}")
        time.sleep(0.5)
    raise RuntimeError("the server did not start")


async def one_request(client: httpx.AsyncClient, base: str, prompt: str | list[int],
                      max_tokens: int, start_at: float, t0: float) -> dict:
    """A streamed chat completion of a text prompt, or a streamed completion of token ids."""
    await asyncio.sleep(max(0.0, t0 + start_at - time.perf_counter()))
    sent = time.perf_counter()
    first = None
    tokens = 0
    body = {"model": "bench", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if isinstance(prompt, str):
        route, body["messages"] = "chat/completions", [{"role": "user", "content": prompt}]
    else:  # (a random-weight model: token ids, no chat template)
        route, body["prompt"], body["ignore_eos"] = "completions", prompt, True
    async with client.stream("POST", f"{base}/v1/{route}", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and (chunk["choices"][0].get("delta", {}).get("content")
                                       or chunk["choices"][0].get("text")):
                first = first or time.perf_counter()
    return {"sent": sent, "first": first, "done": time.perf_counter(), "tokens": tokens}


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


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def tpot(results: list[dict]) -> list[float]:
    """Each request's time per output token after the first (requests with a first token and
    more than one token)."""
    return [(r["done"] - r["first"]) / (r["tokens"] - 1) for r in results
            if r["first"] is not None and r["tokens"] > 1]


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rates", default="0.5,1,2", help="requests per second, comma list")
    parser.add_argument("--num-requests", type=int, default=24, help="per rate")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kind", default="copy", choices=sorted(PROMPT_KINDS))
    parser.add_argument("--server-args", default="", help="extra flags for both servers")
    parser.add_argument("--spec-server-args", default="", help="extra flags for the n-gram "
                        "server only (e.g. controller settings)")
    parser.add_argument("--token-prompts", type=int, metavar="VOCAB_SIZE", help="token-id "
                        "prompts of this vocabulary through /v1/completions (random-weight "
                        "checkpoints of benchmarks/parallel.py save): a 48-token passage twice "
                        "then its start (copy), or 104 unrelated tokens (open)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of both systems, "
                        "alternating, each on fresh arrival schedules; the table shows the "
                        "median of the rounds and each round's ratio")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    prompts = list(PROMPT_KINDS[args.kind].values()) if args.token_prompts is None else [
        random_prompt(args.kind, i, args.token_prompts) for i in range(16)]
    systems = {"n-gram": args.spec_server_args.split(), "no speculation": ["--method", "none"]}
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
    table = {name: median_rounds(runs) for name, runs in rounds.items()}
    print(f"\nserving {args.model} on {args.device}, {args.kind} prompts, {args.num_requests} "
          f"requests per rate, greedy, up to {args.max_tokens} tokens each")
    print(f"{'rate/s':>7} {'system':<15} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'TPOT p50':>9} {'TPOT p99':>9} {'TPOT p50 spec/none':>19}")
    for i, rate in enumerate(rates):
        for name in systems:
            r = table[name][i]
            ratio = r["tpot_p50"] / table["no speculation"][i]["tpot_p50"]
            each = [a[i]["tpot_p50"] / b[i]["tpot_p50"]
                    for a, b in zip(rounds[name], rounds["no speculation"], strict=True)]
            print(f"{rate:7.2f} {name:<15} {r['tokens_per_s']:8.1f} {r['ttft_p50']:9.3f} "
                  f"{r['ttft_p99']:9.3f} {r['tpot_p50']:9.4f} {r['tpot_p99']:9.4f} "
                  f"{ratio:19.2f}" + (f"  rounds: {' '.join(f'{e:.2f}' for e in each)}"
                                      if args.repeats > 1 else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "table": table}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
