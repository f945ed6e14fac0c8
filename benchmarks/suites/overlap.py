"""Speculative steps overlapped against synchronous ones, in one process.

Four engines share the model: no speculation (its plain steps overlapped, the default),
``--method`` with ``k`` fixed synchronous (``async_scheduling=False``), the same overlapped
(drafting flights where the proposer drafts on the device: ``engine.overlap``), and ``--method``
with the default controller, overlapped. Each kind's prompts run one at a time (batch 1) or
``--batch-size`` together (``--num-prompts`` of them, the batch size by default), greedy,
``--max-tokens`` each; ``--rounds`` interleaved rounds, the last timed. A row: tokens/s, the
ratio over the engine without speculation, engine steps and ms a step, and how many steps were
launched from the device (``LLMEngine._launch_chained`` / ``_launch_drafting`` answers,
counted).

    python -m benchmarks overlap --device cuda --model smollm2-135m --prompt-set real
"""

from __future__ import annotations

import argparse
import time

from benchmarks import models
from benchmarks.engines import release, speculative_config
from benchmarks.record import Result
from benchmarks.timing import sync
from benchmarks.workloads import build_prompts
from engine import LLM, SamplingParams

ENGINES = ("none", "fixed_sync", "fixed_overlap", "controller_overlap")


def add_arguments(p: argparse.ArgumentParser) -> None:
    models.add_model_arguments(p, "smollm2-135m")
    p.add_argument("--method", default="eagle")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--kinds", default="open,copy")
    p.add_argument("--prompt-set", default="real", choices=("bench", "examples", "real"))
    p.add_argument("--num-prompts", type=int, default=None,
                   help="prompts a kind (default: 4 at batch 1, else the batch size)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)


class Counted:
    """Counts an engine's steps and the steps it launched from the device."""

    def __init__(self, llm: LLM) -> None:
        self.steps = self.from_device = 0
        engine = llm.llm_engine
        step = engine.step

        def counted_step():
            self.steps += 1
            return step()

        engine.step = counted_step
        for name in ("_launch_chained", "_launch_drafting"):
            launch = getattr(engine, name)

            def counted(*args, _launch=launch):
                nxt = _launch(*args)
                self.from_device += nxt is not None
                return nxt

            setattr(engine, name, counted)


def run(args: argparse.Namespace) -> Result:
    args = models.resolve(args)
    if args.num_prompts is None:
        args.num_prompts = 4 if args.batch_size == 1 else args.batch_size
    if args.num_prompts < args.batch_size:  # (the batch would hold only the prompts there are)
        raise SystemExit(f"--num-prompts {args.num_prompts} is below --batch-size "
                         f"{args.batch_size}: a batch would hold {args.num_prompts} sequences")
    model, tokenizer = models.build_model(args.model, args.device, args.dtype)
    spec = {"fixed": speculative_config(args.method, args.k, adaptive=False),
            "controller": speculative_config(args.method, args.k)}
    configs = {"none": (None, True), "fixed_sync": (spec["fixed"], False),
               "fixed_overlap": (spec["fixed"], True),
               "controller_overlap": (spec["controller"], True)}
    llms = {name: LLM(model=model, tokenizer=tokenizer, device=args.device, dtype=args.dtype,
                      speculative_config=s, async_scheduling=overlap,
                      max_num_seqs=max(args.batch_size, 1))
            for name, (s, overlap) in configs.items()}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    for kind in args.kinds.split(","):
        prompts = build_prompts(kind, args.num_prompts, args.model, tokenizer,
                                models.vocab_size(model), args.prompt_set)
        groups = [prompts[i:i + args.batch_size]
                  for i in range(0, len(prompts), args.batch_size)]
        timed: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for name, llm in llms.items():
                counts = Counted(llm)
                sync(model.device)
                start = time.perf_counter()
                made = sum(len(o.outputs[0].token_ids) for group in groups
                           for o in llm.generate([{"prompt_token_ids": p} for p in group],
                                                 params, use_tqdm=False))
                sync(model.device)
                seconds = time.perf_counter() - start
                for attribute in ("step", "_launch_chained", "_launch_drafting"):
                    llm.llm_engine.__dict__.pop(attribute, None)
                if round_ == args.rounds - 1:
                    timed[name] = {"kind": kind, "engine": name, "tokens": made,
                                   "tokens_per_s": made / seconds, "steps": counts.steps,
                                   "ms_per_step": 1e3 * seconds / counts.steps,
                                   "steps_from_device": counts.from_device}
        base = timed["none"]["tokens_per_s"]
        for name in ENGINES:
            row = timed[name]
            row["vs_none"] = row["tokens_per_s"] / base
            rows.append(row)
            print(f"{kind:<5} {name:<19} {row['tokens_per_s']:8.1f} tok/s "
                  f"{row['vs_none']:5.2f}x  {row['ms_per_step']:6.3f} ms/step  "
                  f"{row['steps']} steps, {row['steps_from_device']} from the device",
                  flush=True)
    for llm in llms.values():
        release(llm)
    return Result(rows, args.model)
