"""Train a draft head (method ``eagle``) for a target by self-distillation, offline.

1. **Data**: the target answers the prompts of :mod:`examples.draft_head_prompts` itself
   through the engine (greedy, and sampled at temperature 0.8), with its chat template.
2. **Features**: one target forward over each prompt + answer gives the final hidden state
   ``f_j`` of every position (the feature the output head reads).
3. **Training**: from ``f_j`` and the token ``x_{j+1}``, the head predicts ``f_{j+1}``, then
   feeds its own prediction back for ``--unroll`` steps (with the true next tokens: the path
   that accepted drafts follow). Loss per step: smooth L1 to the target's feature plus
   ``--ce-weight`` times the cross entropy to the target's own next-token distribution
   (``softmax(lm_head(f))``: the features give it exactly, nothing else is stored).
4. **Held-out acceptance** each epoch, on the greedy answers to prompts about topics no training
   prompt has: from each position the head drafts 4 tokens chained on its own argmax drafts, as
   the engine does; a draft is accepted while it equals the target's greedy continuation. Printed:
   acceptance of the first draft, per position (conditional), and mean accepted drafts.

    python examples/train_draft_head.py --device cuda --out proposers/heads/smollm2-135m
    python examples/train_draft_head.py --model tiny-path --num-prompts 16 --epochs 1  # CPU

The head and a model card (``draft_head.json``: shape, command, data, metrics) go to ``--out``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine import LLM, SamplingParams  # noqa: E402
from examples.draft_head_prompts import draft_head_prompts  # noqa: E402
from proposers.draft_head import DraftHead  # noqa: E402

DRAFTS = 4  # drafts chained in the held-out acceptance


def generate(llm: LLM, prompts: list[str], max_tokens: int, temperature: float,
             seed: int) -> tuple[list[list[int]], list[int]]:
    """Token ids of prompt + the target's answer for every prompt (chat template when the
    tokenizer has one), and each prompt's length in tokens."""
    tokenizer = llm.get_tokenizer()
    if getattr(tokenizer, "chat_template", None):
        inputs = llm.chat_inputs([[{"role": "user", "content": p}] for p in prompts])
        prompt_ids = [ids for _, ids in inputs]
    else:
        prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    outputs = llm.generate(prompt_ids, params, use_tqdm=False)
    return ([ids + list(o.outputs[0].token_ids) for ids, o in zip(prompt_ids, outputs,
                                                                    strict=True)],
            [len(ids) for ids in prompt_ids])


def self_instruct(llm: LLM, prompts: list[str], seed: int) -> list[str]:
    """The target's own rewordings of ``prompts``: one new request per prompt, in its words
    (more varied phrasing than the templates; empty answers are dropped)."""
    asks = [f"Write one different request that a user could send to an AI assistant on the "
            f"same subject as this one, and nothing else: {p}" for p in prompts]
    tokenizer = llm.get_tokenizer()
    seqs, lens = generate(llm, asks, 48, 0.9, seed + 1)
    out = []
    for seq, n in zip(seqs, lens, strict=True):
        text = tokenizer.decode(seq[n:], skip_special_tokens=True).strip().split("\n")[0]
        if len(text) > 10:
            out.append(text.strip('"'))
    return out


@torch.inference_mode()
def features_of(model: torch.nn.Module, sequences: list[list[int]], device: torch.device,
                batch_size: int = 16) -> list[torch.Tensor]:
    """Each sequence's final hidden states ``[len, hidden_size]`` (one forward per batch,
    right-padded; padding never reaches a real position in a causal model)."""
    out = []
    for start in range(0, len(sequences), batch_size):
        group = sequences[start:start + batch_size]
        width = max(map(len, group))
        ids = torch.zeros((len(group), width), dtype=torch.long)  # [batch, width]
        mask = torch.zeros((len(group), width), dtype=torch.long)  # [batch, width]
        for i, seq in enumerate(group):
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
        hidden = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                       output_hidden_states=True).hidden_states[-1]  # [batch, width, hidden]
        out += [hidden[i, :len(seq)].clone() for i, seq in enumerate(group)]
    return out


