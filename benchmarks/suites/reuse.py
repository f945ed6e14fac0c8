"""Reusing earlier requests: prefix caching (time to first token, chat throughput) and suffix
decoding (an agent's repeated text), each against the engine without it, in one process.

    python -m benchmarks reuse prefix --prompt-tokens 2048 --shared 0.9     # TTFT, cache on/off
    python -m benchmarks reuse chat --conversations 8 --turns 4            # multi-turn chat
    python -m benchmarks reuse agent --methods suffix,ngram,none --batch-sizes 1,32

Greedy decoding of exactly ``--max-tokens`` tokens a request (``ignore_eos``): every system
does the same work and the outputs are checked equal across systems. Rows: per system,
tokens per second (output tokens over the timed wall time), time to first token (each
request's first token time less its arrival, in ms: p50, p90, max), prefix-cache hits and
drafts accepted. The systems take turns (request by request, turn by turn, run by run), so a
change in the machine's load hits them alike. The soak with the cache on is
``tests/engine/test_soak.py`` (``SPECDEC_SOAK_WAVES=350`` for about 2,000 requests a system).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from benchmarks import models
from benchmarks.engines import speculative_config
from benchmarks.record import Result
from benchmarks.registry import Case
from benchmarks.reuse_workloads import TokenSource, agent_stream, shared_prefix_prompts
from benchmarks.timing import percentiles, timed
from engine import LLM, SamplingParams


def add_common(p: argparse.ArgumentParser, max_tokens: int) -> None:
    models.add_model_arguments(p, "smollm2-135m")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens per request")
    p.add_argument("--seed", type=int, default=0, help="the workload's random tokens")


def build(args: argparse.Namespace) -> tuple[Any, Any, TokenSource]:
    args = models.resolve(args)
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    return model, tokenizer, TokenSource(args.model, tokenizer, models.vocab_size(model),
                                         args.seed)


def make_llm(args: argparse.Namespace, model: Any, tokenizer: Any, cache: bool,
             spec: dict | None, max_num_seqs: int, max_model_len: int) -> LLM:
    return LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=args.dtype,
               speculative_config=spec, enable_prefix_caching=cache, max_num_seqs=max_num_seqs,
               max_model_len=max_model_len, kv_cache_tokens=max_num_seqs * max_model_len)


class Run:
    """One system's timed requests: outputs, seconds, TTFTs, the engine's counters."""

    def __init__(self, name: str) -> None:
        self.name, self.seconds, self.tokens = name, 0.0, 0
        self.ttft: list[float] = []
        self.outputs: list[list[int]] = []

    def generate(self, llm: LLM, prompts: list[list[int]], max_tokens: int, device: str
                 ) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs, seconds, _ = timed(lambda: llm.generate(prompts, params, use_tqdm=False), device)
        self.seconds += seconds
        ids = [o.outputs[0].token_ids for o in outs]
        self.tokens += sum(len(t) for t in ids)
        self.ttft += [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
        self.outputs += ids
        return ids

    def row(self, llm: LLM, **extra: Any) -> dict:
        m = llm.get_metrics()
        row = {"system": self.name, **extra, "tokens_per_s": round(self.tokens / self.seconds, 2),
               "seconds": round(self.seconds, 3),
               **{f"ttft_{k}_ms": v for k, v in percentiles(self.ttft).items()},
               "prefix_cache_hit_rate": round(m.prefix_cache_hit_rate, 4),
               "acceptance_rate": round(m.acceptance_rate, 4),
               "mean_accepted_length": round(m.mean_accepted_length, 3)}
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr)
        return row


def same_outputs(runs: list[Run]) -> bool:
    return all(r.outputs == runs[0].outputs for r in runs)


# ------------------------------------------------------------------ prefix: TTFT
def prefix_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p, 16)
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--shared", type=float, default=0.9, help="share of a prompt in common")
    p.add_argument("--num-requests", type=int, default=8, help="timed, one at a time")


def run_prefix(args: argparse.Namespace) -> Result:
    """Batch 1: after one untimed request of the shared prefix, each request's TTFT with and
    without the cache, the systems taking turns request by request."""
    model, tokenizer, source = build(args)
    head, prompts = shared_prefix_prompts(source, args.num_requests + 1, args.prompt_tokens,
                                          args.shared)
    length = args.prompt_tokens + args.max_tokens + 8
    llms = {name: make_llm(args, model, tokenizer, name == "cache", None, 1, length)
            for name in ("no_cache", "cache")}
    runs = {name: Run(name) for name in llms}
    for llm in llms.values():  # (untimed: the warm-up, and the prefix into the cache)
        Run("warm").generate(llm, prompts[:1], args.max_tokens, args.device)
        llm.reset_metrics()
    for prompt in prompts[1:]:
        for name, llm in llms.items():
            runs[name].generate(llm, [prompt], args.max_tokens, args.device)
    rows = [runs[n].row(llms[n], prompt_tokens=args.prompt_tokens, shared=args.shared)
            for n in llms]
    ratio = statistics.median(runs["cache"].ttft) / statistics.median(runs["no_cache"].ttft)
    print(f"TTFT p50 cached / uncached: {ratio:.3f} (target <= 0.3 on the GPU)")
    return Result(rows, args.model, {"ttft_p50_ratio": round(ratio, 4),
                                     "outputs_equal": same_outputs(list(runs.values()))})


# ------------------------------------------------------------------ chat: throughput
def chat_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p, 64)
    p.add_argument("--conversations", type=int, default=8, help="run at once (the batch)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=256, help="one system prompt for all")
    p.add_argument("--user-tokens", type=int, default=64, help="each new user message")


def run_chat(args: argparse.Namespace) -> Result:
    """``--conversations`` chats of ``--turns`` turns: each turn's prompt is the last one, its
    answer and a new user message; every chat's turn runs in one batch, the systems taking
    turns turn by turn (their greedy histories are the same)."""
    model, tokenizer, source = build(args)
    system = source.run(args.system_tokens)
    users = [[source.run(args.user_tokens) for _ in range(args.turns)]
             for _ in range(args.conversations)]
    length = args.system_tokens + args.turns * (args.user_tokens + args.max_tokens) + 8
    llms = {name: make_llm(args, model, tokenizer, name == "cache", None, args.conversations,
                           length) for name in ("no_cache", "cache")}
    runs = {name: Run(name) for name in llms}
    for llm in llms.values():  # (untimed warm-up on other tokens)
        Run("warm").generate(llm, [source.run(32)], 4, args.device)
        llm.reset_metrics()
    history = [list(system) for _ in range(args.conversations)]
    for turn in range(args.turns):
        prompts = [h + u[turn] for h, u in zip(history, users, strict=True)]
        answers = [runs[name].generate(llm, prompts, args.max_tokens, args.device)
                   for name, llm in llms.items()][-1]
        history = [p + a for p, a in zip(prompts, answers, strict=True)]
    rows = [runs[n].row(llms[n], conversations=args.conversations, turns=args.turns)
            for n in llms]
    speedup = runs["no_cache"].seconds / runs["cache"].seconds
    print(f"chat throughput, cached / uncached: {speedup:.3f} (target >= 1.5 on the GPU)")
    return Result(rows, args.model, {"throughput_ratio": round(speedup, 4),
                                     "outputs_equal": same_outputs(list(runs.values()))})


# ------------------------------------------------------------------ agent: suffix decoding
def agent_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p, 64)
    p.add_argument("--methods", default="suffix,ngram,none")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=8, dest="k")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--num-requests", type=int, default=16, help="per batch size (at batch b "
                   "> 1: at least 2b, in one call, b running at once)")
    p.add_argument("--file-tokens", type=int, default=256)
    p.add_argument("--tasks", type=int, default=3, help="distinct instructions on the file")
    p.add_argument("--prefix-caching", action="store_true", help="every system with the cache")


def run_agent(args: argparse.Namespace) -> Result:
    """An agent's stream of requests on one file (:func:`agent_stream`): at batch 1 one request
    at a time, in order (suffix decoding drafts from the earlier ones); at batch b, all in one
    call with b running. One fresh engine per method and batch size, methods taking turns
    request by request at batch 1."""
    model, tokenizer, source = build(args)
    methods = args.methods.split(",")
    rows, speedups = [], {}
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        count = args.num_requests if b == 1 else max(args.num_requests, 2 * b)
        stream = agent_stream(source, count, args.file_tokens, args.tasks)
        warm = [source.run(40)]  # (other tokens: the timed stream starts unseen)
        length = max(len(p) for p in stream) + args.max_tokens + args.k + 8
        llms = {m: make_llm(args, model, tokenizer, args.prefix_caching,
                            speculative_config(m, args.k), b, length) for m in methods}
        runs = {m: Run(m) for m in methods}
        for llm in llms.values():
            Run("warm").generate(llm, warm, 8, args.device)
            llm.reset_metrics()
        groups = [[p] for p in stream] if b == 1 else [stream]
        for group in groups:
            for m, llm in llms.items():
                runs[m].generate(llm, group, args.max_tokens, args.device)
        for m in methods:
            rows.append(runs[m].row(llms[m], batch_size=b, k=args.k))
        base = {m: runs[m].tokens / runs[m].seconds for m in methods}
        for m in methods:
            for other in methods:
                if m != other:
                    speedups[f"b{b}:{m}/{other}"] = round(base[m] / base[other], 4)
        speedups[f"b{b}:outputs_equal"] = same_outputs(list(runs.values()))
        del llms
    print("throughput ratios: " + ", ".join(f"{k} {v}" for k, v in speedups.items()))
    print("targets on the GPU: b1 suffix/ngram >= 1.3, b32 suffix/none >= 1.0")
    return Result(rows, args.model, speedups)


CASES = {
    "prefix": Case("TTFT of prompts sharing a prefix, with and without the prefix cache",
                   prefix_arguments, run_prefix),
    "chat": Case("multi-turn chat throughput and TTFT, with and without the prefix cache",
                 chat_arguments, run_chat),
    "agent": Case("an agent's repeated text: suffix decoding against n-gram and none",
                  agent_arguments, run_agent),
}
