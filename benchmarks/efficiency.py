"""How much of the ideal speedup the engine keeps: an oracle proposer of set acceptance.

The oracle (``examples/custom_proposer.py``) drafts the target's own greedy continuation, computed
first by the engine without speculation, each draft right with probability alpha and wrong
otherwise, for free. Then for each (batch, alpha, policy):

- speedup: tokens/s over the engine without speculation, same prompts, timed right before and
  right after the policy (the mean of the two: on a noisy machine a ratio holds only between
  runs close in time); every tokens/s is the median of ``--repeats`` runs timed one by one, so
  one disturbed run does not move it;
- ideal: expected tokens per step ``E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)`` over the
  step-cost ratio ``c(k)`` that alpha = 0 measures (every draft rejected: one token per step of
  k + 1 scored tokens, so ``c(k)`` = plain tokens/s over alpha-0 tokens/s); for the adaptive
  policy, the best k's ideal;
- efficiency = speedup / ideal;
- ideal at the batch's end and its efficiency: the same costs, counting what the first ideal
  leaves out. Each run is one closed batch (every prompt asks for ``--max-tokens`` tokens), so
  it lasts until its *slowest* sequence is done, and its prefill costs the same with or without
  drafts. So an engine whose steps cost exactly what alpha = 0 measures takes ``P + (T0 - P)
  D(alpha, k) / D(0)`` seconds: ``P`` a run of one token per prompt (prefill and the call's
  fixed work, timed), ``T0`` the alpha-0 run, ``D`` the mean decode steps until every one of
  the batch's sequences has all its tokens (simulated from the same i.i.d. draws; ``D(0) =
  max_tokens - 1``). What this efficiency misses is the speculative path's own cost per step.

Policies: every fixed k (``--ks``) and the default goodput controller (printed ``adaptive``: the
``adaptive_k`` option; at most the largest k). ``--drift``: one engine with the controller serves
requests at alpha = 0, then
batches at alpha = 0.9; each one's speedup is compared with a fresh engine's at 0.9, and the
steps the engine ran since the drift before the first batch at >= 0.9 of it are printed.

A random target's greedy output flips between kernel shapes in bf16 (near-tied logits), and the
oracle would lose sync; so random targets are made *decisive* at the same cost: the output head
becomes a permutation of the token embeddings and every layer's output projections are zeroed
(same bytes and FLOPs). Every run's output is checked token for token against the plain engine's.

    python benchmarks/efficiency.py --model tiny --batch-sizes 1,8 --alphas 0.5,0.9 --ks 1,2,4
    python benchmarks/efficiency.py --device cuda --model random-llama-1b --batch-sizes 1,8,32
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "benchmarks")]

from custom_proposer import OracleProposer  # noqa: E402
from e2e_runs import controller_state  # noqa: E402
from e2e_workloads import RANDOM_LLAMAS, build_model, word_tokenizer  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from proposers import register_proposer  # noqa: E402
from scheduler import expected_tokens  # noqa: E402

STATE: dict = {"references": [], "alpha": 0.0, "last": None}


@register_proposer("oracle_bench")
def _oracle(config, ctx) -> OracleProposer:
    STATE["last"] = OracleProposer(STATE["references"], STATE["alpha"], ctx.vocab_size)
    return STATE["last"]


def decisive(model: torch.nn.Module) -> torch.nn.Module:
    """The same shapes and costs, with greedy margins far above bf16 noise."""
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        perm = torch.randperm(emb.shape[0], generator=torch.Generator().manual_seed(0))
        model.get_output_embeddings().weight.copy_(emb[perm.to(emb.device)] * 8)
        for layer in model.base_model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def build(args: argparse.Namespace):
    if args.model == "tiny":
        from transformers import AutoModelForCausalLM, LlamaConfig

        config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                             max_position_embeddings=1024, eos_token_id=None, bos_token_id=None)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
        return decisive(model.to(args.device)), word_tokenizer(512)
    model, tokenizer = build_model(args.model, args.device, args.dtype)
    return (decisive(model) if args.model in RANDOM_LLAMAS else model), tokenizer


def prompts_for(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    return [torch.randint(3, vocab, (32,), generator=g).tolist() for _ in range(batch)]


def batch_steps(alpha: float, k: int, max_tokens: int, batch: int, trials: int = 4000,
                seed: int = 0) -> float:
    """Mean decode steps until each of ``batch`` sequences has ``max_tokens`` tokens (the
    prefill gives the first), each step verifying ``k`` drafts accepted i.i.d. with probability
    ``alpha`` up to the first rejection, never past ``max_tokens``."""
    rng = np.random.default_rng(seed)
    left = np.full((trials, batch), max_tokens - 1)  # [trials, batch] tokens still to come
    steps = np.zeros(trials)  # [trials]
    while (left > 0).any():
        accepted = np.cumprod(rng.random((trials, batch, k)) < alpha, axis=2).sum(axis=2)
        steps += (left > 0).any(axis=1)
        left = np.maximum(left - 1 - accepted, 0)
    return float(steps.mean())


WARMUPS = (2, 8)  # warm-up runs: at least, and at most while CUDA graphs are still captured
TIMINGS = 3  # timed rounds at most: one with a capture inside is timed again


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams,
          repeats: int) -> tuple[float, list[list[int]], tuple[int, float]]:
    """Tokens/s of the warm engine (the median of ``repeats`` runs, each timed on its own), the
    last run's tokens, and the graphs
    captured inside the kept timed round (count, seconds). The last run's step counts are left
    in ``STATE["steps"]`` (:func:`run_steps`).

    Warm-up until a whole run captures no CUDA graph (a bucket is captured the second time it
    is met, or once padding in a larger one has cost a capture: that can come runs later, and
    measured on the H100 it came inside 1-4 timed rounds of most fixed-k cells, 0.03-0.18 s in
    rounds of 0.2-1 s). A timed round with a capture inside is timed again (at most
    ``TIMINGS`` rounds): the numbers are the steady engine's, and a capture left in the last
    round is reported."""
    graphs = llm.engine.runner.graphs
    for i in range(WARMUPS[1]):
        before = 0 if graphs is None else graphs.num_graphs
        llm.generate(prompts, params, use_tqdm=False)
        if i + 1 >= WARMUPS[0] and (graphs is None or graphs.num_graphs == before):
            break
    for _ in range(TIMINGS):
        before = (0, 0.0) if graphs is None else (graphs.num_graphs, graphs.capture_seconds)
        tps, outs = _median_rate(llm, prompts, params, repeats)
        captures = (0, 0.0) if graphs is None else (graphs.num_graphs - before[0],
                                                     graphs.capture_seconds - before[1])
        if not captures[0]:
            break
    STATE["steps"] = run_steps(llm, len(prompts))
    return tps, [o.outputs[0].token_ids for o in outs], captures


def _median_rate(llm: LLM, prompts: list[list[int]], params: SamplingParams,
                 repeats: int) -> tuple[float, list]:
    """The median tokens/s of ``repeats`` runs, each timed on its own (its metrics reset
    first), and the last run's outputs."""
    rates = []  # [repeats]
    for _ in range(repeats):
        llm.reset_metrics()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs)
                     / (time.perf_counter() - start))
    return float(np.median(rates)), outs


