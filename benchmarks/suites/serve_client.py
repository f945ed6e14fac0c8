"""The serving suite's client: the real server process (``python -m engine.serve``) on a free
port, one streamed request timed token by token, and TTFT / TPOT from the timings."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx

from benchmarks.record import ROOT


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
