"""Tokens per step of draft trees of several shapes, counted offline from the draft head's ranks.

The target writes each prompt's greedy answer (the engine, no speculation, on this CPU); one
target forward gives the features of every position. From every answer position the head then
predicts along the target's own text (teacher forcing: the path that accepted drafts follow),
and at depth ``d`` the rank of the target's next token among the head's drafts is recorded. A
full tree with ``b_d`` candidates per node at depth ``d`` accepts depth ``d`` exactly when every
rank up to it is below its ``b``: its tokens per step are ``1 + E[accepted depth]``, with no
engine and no timing (what ``SpeculativeConfig.draft_tree`` can gain at best, before a step's
costs). One row per (kind, tree).

    python -m benchmarks draft_trees --kinds open,copy --trees 1111,3111,3211,4221
"""

from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.record import Result
from benchmarks.workloads import text_prompts
from engine import LLM, SamplingParams
from proposers.draft_head import DEFAULT_HEAD_DIR
from proposers.head_model import DraftHead


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--head", default=str(DEFAULT_HEAD_DIR))
    p.add_argument("--kinds", default="open,copy")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--trees", default="1111,2111,3111,4111,2211,3211,4211,3221,4221,3321",
                   help="comma list of shapes, one digit per depth (candidates per node)")


def ranks(llm: LLM, head: DraftHead, prompts: list[str], max_tokens: int,
          depth: int) -> torch.Tensor:
    """``[positions, depth]``: the rank of the target's token at each depth among the head's
    drafts (``vocab_size`` where the draft vocabulary lacks it)."""
    model = llm.engine.model
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    inputs = llm.chat_inputs([[{"role": "user", "content": p}] for p in prompts])
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate([ids for _, ids in inputs], params, use_tqdm=False)
    rows = []
    vocab = head.vocab
    weight = lm_head.weight if vocab is None else lm_head.weight[vocab]  # [V', hidden]
    for (_, prompt), out in zip(inputs, outputs, strict=True):
        seq = prompt + list(out.outputs[0].token_ids)
        ids = torch.tensor([seq])
        with torch.inference_mode():
            feats = model.base_model(input_ids=ids).last_hidden_state  # [1, len, hidden]
            preds = head.unrolled(feats, ids, embed, None, depth)  # depth x [1, len - 1, h]
        js = torch.arange(len(prompt) - 1, len(seq) - 1 - depth)
        per_depth = []
        for d, pred in enumerate(preds):
            logits = pred[0, js] @ weight.T  # [positions, V']
            true = ids[0, js + 2 + d]
            if vocab is None:
                mine = logits.gather(1, true[:, None])
                known = torch.ones_like(true, dtype=torch.bool)
            else:
                hit = vocab[None, :] == true[:, None]  # [positions, V']
                known = hit.any(1)
                mine = logits.gather(1, hit.float().argmax(1, keepdim=True))
            rank = (logits > mine).sum(1)
            per_depth.append(torch.where(known, rank, torch.full_like(rank, 1 << 30)))
        rows.append(torch.stack(per_depth, 1))
    return torch.cat(rows)


def tokens_per_step(rank: torch.Tensor, branching: list[int]) -> float:
    alive = torch.ones(len(rank), dtype=torch.bool)
    accepted = torch.zeros(len(rank))
    for d, b in enumerate(branching):
        alive &= rank[:, d] < b
        accepted += alive
    return 1.0 + accepted.mean().item()


def run(args: argparse.Namespace) -> Result:
    trees = [[int(c) for c in t] for t in args.trees.split(",")]
    depth = max(map(len, trees))
    llm = LLM(model=args.model, device="cpu", dtype="float32")
    head = DraftHead.load(args.head).float().eval()
    print(f"{args.model}, head {args.head}, {args.max_tokens} greedy tokens per prompt")
    print(f"{'kind':<6}{'tree':<8}{'nodes':>6}{'tokens/step':>13}")
    rows = []
    for kind in args.kinds.split(","):
        rank = ranks(llm, head, text_prompts(kind), args.max_tokens, depth)
        for t in trees:
            nodes = sum(itertools.accumulate(t, lambda a, b: a * b))
            rows.append({"kind": kind, "tree": t, "nodes": nodes,
                         "tokens_per_step": tokens_per_step(rank, t)})
            print(f"{kind:<6}{''.join(map(str, t)):<8}{nodes:>6}"
                  f"{rows[-1]['tokens_per_step']:>13.3f}")
    return Result(rows, args.model, {"head": args.head})