def rate(llm: LLM, prompts: list[list[int]], params: SamplingParams, repeats: int) -> float:
    """Tokens/s of an engine already warm (:func:`timed` warmed it): :func:`_median_rate`."""
    return _median_rate(llm, prompts, params, repeats)[0]


def run_steps(llm: LLM, batch: int) -> dict:
    """The last ``generate``'s engine steps, its sequences' steps that verified drafts, and the
    mean drafts of those (what the controller chose); with the controller on, also what it
    decided from at the end: its step costs at ``batch`` by width (``controller_costs[w]``: a
    step of ``w`` tokens per sequence over a plain one) and the engine-wide acceptance rates
    (by backed draft position, then the unbacked ones and the proposals that found drafts)."""
    m = llm.engine.metrics
    out = dict(steps=m.num_steps, drafting_request_steps=m.num_spec_request_steps,
               mean_drafts=m.num_drafted / m.num_spec_request_steps
               if m.num_spec_request_steps else 0.0)
    state = controller_state(llm, batch)
    if state is not None:
        out["controller_costs"], out["engine_acceptance"] = state["costs"], state["acceptance"]
        out["controller_samples_ms"] = state["samples_ms"]
    return out


def release(llm: LLM) -> None:
    """Give an engine's KV cache and graphs back before the next one is built."""
    del llm.engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine(model, tokenizer, args, k: int | None, adaptive: bool = False) -> LLM:
    spec = None if k is None else {"method": "oracle_bench", "num_speculative_tokens": k,
                                   "adaptive_k": adaptive}
    return LLM(model, tokenizer=tokenizer, device=args.device, max_num_seqs=max(args.batches),
               speculative_config=spec, fused_ops=not args.no_fused_ops)