def windows(features: list[torch.Tensor], sequences: list[list[int]],
            unroll: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training windows: ``feats [n, unroll + 1, hidden]`` (``f_j .. f_{j+unroll}``) and
    ``tokens [n, unroll]`` (``x_{j+1} .. x_{j+unroll}``) for every position ``j`` that has them."""
    feats, tokens = [], []
    for f, seq in zip(features, sequences, strict=True):
        n = len(seq) - unroll
        if n <= 0:
            continue
        ids = torch.tensor(seq, device=f.device)
        feats.append(f.unfold(0, unroll + 1, 1).permute(0, 2, 1)[:n])  # [n, unroll+1, hidden]
        tokens.append(ids[1:].unfold(0, unroll, 1)[:n])  # [n, unroll]
    return torch.cat(feats), torch.cat(tokens)


def step_loss(head: DraftHead, embed, lm_head, feats: torch.Tensor, tokens: torch.Tensor,
              ce_weight: float) -> torch.Tensor:
    """The unrolled loss of a batch of windows (see the module docstring)."""
    f = feats[:, 0]
    total = 0.0
    for u in range(tokens.shape[1]):
        f = head(f, embed(tokens[:, u]).to(f.dtype))
        target = feats[:, u + 1]
        with torch.no_grad():
            p = F.softmax(lm_head(target).float(), dim=-1)
        logp = F.log_softmax(lm_head(f).float(), dim=-1)
        total = total + F.smooth_l1_loss(f.float(), target.float()) \
            - ce_weight * (p * logp).sum(-1).mean()
    return total / tokens.shape[1]


@torch.no_grad()
def held_out_acceptance(head: DraftHead, embed, lm_head, features: list[torch.Tensor],
                        sequences: list[list[int]], prompt_lens: list[int]) -> dict:
    """Chained greedy drafts from every answer position against the target's greedy text."""
    accepted = torch.zeros(DRAFTS)
    tried = torch.zeros(DRAFTS)
    for f, seq, start in zip(features, sequences, prompt_lens, strict=True):
        # positions j with x_{j+1} in the answer and DRAFTS more tokens after it
        last = len(seq) - 1 - DRAFTS
        if last < start:
            continue
        ids = torch.tensor(seq, device=f.device)
        js = torch.arange(start - 1, last, device=f.device)
        feat, token = f[js], ids[js + 1]
        alive = torch.ones(len(js), dtype=torch.bool, device=f.device)
        for d in range(DRAFTS):
            feat = head(feat, embed(token).to(feat.dtype))
            token = lm_head(feat).argmax(-1)
            hit = token == ids[js + 2 + d]
            tried[d] += alive.sum().item()
            alive = alive & hit
            accepted[d] += alive.sum().item()
    rates = (accepted / tried.clamp(min=1)).tolist()  # P(draft d accepted | 1..d-1 were)
    return {"first_draft": rates[0], "per_position": rates,
            "mean_accepted": (accepted.sum() / tried[0].clamp(min=1)).item(),
            "positions": int(tried[0].item())}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="default: the embedded default model")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--num-prompts", type=int, default=960)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=None, help="default: 2.5 x hidden")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-windows", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--unroll", type=int, default=3)
    p.add_argument("--ce-weight", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--self-instruct", action="store_true",
                   help="also train on the target's own rewordings of the training prompts")
    p.add_argument("--out", default=None, help="save the head here")
    args = p.parse_args(argv)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    llm = LLM(model=args.model, device=args.device, dtype=dtype, max_num_seqs=64)
    model = llm.engine.model
    device = next(model.parameters()).device
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    train_prompts, held_prompts = draft_head_prompts(args.num_prompts, seed=args.seed)
    if args.self_instruct:
        train_prompts = train_prompts + self_instruct(llm, train_prompts, args.seed)
    train_seqs = (generate(llm, train_prompts, args.max_tokens, 0.0, args.seed)[0]
                  + generate(llm, train_prompts, args.max_tokens, 0.8, args.seed)[0])
    held_seqs, held_starts = generate(llm, held_prompts, args.max_tokens, 0.0, args.seed)
    data_s = time.perf_counter() - started
    train_feats = features_of(model, train_seqs, device)
    held_feats = features_of(model, held_seqs, device)
    feats, tokens = windows(train_feats, train_seqs, args.unroll)
    hidden = model.config.hidden_size
    head = DraftHead(hidden, args.intermediate_size or int(2.5 * hidden)).to(device)
    for param in model.parameters():
        param.requires_grad_(False)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(feats) / args.batch_windows)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr,
                                                   total_steps=args.epochs * steps_per_epoch)
    print(f"data: {len(train_seqs)} training sequences ({len(feats)} windows), "
          f"{len(held_seqs)} held out; generated in {data_s:.0f} s")
    history = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(feats), device=feats.device)
        head.train()
        total = 0.0
        for s in range(steps_per_epoch):
            idx = order[s * args.batch_windows:(s + 1) * args.batch_windows]
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=device.type == "cuda"):
                loss = step_loss(head, embed, lm_head, feats[idx].float(), tokens[idx],
                                 args.ce_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item()
        head.eval()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            acc = held_out_acceptance(head, embed, lm_head, held_feats, held_seqs, held_starts)
        history.append({"epoch": epoch + 1, "loss": total / steps_per_epoch, **acc})
        print(f"epoch {epoch + 1}: loss {total / steps_per_epoch:.4f}, held-out first draft "
              f"{acc['first_draft']:.3f}, per position "
              f"{[round(x, 3) for x in acc['per_position']]}, mean accepted "
              f"{acc['mean_accepted']:.2f} of {DRAFTS} ({acc['positions']} positions)")
    elapsed = time.perf_counter() - started
    card = {"target": args.model,
            "command": "python examples/train_draft_head.py " + " ".join(argv or sys.argv[1:]),
            "data": f"{len(train_prompts)} prompts (examples/draft_head_prompts.py"
                    f"{', and the target rewording each' if args.self_instruct else ''}), "
                    f"answered by "
                    f"the target greedily and at temperature 0.8, up to {args.max_tokens} "
                    f"tokens; held out: {len(held_prompts)} prompts on unseen topics",
            "seconds": round(elapsed, 1), "device": str(device), "history": history}
    if args.out:
        head.to(dtype=getattr(torch, dtype)).save(args.out, card)
        print(f"saved to {args.out} ({elapsed:.0f} s in all)")
    return card


if __name__ == "__main__":
    main()
