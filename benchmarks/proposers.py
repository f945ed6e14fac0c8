"""Proposer cost per step against the target's verification step, and acceptance on real prompts.

Two tables:

1. *Cost*: for batch 1 and 32, contexts of ``--context-len`` tokens, k drafts per request:
   the time of ``proposer.propose`` per step (steady state: each step every draft is accepted
   plus a bonus token, so contexts grow as in a good run) and the time of the target's
   (k + 1)-token verification forward over the same batch, whose cache grows by k + 1 tokens a
   step as well (so neither side meets a key length twice, as in a real run: a shape-keyed cache
   such as cuDNN attention's plans never hits where a real run would miss), and their ratio.
   Medians of ``--steps`` timed steps, after ``--warmup`` untimed ones for every method and
   batch size (Triton compiles and CUDA allocates on first use); CUDA is synchronised around
   each step.
2. *Acceptance* (default model only): greedy speculative decoding of a few prompt kinds
   (copy, edit, open-ended), batch 1: acceptance rate (accepted / drafted), mean tokens per
   target step, and whether the output equals the target's plain greedy output.

CPU, default model:  ``python benchmarks/proposers.py --json proposers_cpu.json``
CPU, small and fast: ``python benchmarks/proposers.py --quick``; n-gram lookup at scale alone:
``python benchmarks/proposers.py --only ngram-scale --threads 1``
GPU, random weights: ``python benchmarks/proposers.py --device cuda --dtype bfloat16
--random-weights --json proposers_gpu.json`` (a SmolLM2-135M-shaped and a 1B LLaMA-shaped target).
Prints tables and writes JSON; never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.runner.model_runner import ModelRunner  # noqa: E402
from proposers import ProposeRequest  # noqa: E402
from proposers.draft_model import DraftModelProposer  # noqa: E402
from proposers.early_exit import early_exit_model  # noqa: E402
from proposers.ngram import NgramProposer  # noqa: E402
from samplers import MAX_SPEC_LEN  # noqa: E402
from samplers.sampling_params import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0)
PARAGRAPH = ("The old lighthouse stood on the northern cliff for more than two hundred years. "
             "Every night its keeper climbed the spiral stairs, trimmed the wick and polished the "
             "great lens, so that ships passing through the narrow strait could find their way "
             "home. When the electric lamp arrived, the keeper stayed on, because the village "
             "said the light looked warmer when he was there.")
PROMPTS = {
    "copy": f"Repeat the following text exactly, word for word:\n\n{PARAGRAPH}",
    "edit": ("Rewrite the following text, replacing the word 'keeper' with 'guardian' and "
             f"changing nothing else:\n\n{PARAGRAPH}"),
    "code": ("Rename the variable `total` to `acc` in this Python function and print the whole "
             "function:\n\ndef add_all(values):\n    total = 0\n    for v in values:\n"
             "        total = total + v\n    return total\n"),
    "open": "Write a short story about a cat who learns to play the piano.",
}
# Random-weight targets for the GPU run: (name, LlamaConfig kwargs).
RANDOM_TARGETS = {
    "smollm2-135m-shape": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                               num_attention_heads=9, num_key_value_heads=3, vocab_size=49152),
    "llama-1b-shape": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                           num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
}


# The draft of the random-weight runs: 4 layers of width 512 (about 1/10 of a 1B step's work).
SMALL_RANDOM_DRAFT = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=4)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def make_proposer(method: str, target, tokenizer, args, max_num_seqs: int, max_model_len: int):
    def over(draft) -> DraftModelProposer:  # a draft with a KV cache of its own, eager forwards
        runner = ModelRunner(draft, max_num_seqs, max_num_seqs * (max_model_len + MAX_SPEC_LEN),
                             max_model_len)
        return DraftModelProposer(runner, args.greedy_drafts, target.config.vocab_size)

    if method == "ngram":
        return NgramProposer(prompt_lookup_min=1, prompt_lookup_max=4)
    if method.startswith("early_exit"):
        return over(early_exit_model(target, int(method.split(":")[1])))
    if tokenizer is None:  # random weights: a small random LLaMA with the target's vocabulary
        from transformers import AutoModelForCausalLM, LlamaConfig

        config = LlamaConfig(vocab_size=target.config.vocab_size, max_position_embeddings=8192,
                             **SMALL_RANDOM_DRAFT)
        draft = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                 dtype=target.dtype).to(target.device)
        return over(draft.eval())
    # draft_model: the target itself in bfloat16 (nothing else shares its vocabulary offline)
    draft = type(target)(target.config).to(device=target.device, dtype=torch.bfloat16)
    draft.load_state_dict(target.state_dict())
    return over(draft.eval())


def time_costs(target, tokenizer, methods, args) -> list[dict]:
    """Proposer time per step vs the target's (k + 1)-token verification forward."""
    rows = []
    k, context_len, vocab = args.k, args.context_len, target.config.vocab_size
    max_len = context_len + (args.warmup + args.steps + 2) * (k + 1) + 8
    for batch in args.batch_sizes:
        rng = random.Random(batch)
        # Repetitive contexts (a random 64-token phrase repeated) so that n-gram lookup matches.
        contexts = [([rng.randrange(vocab) for _ in range(64)] * (context_len // 64 + 1))
                    [:context_len] for _ in range(batch)]
        runner = ModelRunner(target, batch, batch * max_len, max_len)
        slots = [runner.allocate_slot() for _ in range(batch)]
        for slot, ctx in zip(slots, contexts, strict=True):  # prefill one by one (memory)
            runner.forward([slot], [ctx[:-1]], [len(ctx) - 2])
        verify = [[ctx[-1]] + [rng.randrange(vocab) for _ in range(k)] for ctx in contexts]
        times = []
        for _ in range(args.warmup + args.steps):
            sync(args.device)
            start = time.perf_counter()
            runner.forward(slots, verify)
            sync(args.device)
            times.append(time.perf_counter() - start)  # all accepted: the cache keeps k + 1
        target_s = median(times[args.warmup:])
        del runner
        for method in methods:
            proposer = make_proposer(method, target, tokenizer, args, batch, max_len)
            ctxs = [list(c) for c in contexts]
            times = []
            # Untimed: the first call (it prefills the draft caches) and --warmup steps.
            for _ in range(1 + args.warmup + args.steps):
                requests = [ProposeRequest(i, c, k, GREEDY) for i, c in enumerate(ctxs)]
                sync(args.device)
                start = time.perf_counter()
                proposal = proposer.propose(requests)
                sync(args.device)
                times.append(time.perf_counter() - start)
                for c, d in zip(ctxs, proposal.draft_token_ids, strict=True):
                    c.extend(d + [rng.randrange(vocab)])  # all accepted + a bonus token
            propose_s = median(times[1 + args.warmup:])
            rows.append(dict(batch=batch, method=method, k=k, context_len=context_len,
                             propose_ms=propose_s * 1e3, verify_ms=target_s * 1e3,
                             ratio=propose_s / target_s))
            print(f"batch {batch:3d}  {method:14s} propose {propose_s * 1e3:9.3f} ms   "
                  f"verify {target_s * 1e3:9.3f} ms   ratio {propose_s / target_s:6.3f}",
                  flush=True)
            del proposer
    return rows


def greedy_speculative(target, proposer, prompt: list[int], k: int, max_new: int):
    """Greedy speculative decoding, batch 1: returns (new tokens, drafted, accepted, steps)."""
    runner = ModelRunner(target, 1, len(prompt) + max_new + k + 2, len(prompt) + max_new + k + 2)
    slot = runner.allocate_slot()
    tokens = list(prompt)
    tokens.append(int(runner.forward([slot], [prompt], [len(prompt) - 1])[0].argmax()))
    drafted = accepted = steps = 0
    while len(tokens) - len(prompt) < max_new:
        want = min(k, max_new - (len(tokens) - len(prompt)) - 1)
        drafts = proposer.propose([ProposeRequest(0, tokens, want, GREEDY)]).draft_token_ids[0]
        best = runner.forward([slot], [[tokens[-1]] + drafts]).argmax(dim=-1).tolist()
        n = 0
        while n < len(drafts) and drafts[n] == best[n]:
            n += 1
        runner.truncate(slot, len(tokens) + n)
        proposer.on_accepted(0, len(tokens) + n)
        tokens += drafts[:n] + [best[n]]
        drafted, accepted, steps = drafted + len(drafts), accepted + n, steps + 1
    proposer.remove(0)
    return tokens[len(prompt):], drafted, accepted, steps


def plain_greedy(target, prompt: list[int], max_new: int) -> list[int]:
    with torch.inference_mode():
        out = target.generate(torch.tensor([prompt], device=target.device), do_sample=False,
                              max_new_tokens=max_new, min_new_tokens=max_new)
    return out[0, len(prompt):].tolist()


def acceptance(target, tokenizer, methods, args) -> list[dict]:
    rows = []
    for kind in args.prompts:
        prompt = prompt_ids(tokenizer, kind)
        reference = plain_greedy(target, prompt, args.new_tokens)
        for method in methods:
            proposer = make_proposer(method, target, tokenizer, args, 1, 4096)
            start = time.perf_counter()
            out, drafted, accepted, steps = greedy_speculative(target, proposer, prompt, args.k,
                                                               args.new_tokens)
            elapsed = time.perf_counter() - start
            rate = accepted / drafted if drafted else 0.0
            rows.append(dict(prompt=kind, method=method, k=args.k, drafted=drafted,
                             accepted=accepted, acceptance_rate=rate, steps=steps,
                             tokens_per_step=len(out) / steps, seconds=elapsed,
                             equals_greedy=out == reference))
            print(f"{kind:5s} {method:14s} acceptance {rate:6.1%}  tokens/step "
                  f"{len(out) / steps:5.2f}  {elapsed:6.1f} s  equals greedy {out == reference}",
                  flush=True)
    return rows


def ngram_scale(args) -> dict:
    """n-gram lookup alone: 256 requests with 4,000-token contexts, steady state.

    Each step every request gains 1 to k + 1 tokens (a random accepted run plus its bonus), drawn
    from a 64-token phrase bank so that matches occur. The median of ``--ngram-steps`` steps.
    """
    rng = random.Random(0)
    bank = [[rng.randrange(49152) for _ in range(8)] for _ in range(64)]

    def grow(context: list[int], n: int) -> None:
        while n > 0:
            piece = rng.choice(bank)[:n]
            context.extend(piece)
            n -= len(piece)

    contexts = []
    for _ in range(args.ngram_batch):
        context: list[int] = []
        grow(context, args.ngram_context)
        contexts.append(context)
    proposer = NgramProposer(prompt_lookup_min=1, prompt_lookup_max=4)
    start = time.perf_counter()
    proposer.propose([ProposeRequest(i, c, args.k, GREEDY) for i, c in enumerate(contexts)])
    index_s = time.perf_counter() - start
    times, cpu_times, drafted = [], [], 0
    for step in range(args.warmup + args.ngram_steps):
        for context in contexts:
            grow(context, rng.randrange(1, args.k + 2))
        requests = [ProposeRequest(i, c, args.k, GREEDY) for i, c in enumerate(contexts)]
        start, cpu_start = time.perf_counter(), time.process_time()
        proposal = proposer.propose(requests)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        drafted += proposal.num_tokens if step >= args.warmup else 0
    times, cpu_times = sorted(times[args.warmup:]), sorted(cpu_times[args.warmup:])
    # CPU time of this process: what the step costs when it does not wait for a busy core (the
    # minimum: when other processes did not evict its caches either).
    row = dict(batch=args.ngram_batch, context_len=args.ngram_context, k=args.k,
               first_call_ms=index_s * 1e3, median_step_ms=median(times) * 1e3,
               min_step_ms=times[0] * 1e3, median_step_cpu_ms=median(cpu_times) * 1e3,
               min_step_cpu_ms=cpu_times[0] * 1e3,
               drafts_per_request=drafted / args.ngram_steps / args.ngram_batch)
    print(f"ngram {args.ngram_batch} requests x {args.ngram_context} tokens: first call "
          f"{index_s * 1e3:.0f} ms, step median {row['median_step_ms']:.3f} ms wall "
          f"(min {row['min_step_ms']:.3f}), {row['median_step_cpu_ms']:.3f} ms CPU "
          f"(min {row['min_step_cpu_ms']:.3f}); {row['drafts_per_request']:.2f} drafts/request",
          flush=True)
    return row


def early_exit_agreement(target, tokenizer, args) -> list[dict]:
    """Per N: how often the first N layers' argmax equals the target's greedy token.

    Teacher-forced along the target's own greedy continuation of each prompt: this is the
    per-token acceptance rate alpha of greedy early-exit drafting (k = 1), for every N at the
    cost of one truncated forward each.
    """

    rows = []
    for kind in args.prompts:
        prompt = prompt_ids(tokenizer, kind)
        reference = plain_greedy(target, prompt, args.new_tokens)
        ids = torch.tensor([prompt + reference[:-1]], device=target.device)
        want = torch.tensor(reference, device=target.device)
        for n in args.sweep_layers:
            with torch.inference_mode():
                logits = early_exit_model(target, n)(input_ids=ids).logits[0, len(prompt) - 1:]
            alpha = (logits.argmax(dim=-1) == want).float().mean().item()
            rows.append(dict(prompt=kind, num_layers=n, alpha=alpha, tokens=len(reference)))
            print(f"{kind:5s} early exit N={n:2d}  alpha {alpha:6.1%}", flush=True)
    return rows


def prompt_ids(tokenizer, kind: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[kind]}],
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--random-weights", action="store_true",
                        help="random-weight targets built from configs (cost table only)")
    parser.add_argument("--methods", nargs="+",
                        help="ngram, early_exit:N, draft_model (default: ngram early_exit:8 "
                             "early_exit:24 draft_model; random weights: ngram early_exit:4 "
                             "early_exit:8 draft_model)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--context-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=7, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps first, for every method and batch size (>= 0)")
    parser.add_argument("--prompts", nargs="+", default=list(PROMPTS), choices=list(PROMPTS))
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--greedy-drafts", action="store_true",
                        help="draft models take the argmax (default: probabilistic)")
    parser.add_argument("--sweep-layers", type=int, nargs="*", default=[],
                        help="early-exit depths N for the teacher-forced agreement table")
    parser.add_argument("--ngram-batch", type=int, default=256)
    parser.add_argument("--ngram-context", type=int, default=4000)
    parser.add_argument("--ngram-steps", type=int, default=200)
    parser.add_argument("--skip-ngram-scale", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-acceptance", action="store_true")
    parser.add_argument("--only", choices=["ngram-scale"],
                        help="run only this section (no model is loaded)")
    parser.add_argument("--quick", action="store_true",
                        help="small settings for a fast CPU check (batches 1 and 4, short "
                             "contexts, one prompt, 64 n-gram requests x 1,000 tokens)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for name in ("k", "steps", "ngram_batch", "ngram_context", "ngram_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid: "
                         "allowed >= 1")
    if args.warmup < 0:
        parser.error(f"--warmup={args.warmup} is invalid: allowed >= 0")
    if args.quick:
        args.batch_sizes, args.context_len, args.steps, args.new_tokens = [1, 4], 64, 3, 16
        args.prompts, args.ngram_batch, args.ngram_context, args.ngram_steps = (
            ["copy"], 64, 1000, 20)
        args.methods = args.methods or ["ngram", "early_exit:8", "draft_model"]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.methods is None:
        args.methods = (["ngram", "early_exit:4", "early_exit:8", "draft_model"]
                        if args.random_weights else
                        ["ngram", "early_exit:8", "early_exit:24", "draft_model"])
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "cost": {}, "acceptance": []}
    if not args.skip_ngram_scale:
        print("== n-gram lookup at scale", flush=True)
        result["ngram_scale"] = ngram_scale(args)
    if args.only == "ngram-scale":
        print("(--only ngram-scale: no model sections)", flush=True)
    elif args.random_weights:
        from transformers import AutoModelForCausalLM, LlamaConfig

        for name, shape in RANDOM_TARGETS.items():
            print(f"== cost, {name}, random weights, {args.device} {args.dtype}", flush=True)
            config = LlamaConfig(max_position_embeddings=8192, tie_word_embeddings=True, **shape)
            target = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                      dtype=dtype).to(args.device).eval()
            result["cost"][name] = time_costs(target, None, args.methods, args)
            del target
    else:
        from engine.runner.loader import load_model

        target, tokenizer = load_model("smollm2-135m", dtype=args.dtype, device=args.device)
        if not args.skip_cost:
            print(f"== cost, smollm2-135m, {args.device} {args.dtype}", flush=True)
            result["cost"]["smollm2-135m"] = time_costs(target, tokenizer, args.methods, args)
        if args.sweep_layers:
            print("== early-exit agreement with the target's greedy tokens", flush=True)
            result["early_exit_alpha"] = early_exit_agreement(target, tokenizer, args)
        if not args.skip_acceptance:
            print(f"== acceptance, smollm2-135m, greedy, k={args.k}", flush=True)
            result["acceptance"] = acceptance(target, tokenizer, args.methods, args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