def run(args: argparse.Namespace) -> dict:
    model, tokenizer = build(args)
    vocab = model.get_output_embeddings().weight.shape[0]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    plain = engine(model, tokenizer, args, None)
    rows, drift = [], []
    for batch in args.batches:
        prompts = prompts_for(batch, vocab)
        base_tps, want, _ = timed(plain, prompts, params, args.repeats)
        STATE["references"] = [p + w for p, w in zip(prompts, want, strict=True)]
        cost, alpha0_s = {}, {}
        run_tokens = batch * args.max_tokens
        one_token = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        prefill_s = batch / timed(plain, prompts, one_token, args.repeats)[0]  # P: one token
        plain_before = rate(plain, prompts, params, args.repeats)
        for alpha in [0.0, *args.alphas]:
            STATE["alpha"] = alpha
            for k in [*args.ks, None]:
                policy = "adaptive" if k is None else f"k={k}"
                llm = engine(model, tokenizer, args, max(args.ks) if k is None else k,
                             adaptive=k is None)
                tps, got, (captures, capture_s) = timed(llm, prompts, params, args.repeats)
                steps = STATE["steps"]
                release(llm)
                # the plain engine right before and right after this policy: on a noisy
                # machine a ratio holds only between runs close in time
                plain_after = rate(plain, prompts, params, args.repeats)
                base_tps, plain_before = (plain_before + plain_after) / 2, plain_after
                if got != want:
                    raise AssertionError(f"batch {batch}, alpha {alpha}, {policy}: the output "
                                         "differs from the plain engine's")
                if alpha == 0.0 and k is not None:
                    cost[k] = base_tps / tps  # a step of k drafts over a plain step
                    alpha0_s[k] = run_tokens / tps  # T0: one run at alpha 0
                ks = args.ks if k is None else [k]
                ideal = max(expected_tokens(alpha, j) / cost[j] for j in ks)
                plain_s = run_tokens / base_tps
                ideal_end = max(plain_s / (prefill_s + (alpha0_s[j] - prefill_s) * batch_steps(
                    alpha, j, args.max_tokens, batch) / (args.max_tokens - 1)) for j in ks)
                speedup = tps / base_tps
                rows.append(dict(batch=batch, alpha=alpha, policy=policy, tokens_per_s=tps,
                                 speedup=speedup, ideal=ideal, efficiency=speedup / ideal,
                                 ideal_end=ideal_end, efficiency_end=speedup / ideal_end,
                                 prefill_s=prefill_s, captures=captures, capture_s=capture_s,
                                 plain_tokens_per_s=base_tps, **steps))
                print(f"batch {batch:3d} alpha {alpha:4.2f} {policy:9s} {tps:9.1f} tok/s  "
                      f"speedup {speedup:5.2f}  ideal {ideal:5.2f}  "
                      f"efficiency {speedup / ideal:5.2f}  at the batch's end: ideal "
                      f"{ideal_end:5.2f}  efficiency {speedup / ideal_end:5.2f}  "
                      f"{steps['steps']} steps, drafts in "
                      f"{steps['drafting_request_steps']} sequence steps, "
                      f"{steps['mean_drafts']:.2f} each"
                      + (f"  ({captures} graph captures, {capture_s:.2f} s, timed)"
                         if captures else "")
                      + (f"  costs by width {steps['controller_costs']}, engine acceptance "
                         f"{steps['engine_acceptance']}" if "controller_costs" in steps else ""),
                      flush=True)
        if args.drift:
            drift.append(run_drift(model, tokenizer, args, prompts, params, base_tps, batch))
    return {"args": vars(args), "rows": rows, "drift": drift}


