"""Train a draft head (method ``eagle``) for a target by self-distillation, offline.

1. **Data**: the target answers the prompts of :mod:`examples.draft_head_prompts` itself
   through the engine (greedy, and ``--samples`` times sampled; every second sampled answer
   goes on past the end of its turn, the text the target writes under ``ignore_eos``), with its
   chat template. ``--data-cache`` keeps the token ids for another run (``--epochs 0``: data
   only).
2. **Features**: one target forward over each prompt + answer gives the final hidden state
   ``f_j`` of every position (the feature the output head reads).
3. **Training**, whole sequences at a time: from every pair (``f_j``, ``x_{j+1}``) the head
   (one decoder layer, causal attention over the pairs before) predicts ``f_{j+1}``, then feeds
   its own prediction back for ``--unroll`` blocks (with the true next tokens: the path that
   accepted drafts follow), attending as the proposer's cache lets it: to the true pairs up to
   ``j`` and to its own chain (``DraftHead.unrolled``). Loss per block: smooth L1 to the
   target's feature plus
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
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine import LLM, SamplingParams  # noqa: E402
from examples.draft_head_prompts import draft_head_prompts  # noqa: E402
from proposers.head_model import DraftHead, head_for  # noqa: E402

DRAFTS = 4  # drafts chained in the held-out acceptance
SAMPLE_TEMPERATURES = (0.8, 1.0)  # of the sampled answers, alternately


def generate(llm: LLM, prompts: list[str], max_tokens: int, temperature: float,
             seed: int, ignore_eos: bool = False) -> tuple[list[list[int]], list[int]]:
    """Token ids of prompt + the target's answer for every prompt (chat template when the
    tokenizer has one), and each prompt's length in tokens. ``ignore_eos``: the answer goes on
    past the end of the turn (what the target writes there, as under ``ignore_eos``)."""
    tokenizer = llm.get_tokenizer()
    if getattr(tokenizer, "chat_template", None):
        inputs = llm.chat_inputs([[{"role": "user", "content": p}] for p in prompts])
        prompt_ids = [ids for _, ids in inputs]
    else:
        prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                            ignore_eos=ignore_eos)
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


def batches(lengths: list[int], max_rows: int, generator: torch.Generator) -> list[list[int]]:
    """Sequence indices grouped by length (little padding), about ``max_rows`` positions a
    group, the groups in random order."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups, group = [], []
    for i in order:
        if group and (len(group) + 1) * lengths[i] > max_rows:
            groups.append(group)
            group = []
        group.append(i)
    groups.append(group)
    return [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]


