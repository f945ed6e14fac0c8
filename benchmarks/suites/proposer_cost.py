"""Proposer cost per step against the target's verification step.

For each batch size, contexts of ``--context-len`` tokens (a random 64-token phrase repeated, so
that n-gram lookup matches), k drafts per request: the time of ``proposer.propose`` per step
(steady state: each step every draft is accepted plus a bonus token, so contexts grow as in a
good run) and the time of the target's (k + 1)-token verification forward over the same batch,
whose cache grows by k + 1 tokens a step as well (so neither side meets a key length twice, as
in a real run: a shape-keyed cache such as cuDNN attention's plans never hits where a real run
would miss), and their ratio. Medians of ``--steps`` timed steps after ``--warmup`` untimed ones
for every method and batch size; CUDA is synchronised around each step.

    python -m benchmarks proposers cost --device cpu
    python -m benchmarks proposers cost --device cuda --dtype bfloat16 --random-weights
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from benchmarks import models
from benchmarks.record import Result
from benchmarks.timing import timed
from engine.runner.model_runner import ModelRunner
from proposers import ProposeRequest
from proposers.draft_model import DraftModelProposer
from proposers.early_exit import early_exit_model
from proposers.ngram import NgramProposer
from samplers import MAX_SPEC_LEN
from samplers.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0)
RANDOM_TARGETS = ("random-smollm2-135m", "random-llama-1b")  # --random-weights
# The draft of the random-weight runs: 4 layers of width 512 (about 1/10 of a 1B step's work).
SMALL_RANDOM_DRAFT = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=4)


def add_proposer_arguments(p: argparse.ArgumentParser) -> None:
    """What the cost and acceptance cases share."""
    models.add_model_arguments(p, "smollm2-135m")
    p.add_argument("--methods", default=None,
                   help="comma list of ngram, early_exit:N, draft_model (default: ngram, "
                        "early_exit:8, early_exit:24, draft_model; random weights: ngram, "
                        "early_exit:4, early_exit:8, draft_model)")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--greedy-drafts", action="store_true",
                   help="draft models take the argmax (default: probabilistic)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_proposer_arguments(p)
    p.add_argument("--random-weights", action="store_true",
                   help=f"the random-weight targets {RANDOM_TARGETS} instead of --model")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--context-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=7, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (>= 0)")
    p.add_argument("--quick", action="store_true",
                   help="batches 1 and 4, 64-token contexts, 3 steps (a fast CPU check)")


def methods_of(args: argparse.Namespace, random_weights: bool) -> list[str]:
    if args.methods:
        return args.methods.split(",")
    if random_weights:
        return ["ngram", "early_exit:4", "early_exit:8", "draft_model"]
    return ["ngram", "early_exit:8", "early_exit:24", "draft_model"]


def prepare(args: argparse.Namespace) -> argparse.Namespace:
    models.resolve(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.k < 1:
        raise SystemExit(f"-k {args.k} is invalid: allowed >= 1")
    torch.manual_seed(0)
    return args


def make_proposer(method: str, target, random_weights: bool, args: argparse.Namespace,
                  max_num_seqs: int, max_model_len: int):
    """``ngram``, ``early_exit:N`` (the target's first N layers) or ``draft_model`` (a small
    random LLaMA for a random target; else the target itself in bfloat16: nothing else shares
    its vocabulary offline); draft models run over a KV cache of their own, eagerly."""
    def over(draft) -> DraftModelProposer:
        runner = ModelRunner(draft, max_num_seqs, max_num_seqs * (max_model_len + MAX_SPEC_LEN),
                             max_model_len)
        return DraftModelProposer(runner, args.greedy_drafts, target.config.vocab_size)

    if method == "ngram":
        return NgramProposer(prompt_lookup_min=1, prompt_lookup_max=4)
    if method.startswith("early_exit:"):
        return over(early_exit_model(target, int(method.split(":")[1])))
    if method != "draft_model":
        raise SystemExit(f"unknown method {method!r}: allowed ngram, early_exit:N, draft_model")
    if random_weights:
        from transformers import AutoModelForCausalLM, LlamaConfig

        config = LlamaConfig(vocab_size=target.config.vocab_size, max_position_embeddings=8192,
                             **SMALL_RANDOM_DRAFT)
        draft = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                 dtype=target.dtype).to(target.device)
        return over(draft.eval())
    draft = type(target)(target.config).to(device=target.device, dtype=torch.bfloat16)
    draft.load_state_dict(target.state_dict())
    return over(draft.eval())


def time_costs(target, random_weights: bool, methods: list[str], args: argparse.Namespace,
               batch_sizes: list[int]) -> list[dict]:
    """Proposer time per step against the target's (k + 1)-token verification forward."""
    rows = []
    k, context_len, vocab = args.k, args.context_len, target.config.vocab_size
    max_len = context_len + (args.warmup + args.steps + 2) * (k + 1) + 8
    for batch in batch_sizes:
        rng = random.Random(batch)
        contexts = [([rng.randrange(vocab) for _ in range(64)] * (context_len // 64 + 1))
                    [:context_len] for _ in range(batch)]
        verify = [[ctx[-1]] + [rng.randrange(vocab) for _ in range(k)] for ctx in contexts]
        target_s = verify_seconds(target, contexts, verify, max_len, args)
        for method in methods:
            propose_s = propose_seconds(make_proposer(method, target, random_weights, args,
                                                      batch, max_len), contexts, rng, vocab, args)
            rows.append(dict(batch=batch, method=method, k=k, context_len=context_len,
                             propose_ms=propose_s * 1e3, verify_ms=target_s * 1e3,
                             ratio=propose_s / target_s))
            print(f"batch {batch:3d}  {method:14s} propose {propose_s * 1e3:9.3f} ms   "
                  f"verify {target_s * 1e3:9.3f} ms   ratio {propose_s / target_s:6.3f}",
                  flush=True)
    return rows


def verify_seconds(target, contexts: list[list[int]], verify: list[list[int]], max_len: int,
                   args: argparse.Namespace) -> float:
    """The median seconds of the target's verification forward after ``--warmup`` untimed
    ones; every draft is kept, so the cache grows by k + 1 a step."""
    runner = ModelRunner(target, len(contexts), len(contexts) * max_len, max_len)
    slots = [runner.allocate_slot() for _ in contexts]
    for slot, ctx in zip(slots, contexts, strict=True):  # prefill one by one (memory)
        runner.forward([slot], [ctx[:-1]], [len(ctx) - 2])
    times = [timed(lambda: runner.forward(slots, verify), args.device)[1]
             for _ in range(args.warmup + args.steps)]
    return statistics.median(times[args.warmup:])


def propose_seconds(proposer, contexts: list[list[int]], rng: random.Random, vocab: int,
                    args: argparse.Namespace) -> float:
    """The median seconds of a proposal, after the first call (it prefills the draft caches)
    and ``--warmup`` steps; every draft accepted plus a bonus token each step."""
    ctxs = [list(c) for c in contexts]
    times = []
    for _ in range(1 + args.warmup + args.steps):
        requests = [ProposeRequest(i, c, args.k, GREEDY) for i, c in enumerate(ctxs)]
        proposal, seconds, _ = timed(lambda requests=requests: proposer.propose(requests),
                                     args.device)
        times.append(seconds)
        for c, d in zip(ctxs, proposal.draft_token_ids, strict=True):
            c.extend(d + [rng.randrange(vocab)])
    return statistics.median(times[1 + args.warmup:])


def run(args: argparse.Namespace) -> Result:
    prepare(args)
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.quick:
        batch_sizes, args.context_len, args.steps = [1, 4], 64, 3
    names = list(RANDOM_TARGETS) if args.random_weights else [args.model]
    rows = []
    for name in names:
        random_weights = name in models.RANDOM_LLAMAS
        print(f"== cost, {name}, {args.device} {args.dtype}", flush=True)
        target, _ = models.build_model(name, args.device, args.dtype)
        rows += [{"model": name, **r} for r in time_costs(
            target, random_weights, methods_of(args, random_weights), args, batch_sizes)]
        del target
    return Result(rows, ",".join(names))