DRIFT_BATCHES = 4  # batches served at alpha 0.9 after the drift
DRIFT_BOUND = 64  # steps within which the engine should have recovered (the target)


def run_drift(model, tokenizer, args, prompts, params, base_tps, batch) -> dict:
    """alpha 0 for 8 requests (after two warm batches), then 0.9 on the same engine, one batch
    after another, against a fresh engine at 0.9. Per batch after the drift: its speedup, its
    share of the fresh engine's, and the engine steps run since the drift when it began;
    ``recovered_after``: those steps for the first batch at >= 0.9 of the fresh engine (None:
    none of them)."""
    STATE["alpha"] = 0.9
    fresh = engine(model, tokenizer, args, max(args.ks), True)
    fresh_tps = timed(fresh, prompts, params, args.repeats)[0]
    release(fresh)
    STATE["alpha"] = 0.0
    llm = engine(model, tokenizer, args, max(args.ks), True)
    for _ in range(2):
        llm.generate(prompts, params, use_tqdm=False)  # (warm: the drift, not the graphs)
    llm.generate((prompts * 8)[:8], params, use_tqdm=False)
    STATE["last"].alpha = 0.9  # the text became predictable
    metrics = llm.engine.metrics
    drift_step = metrics.num_steps
    after = []
    for _ in range(DRIFT_BATCHES):
        began = metrics.num_steps - drift_step
        start = time.perf_counter()
        out = llm.generate(prompts, params, use_tqdm=False)
        tps = sum(len(o.outputs[0].token_ids) for o in out) / (time.perf_counter() - start)
        after.append(dict(steps_before=began, speedup=tps / base_tps, ratio=tps / fresh_tps))
    release(llm)
    recovered = next((a["steps_before"] for a in after if a["ratio"] >= 0.9), None)
    result = dict(batch=batch, fresh_speedup=fresh_tps / base_tps,
                  after_drift_speedup=after[0]["speedup"], ratio=after[0]["ratio"],
                  batches=after, recovered_after=recovered)
    print(f"batch {batch:3d} drift: fresh {result['fresh_speedup']:.2f}x; after 8 requests at "
          "alpha 0, batch by batch: " + ", ".join(
              f"{a['speedup']:.2f}x ({a['ratio']:.2f} of fresh, from step {a['steps_before']})"
              for a in after)
          + f"; at >= 0.9 of fresh from step {recovered} (bound {DRIFT_BOUND})", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny",
                        help=f"tiny, smollm2-135m, a path, or one of {sorted(RANDOM_LLAMAS)}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bf16 on CUDA")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--alphas", default="0.5,0.9")
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--drift", action="store_true")
    parser.add_argument("--no-fused-ops", action="store_true",
                        help="transformers' own RMSNorm and rotary operations (CUDA)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    args.batches = [int(b) for b in args.batch_sizes.split(",")]
    args.alphas = [float(a) for a in args.alphas.split(",")]
    args.ks = [int(k) for k in args.ks.split(",")]
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