def padded(features: list[torch.Tensor], sequences: list[list[int]], group: list[int],
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``features [b, T, hidden]``, ``tokens [b, T]`` and ``lengths [b]`` of a group,
    right-padded with zeros."""
    width = max(len(sequences[i]) for i in group)
    feats = torch.zeros((len(group), width, features[group[0]].shape[-1]),
                        dtype=features[group[0]].dtype, device=device)
    tokens = torch.zeros((len(group), width), dtype=torch.long, device=device)
    for row, i in enumerate(group):
        n = len(sequences[i])
        feats[row, :n] = features[i]
        tokens[row, :n] = torch.tensor(sequences[i], device=device)
    lengths = torch.tensor([len(sequences[i]) for i in group], device=device)
    return feats, tokens, lengths


def unrolled_loss(head: DraftHead, embed, lm_head, feats: torch.Tensor, tokens: torch.Tensor,
                  lengths: torch.Tensor, unroll: int, ce_weight: float) -> torch.Tensor:
    """Block ``u`` at position ``j`` predicts ``f_{j+u+1}`` (see ``DraftHead.unrolled``): smooth
    L1 to the target's feature plus ``ce_weight`` times the cross entropy to the target's own
    next-token distribution, over the positions inside each sequence."""
    preds = head.unrolled(feats, tokens, embed, None, unroll)
    j = torch.arange(tokens.shape[1] - 1, device=tokens.device)
    total = 0.0
    for u, pred in enumerate(preds):
        n = tokens.shape[1] - 1 - u  # positions j whose target f_{j+u+1} exists in the batch
        valid = j[None, :n] + u + 1 < lengths[:, None]  # [b, n]: ... and in the sequence
        target = feats[:, 1 + u:][valid]  # [rows, hidden]
        pred = pred[:, :n][valid]
        with torch.no_grad():
            p = F.softmax(lm_head(target).float(), dim=-1)
        logp = F.log_softmax(lm_head(pred).float(), dim=-1)
        total = total + F.smooth_l1_loss(pred.float(), target.float()) \
            - ce_weight * (p * logp).sum(-1).mean()
    return total / unroll


@torch.no_grad()
def held_out_acceptance(head: DraftHead, embed, lm_head, features: list[torch.Tensor],
                        sequences: list[list[int]], prompt_lens: list[int]) -> dict:
    """Chained greedy drafts from every answer position against the target's greedy text."""
    accepted = torch.zeros(DRAFTS)
    tried = torch.zeros(DRAFTS)
    device = features[0].device
    for f, seq, start in zip(features, sequences, prompt_lens, strict=True):
        # positions j with x_{j+1} in the answer and DRAFTS more tokens after it
        last = len(seq) - 1 - DRAFTS
        if last < start:
            continue
        ids = torch.tensor(seq, device=device)
        preds = head.unrolled(f[None], ids[None], embed, lm_head, DRAFTS)  # DRAFTS x [1, n, h]
        js = torch.arange(start - 1, last, device=device)
        alive = torch.ones(len(js), dtype=torch.bool, device=device)
        for d, pred in enumerate(preds):
            hit = lm_head(pred[0, js]).argmax(-1) == ids[js + 2 + d]
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
    p.add_argument("--intermediate-size", type=int, default=None,
                   help="default: the target's")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="positions per training batch (whole sequences, padded)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--unroll", type=int, default=4, help="chained predictions trained per "
                   "position (training-time test: later blocks read the head's own output)")
    p.add_argument("--ce-weight", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=1,
                   help="sampled answers per training prompt besides the greedy one (at "
                        "temperature 0.8, 1.0, 0.8 ...; the second, fourth ... ignore EOS)")
    p.add_argument("--self-instruct", action="store_true",
                   help="also train on the target's own rewordings of the training prompts")
    p.add_argument("--out", default=None, help="save the head here")
    p.add_argument("--data-cache", default=None,
                   help="the generated token ids: read from this file if it exists, else "
                        "written there (to train again on the same data)")
    args = p.parse_args(argv)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    llm = LLM(model=args.model, device=args.device, dtype=dtype,
              max_num_seqs=256 if args.device.startswith("cuda") else 64)
    model = llm.engine.model
    device = next(model.parameters()).device
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    train_prompts, held_prompts = draft_head_prompts(args.num_prompts, seed=args.seed)
    cache = Path(args.data_cache) if args.data_cache else None
    if cache is not None and cache.is_file():  # (the same arguments wrote it: see --data-cache)
        data = torch.load(cache)
        train_prompts = data["train_prompts"]
    else:
        if args.self_instruct:
            train_prompts = train_prompts + self_instruct(llm, train_prompts, args.seed)
        train = generate(llm, train_prompts, args.max_tokens, 0.0, args.seed)[0]
        for s in range(args.samples):  # sampled answers, every other one past the turn's end
            train += generate(llm, train_prompts, args.max_tokens, SAMPLE_TEMPERATURES[s % 2],
                              args.seed + 10 + s, ignore_eos=s % 2 == 1)[0]
        data = {"train_prompts": train_prompts, "train": train,
                "held": generate(llm, held_prompts, args.max_tokens, 0.0, args.seed)}
        if cache is not None:
            torch.save(data, cache)
    train_seqs, (held_seqs, held_starts) = data["train"], data["held"]
    data_s = time.perf_counter() - started
    if args.epochs == 0:
        print(f"data: {len(train_seqs)} training sequences, {len(held_seqs)} held out; "
              f"generated in {data_s:.0f} s (--epochs 0: no training)")
        return {"history": []}
    train_feats = features_of(model, train_seqs, device)
    held_feats = features_of(model, held_seqs, device)
    head = head_for(model.config, args.intermediate_size).to(device)
    for param in model.parameters():
        param.requires_grad_(False)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    lengths = [len(s) for s in train_seqs]
    shuffle = torch.Generator().manual_seed(args.seed)
    steps_per_epoch = len(batches(lengths, args.batch_tokens, shuffle))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr,
                                                   total_steps=args.epochs * steps_per_epoch)
    print(f"data: {len(train_seqs)} training sequences ({sum(lengths)} positions), "
          f"{len(held_seqs)} held out; generated in {data_s:.0f} s; head "
          f"{sum(p.numel() for p in head.parameters()) / 1e6:.2f} M parameters")
    history = []
    for epoch in range(args.epochs):
        head.train()
        total = 0.0
        groups = batches(lengths, args.batch_tokens, shuffle)
        for group in groups:
            feats, tokens, lens = padded(train_feats, train_seqs, group, device)
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=device.type == "cuda"):
                loss = unrolled_loss(head, embed, lm_head, feats.float(), tokens, lens,
                                     args.unroll, args.ce_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item()
        head.eval()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            acc = held_out_acceptance(head, embed, lm_head, held_feats, held_seqs, held_starts)
        history.append({"epoch": epoch + 1, "loss": total / len(groups), **acc})
        print(f"epoch {epoch + 1}: loss {total / len(groups):.4f}, held-out first draft "
              f"{acc['first_draft']:.3f}, per position "
              f"{[round(x, 3) for x in acc['per_position']]}, mean accepted "
              f"{acc['mean_accepted']:.2f} of {DRAFTS} ({acc['positions']} positions)")
    elapsed = time.perf_counter() - started
    card = {"target": args.model,
            "command": "python examples/train_draft_head.py " + " ".join(argv or sys.argv[1:]),
            "data": f"{len(train_prompts)} prompts (examples/draft_head_prompts.py"
                    f"{', and the target rewording each' if args.self_instruct else ''}), "
                    f"answered by the target greedily and {args.samples} times sampled "
                    f"(temperatures {SAMPLE_TEMPERATURES}, alternately; every second sampled "
                    f"answer goes on past the end of the turn, as under ignore_eos), up to "
                    f"{args.max_tokens} tokens: {len(train_seqs)} sequences, "
                    f"{sum(lengths)} positions; held out: {len(held_prompts)} prompts on "
                    f"unseen topics",
            "seconds": round(elapsed, 1), "device": str(device), "history": history}
    if args.out:
        head.to(dtype=getattr(torch, dtype)).save(args.out, card)
        print(f"saved to {args.out} ({elapsed:.0f} s in all)")
    return card


if __name__ == "__main__":
    main()
