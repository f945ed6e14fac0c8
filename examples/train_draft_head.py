"""Train a draft head (method ``eagle``) for a target by self-distillation, offline.

1. **Data**: the target answers the prompts of :mod:`examples.draft_head_prompts` itself
   through the engine (greedy, and ``--samples`` times sampled; every second sampled answer
   goes on past the end of its turn, the text the target writes under ``ignore_eos``), with its
   chat template. ``--copy-prompts N`` adds copy tasks (:func:`examples.draft_head_prompts.
   copy_prompts`: repeat, quote, lightly edit, rewrite or summarise a text given in the prompt)
   over the target's greedy answers to N training prompts, and ``--multi-turn M`` chats over
   its answers to M more (:func:`examples.draft_head_prompts.multi_turn_prompts`: the prompt,
   the answer, and a last user turn), answered the same way. ``--data-cache`` keeps the token
   ids for another run (``--epochs 0``: data only).
2. **Features**: one target forward over each prompt + answer gives the final hidden state
   ``f_j`` of every position (the feature the output head reads).
3. **Training**, whole sequences at a time: from every pair (``f_j``, ``x_{j+1}``) the head
   (one decoder layer, causal attention over the pairs before) predicts ``f_{j+1}``, then feeds
   its own prediction back for ``--unroll`` blocks (with the true next tokens: the path that
   accepted drafts follow), attending as a proposal does: to the true pairs up to ``j`` and to
   its own chain (``DraftHead.unrolled``). Loss per block: smooth L1 to the
   target's feature plus
   ``--ce-weight`` times the cross entropy to the target's own next-token distribution
   (``softmax(lm_head(f))``: the features give it exactly, nothing else is stored).
4. **Held-out acceptance** each epoch, on the greedy answers to prompts about topics no training
   prompt has: from each position the head drafts 4 tokens chained on its own argmax drafts, as
   the engine does; a draft is accepted while it equals the target's greedy continuation. Printed:
   acceptance of the first draft, per position (conditional), and mean accepted drafts, over
   all held-out prompts and over each part: ``prose`` (stories, explanations, factual answers,
   letters, ...: the head's weak spot on the benchmark), ``other`` (code and the first set's
   tasks), ``copy`` and ``multi_turn`` (over held-out answers, with ``--copy-prompts`` and
   ``--multi-turn``).

``--init DIR`` starts an ``eagle`` head from one saved in DIR (same shape), to train it on
(new data) for a few more epochs; the card adds up the training time of both.

``--draft-vocab N`` gives the head a draft vocabulary (``proposers.head_model``): the N tokens
most frequent in the training sequences, the only ones it drafts (its output head's cost on CPU
falls with N). ``--vocab-into DIR`` (with ``--epochs 0``) writes such a vocabulary, from the
data of this run, into the head already saved in DIR.

``--arch eagle3`` trains an EAGLE-3 head instead (:mod:`examples.eagle3_training`): it reads
the inputs of three target layers (``--aux-layers``, default vLLM's ``2, L/2, L-3``), drafts
over its own output head of ``--draft-vocab`` tokens (all: 0), and is trained with
training-time test: ``--unroll`` blocks, each after the first reading the head's own state and
its own greedy draft (``--true-tokens``: the true token), against the target's next-token
distribution. It is saved in the speculators format (``config.json`` + ``model.safetensors``,
method ``eagle3``; vLLM and SGLang load it with ``--verifier`` as its target's name).

``--checkpoint PATH`` saves the head, optimizer and schedule after every epoch and resumes from
there; with ``--time-limit`` a run stops after the epoch that passes it, and the same command
goes on in a later run (machines that take commands of at most 10 minutes).

    python examples/train_draft_head.py --device cuda --out proposers/heads/smollm2-135m
    python examples/train_draft_head.py --model tiny-path --num-prompts 16 --epochs 1  # CPU

The head and a model card (``draft_head.json``: shape, command, data, metrics) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine import LLM, SamplingParams  # noqa: E402
from examples.draft_head_prompts import (  # noqa: E402
    PROSE_KINDS,
    Chat,
    copy_prompts,
    draft_head_prompts,
    multi_turn_prompts,
)
from examples.eagle3_training import (  # noqa: E402
    eagle3_acceptance,
    eagle3_loss,
)
from proposers.head_model import CONFIG_NAME, DraftHead, head_for  # noqa: E402
from proposers.speculators import (  # noqa: E402
    default_aux_layers,
    new_eagle3,
    rope_fields,
    save_eagle3,
)

DRAFTS = 4  # drafts chained in the held-out acceptance
SAMPLE_TEMPERATURES = (0.8, 1.0)  # of the sampled answers, alternately
# the names vLLM and SGLang load a target by, for the aliases this engine reads offline
VERIFIER_NAMES = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def generate(llm: LLM, prompts: list[Chat], max_tokens: int, temperature: float,
             seed: int, ignore_eos: bool = False,
             wave: int = 0) -> tuple[list[list[int]], list[int]]:
    """Token ids of prompt + the target's answer for every prompt (a user message, or chat
    messages ending with the user's), through the chat template when the tokenizer has one
    (else the messages' texts, one a line), and each prompt's length in tokens.
    ``ignore_eos``: the answer goes on past the end of the turn (what the target writes there,
    as under ``ignore_eos``).
    ``wave``: hand the engine this many prompts at a time, the next ones once all of them are
    answered (0: all at once, a new one admitted as each finishes)."""
    if not prompts:
        return [], []
    tokenizer = llm.get_tokenizer()
    if getattr(tokenizer, "chat_template", None):
        inputs = llm.chat_inputs([[{"role": "user", "content": p}] if isinstance(p, str) else p
                                  for p in prompts])
        prompt_ids = [ids for _, ids in inputs]
    else:
        prompt_ids = [tokenizer(p if isinstance(p, str) else "\n".join(m["content"] for m in p))
                      ["input_ids"] for p in prompts]
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                            ignore_eos=ignore_eos)
    step = wave or len(prompt_ids)
    outputs = [o for i in range(0, len(prompt_ids), step)
               for o in llm.generate(prompt_ids[i:i + step], params, use_tqdm=False)]
    return ([ids + list(o.outputs[0].token_ids) for ids, o in zip(prompt_ids, outputs,
                                                                    strict=True)],
            [len(ids) for ids in prompt_ids])


def answers(tokenizer, sequences: list[list[int]], starts: list[int], count: int) -> list[str]:
    """The text of the first ``count`` answers (each sequence past its prompt)."""
    return [tokenizer.decode(seq[n:], skip_special_tokens=True)
            for seq, n in zip(sequences[:count], starts[:count], strict=True)]


def top_tokens(sequences: list[list[int]], size: int) -> list[int]:
    """The ``size`` tokens most frequent in ``sequences`` (ties: the smaller id first)."""
    counts = Counter(t for seq in sequences for t in seq)
    return [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]


def vocab_coverage(vocab: list[int], sequences: list[list[int]], starts: list[int]) -> float:
    """The share of the answers' tokens (each sequence past its prompt) inside ``vocab``."""
    inside = set(vocab)
    tokens = [t for seq, n in zip(sequences, starts, strict=True) for t in seq[n:]]
    return sum(t in inside for t in tokens) / max(len(tokens), 1)


def add_vocab(directory: Path, vocab: list[int], coverage: float | None,
              argv: list[str] | None) -> None:
    """Write ``vocab`` into the head saved in ``directory``, its card kept (and told how)."""
    head = DraftHead.load(directory)
    card = json.loads((directory / CONFIG_NAME).read_text())
    dtype = head.fc.weight.dtype
    head.set_vocab(vocab)
    extra = {k: v for k, v in card.items() if k not in head.shape() and k != "draft_vocab_size"}
    extra["draft_vocab"] = {
        "command": "python examples/train_draft_head.py " + " ".join(argv or sys.argv[1:]),
        "size": len(vocab), "held_out_coverage": coverage}
    head.to(dtype=dtype).save(directory, extra)
    print(f"wrote a draft vocabulary of {len(vocab)} tokens into {directory}")


def self_instruct(llm: LLM, prompts: list[Chat], seed: int, wave: int = 0) -> list[str]:
    """The target's own rewordings of ``prompts``: one new request per prompt, in its words
    (more varied phrasing than the templates; empty answers are dropped)."""
    asks = [f"Write one different request that a user could send to an AI assistant on the "
            f"same subject as this one, and nothing else: {p}" for p in prompts
            if isinstance(p, str)]
    tokenizer = llm.get_tokenizer()
    seqs, lens = generate(llm, asks, 48, 0.9, seed + 1, wave=wave)
    out = []
    for seq, n in zip(seqs, lens, strict=True):
        text = tokenizer.decode(seq[n:], skip_special_tokens=True).strip().split("\n")[0]
        if len(text) > 10:
            out.append(text.strip('"'))
    return out


@torch.inference_mode()
def features_of(model: torch.nn.Module, sequences: list[list[int]], device: torch.device,
                batch_size: int = 64, aux_layers: tuple[int, ...] = ()) -> list[torch.Tensor]:
    """Each sequence's final hidden states ``[len, hidden_size]`` (one forward per batch of
    sequences of similar length, right-padded; padding never reaches a real position in a
    causal model); with ``aux_layers`` (an EAGLE-3 head's) ``[len, (1 + len(aux_layers)) *
    hidden_size]``: the final states, then those layers' inputs (``hidden_states[i]``: layer
    ``i``'s input)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list[torch.Tensor | None] = [None] * len(sequences)
    for start in range(0, len(order), batch_size):
        group = order[start:start + batch_size]
        width = max(len(sequences[i]) for i in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)  # [batch, width]
        mask = torch.zeros((len(group), width), dtype=torch.long)  # [batch, width]
        for row, i in enumerate(group):
            ids[row, :len(sequences[i])] = torch.tensor(sequences[i])
            mask[row, :len(sequences[i])] = 1
        # (the decoder's output, normed: what the output head reads; no logits)
        result = model.base_model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                  output_hidden_states=bool(aux_layers))
        hidden = torch.cat([result.last_hidden_state]
                           + [result.hidden_states[i] for i in aux_layers], -1)
        # hidden: [batch, width, (1 + len(aux_layers)) * hidden_size]
        for row, i in enumerate(group):
            out[i] = hidden[row, :len(sequences[i])].clone()
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
                  lengths: torch.Tensor, unroll: int, ce_weight: float,
                  vocab: torch.Tensor | None = None) -> torch.Tensor:
    """Block ``u`` at position ``j`` predicts ``f_{j+u+1}`` (see ``DraftHead.unrolled``): smooth
    L1 to the target's feature plus ``ce_weight`` times the cross entropy to the target's own
    next-token distribution, over the positions inside each sequence. ``vocab [draft_vocab]``:
    the head's draft vocabulary; the cross entropy is then over those tokens, read out through
    their rows of the output head as the proposer does (the target's probabilities of them, out
    of its whole distribution). The target's distributions are made once for all blocks (block
    ``u`` reads the one of position ``j + u + 1``): with the default model's 49,152 tokens the
    output-head work was nine tenths of a step's time."""
    preds = head.unrolled(feats, tokens, embed, None, unroll)
    j = torch.arange(tokens.shape[1] - 1, device=tokens.device)
    with torch.no_grad():  # [b, T - 1, vocab]: the target's next-token distribution at 1 .. T-1
        target_p = F.softmax(lm_head(feats[:, 1:]).float(), dim=-1)
        if vocab is not None:
            target_p = target_p[..., vocab]
    rows, bias = readout_rows(lm_head, vocab)  # [vocab, hidden], [vocab] or None
    total = 0.0
    for u, pred in enumerate(preds):
        n = tokens.shape[1] - 1 - u  # positions j whose target f_{j+u+1} exists in the batch
        valid = j[None, :n] + u + 1 < lengths[:, None]  # [b, n]: ... and in the sequence
        target = feats[:, 1 + u:][valid]  # [rows, hidden]
        p = target_p[:, u:][valid]  # [rows, vocab]
        pred = pred[:, :n][valid]
        logp = F.log_softmax(F.linear(pred, rows, bias).float(), dim=-1)
        total = total + F.smooth_l1_loss(pred.float(), target.float()) \
            - ce_weight * (p * logp).sum(-1).mean()
    return total / unroll


def readout_rows(lm_head: torch.nn.Module, vocab: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output head's weight and bias rows of ``vocab`` (None: all), as the proposer reads
    out through them."""
    bias = getattr(lm_head, "bias", None)
    if vocab is None:
        return lm_head.weight, bias
    return lm_head.weight[vocab], None if bias is None else bias[vocab]


class VocabReadout(torch.nn.Module):
    """The output head through a draft vocabulary, for the held-out drafts: ``forward(x
    [..., hidden])`` gives logits ``[..., vocab_size]`` that are -inf outside the vocabulary, so
    that an argmax is the proposer's draft, as a token id."""

    def __init__(self, lm_head: torch.nn.Module, vocab: torch.Tensor) -> None:
        super().__init__()
        self.rows, self.bias = readout_rows(lm_head, vocab)  # [draft_vocab, hidden], bias
        self.ids = vocab  # [draft_vocab]
        self.vocab_size = lm_head.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = F.linear(x, self.rows, self.bias)  # [..., draft_vocab]
        out = part.new_full((*x.shape[:-1], self.vocab_size), float("-inf"))
        out[..., self.ids] = part
        return out


def make_data(llm: LLM, args: argparse.Namespace) -> dict:
    """The token ids that training reads (the module docstring's step 1): ``train`` (and its
    chats, ``train_prompts``), and the held-out sets as (sequences, prompt lengths): ``held``
    (the single-turn prompts, whose families are ``held_kinds``), ``held_copy`` and
    ``held_multi_turn`` (None without ``--copy-prompts`` / ``--multi-turn``)."""
    train_set, held_set = draft_head_prompts(args.num_prompts, seed=args.seed)
    train_prompts: list[Chat] = [p.chat for p in train_set]
    held_prompts: list[Chat] = [p.chat for p in held_set]
    if args.self_instruct:
        train_prompts += self_instruct(llm, train_prompts, args.seed, args.wave)

    def ask(prompts: list[Chat], temperature: float, seed: int, ignore_eos: bool = False):
        return generate(llm, prompts, args.max_tokens, temperature, seed, ignore_eos, args.wave)

    train, starts = ask(train_prompts, 0.0, args.seed)
    held = ask(held_prompts, 0.0, args.seed)
    # copy tasks, then multi-turn chats, over the greedy answers to the first training prompts
    # (and as many, in proportion, over the first and the last held-out answers)
    n_copy, n_multi = args.copy_prompts, args.multi_turn
    held_copy_n, held_multi_n = (max(1, n * len(held[0]) // len(train)) if n else 0
                                 for n in (n_copy, n_multi))
    tokenizer = llm.get_tokenizer()
    texts = answers(tokenizer, train, starts, n_copy + n_multi)
    held_texts = answers(tokenizer, *held, len(held[0]))
    extra: list[Chat] = []
    held_copy = held_multi = None
    if n_copy:
        extra += copy_prompts(texts[:n_copy], args.seed)
        held_copy = ask(copy_prompts(held_texts[:held_copy_n], args.seed + 1), 0.0, args.seed)
    if n_multi:
        def pairs(prompts: list[Chat], texts: list[str]) -> list[tuple[Chat, str]]:
            return list(zip(prompts[:len(texts)], texts, strict=True))

        singles = [p for p in train_prompts if isinstance(p, str)]
        extra += multi_turn_prompts(pairs(train_prompts[n_copy:], texts[n_copy:]), singles,
                                    args.seed)
        held_multi = ask(multi_turn_prompts(pairs(held_prompts[-held_multi_n:],
                                                  held_texts[-held_multi_n:]),
                                            held_prompts, args.seed + 1), 0.0, args.seed)
    train += ask(extra, 0.0, args.seed)[0]
    train_prompts += extra
    for s in range(args.samples):  # sampled answers, every other one past the turn's end
        train += ask(train_prompts, SAMPLE_TEMPERATURES[s % 2], args.seed + 10 + s,
                     ignore_eos=s % 2 == 1)[0]
    return {"train_prompts": train_prompts, "train": train, "held": held,
            "held_kinds": [p.kind for p in held_set], "held_copy": held_copy,
            "held_multi_turn": held_multi}


def held_out_sets(data: dict) -> dict[str, tuple[list[list[int]], list[int]]]:
    """The held-out sets measured after every epoch, as (sequences, prompt lengths): ``held``
    (every single-turn prompt), its ``prose`` (:data:`PROSE_KINDS`) and ``other`` (code, and
    the first set's tasks) parts, ``copy`` and ``multi_turn`` (where the data has them)."""
    seqs, starts = data["held"]
    sets = {"held": (seqs, starts)}
    kinds = data.get("held_kinds")
    if kinds:
        for name, keep in (("prose", True), ("other", False)):
            rows = [i for i, kind in enumerate(kinds) if (kind in PROSE_KINDS) == keep]
            if rows:
                sets[name] = ([seqs[i] for i in rows], [starts[i] for i in rows])
    for name, key in (("copy", "held_copy"), ("multi_turn", "held_multi_turn")):
        if data.get(key) and data[key][0]:
            sets[name] = data[key]
    return sets


@torch.no_grad()
def acceptance_counts(head: DraftHead, embed, lm_head, features: list[torch.Tensor],
                      sequences: list[list[int]],
                      prompt_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Chained greedy drafts from every answer position against the target's greedy text
    (through the head's draft vocabulary when it has one, as the proposer drafts), counted per
    sequence: ``accepted, tried [sequences, DRAFTS]``, where ``tried[i, d]`` counts sequence
    i's positions whose drafts 1..d were all accepted, and ``accepted[i, d]`` those whose draft
    d + 1 was too (a row of zeros where a sequence has no answer position to draft from)."""
    accepted = torch.zeros(len(sequences), DRAFTS)
    tried = torch.zeros(len(sequences), DRAFTS)
    device = features[0].device
    readout = lm_head if head.vocab is None else VocabReadout(lm_head, head.vocab.to(device))
    for i, (f, seq, start) in enumerate(zip(features, sequences, prompt_lens, strict=True)):
        # positions j with x_{j+1} in the answer and DRAFTS more tokens after it
        last = len(seq) - 1 - DRAFTS
        if last < start:
            continue
        ids = torch.tensor(seq, device=device)
        preds = head.unrolled(f[None], ids[None], embed, readout, DRAFTS)  # DRAFTS x [1, n, h]
        js = torch.arange(start - 1, last, device=device)
        alive = torch.ones(len(js), dtype=torch.bool, device=device)
        for d, pred in enumerate(preds):
            hit = readout(pred[0, js]).argmax(-1) == ids[js + 2 + d]
            tried[i, d] = alive.sum().item()
            alive = alive & hit
            accepted[i, d] = alive.sum().item()
    return accepted, tried


def acceptance_rates(accepted: torch.Tensor, tried: torch.Tensor) -> dict:
    """The rates of counts ``accepted, tried [DRAFTS]`` (:func:`acceptance_counts`, summed over
    the sequences wanted): the first draft's, each position's given the earlier ones, and the
    mean number accepted."""
    rates = (accepted / tried.clamp(min=1)).tolist()  # P(draft d accepted | 1..d-1 were)
    return {"first_draft": rates[0], "per_position": rates,
            "mean_accepted": (accepted.sum() / tried[0].clamp(min=1)).item(),
            "positions": int(tried[0].item())}


def held_out_acceptance(head: DraftHead, embed, lm_head, features: list[torch.Tensor],
                        sequences: list[list[int]], prompt_lens: list[int]) -> dict:
    """:func:`acceptance_rates` over all the sequences."""
    accepted, tried = acceptance_counts(head, embed, lm_head, features, sequences, prompt_lens)
    return acceptance_rates(accepted.sum(0), tried.sum(0))


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
    p.add_argument("--copy-prompts", type=int, default=0,
                   help="copy tasks over the greedy answers to this many training prompts "
                        "(and as many, in proportion, over held-out answers)")
    p.add_argument("--multi-turn", type=int, default=0,
                   help="multi-turn chats over the greedy answers to this many more training "
                        "prompts (and as many, in proportion, over held-out answers)")
    p.add_argument("--init", default=None,
                   help="eagle: start from the head saved in this directory (its shape must "
                        "be this target's); its draft vocabulary too, unless --draft-vocab "
                        "makes one from this run's data")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="the head drafts only the N tokens most frequent in its training data "
                        "(0: every token)")
    p.add_argument("--vocab-into", default=None,
                   help="with --epochs 0 and --draft-vocab: add the vocabulary to the head "
                        "saved in this directory")
    p.add_argument("--checkpoint", default=None,
                   help="save training state here after every epoch; resume from it if it "
                        "exists")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds: stop after the epoch that passes them (with --checkpoint)")
    p.add_argument("--out", default=None, help="save the head here")
    p.add_argument("--wave", type=int, default=None,
                   help="generate the data N prompts at a time (default: the engine's batch; "
                        "0: all at once, continuous batching). Waves: 12.0k tokens/s against "
                        "7.0k for greedy answers on the H100 (a step that admits a request "
                        "runs eager)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="the engine's batch while generating (default: 256 on CUDA, 64 on CPU)")
    p.add_argument("--arch", choices=("eagle", "eagle3"), default="eagle",
                   help="eagle: this engine's head on the final hidden state (draft_head.json); "
                        "eagle3: an EAGLE-3 head on three layers, saved in the speculators "
                        "format")
    p.add_argument("--aux-layers", default=None,
                   help="eagle3: the target layers whose inputs the head reads, comma "
                        "separated (default: 2, L/2, L-3)")
    p.add_argument("--true-tokens", action="store_true",
                   help="eagle3: blocks after the first read the true next token, not the "
                        "head's own draft")
    p.add_argument("--verifier", default=None,
                   help="eagle3: the target's name written into the head's config for vLLM / "
                        "SGLang (default: the hub id of an alias, else --model)")
    p.add_argument("--data-cache", default=None,
                   help="the generated token ids: read from this file if it exists, else "
                        "written there (to train again on the same data)")
    args = p.parse_args(argv)
    if args.wave is not None and args.wave < 0:
        p.error(f"--wave {args.wave}: allowed 0 (all at once) or a number of prompts >= 1")
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        p.error(f"--max-num-seqs {args.max_num_seqs}: allowed >= 1")
    if args.time_limit is not None and args.checkpoint is None:
        p.error("--time-limit needs --checkpoint (where the next run resumes)")
    eagle3 = args.arch == "eagle3"
    if eagle3 and args.vocab_into is not None:
        p.error("--vocab-into adds a vocabulary to an eagle head; an eagle3 head is trained "
                "with its --draft-vocab")
    if args.vocab_into is not None and (args.epochs or not args.draft_vocab):
        p.error("--vocab-into needs --epochs 0 and --draft-vocab N (a trained head gets its "
                "vocabulary from --draft-vocab alone)")
    if eagle3 and args.init is not None:
        p.error("--init starts an eagle head from a saved one; not with --arch eagle3")
    if args.copy_prompts < 0 or args.multi_turn < 0:
        p.error("--copy-prompts and --multi-turn: allowed 0 or a number of prompts >= 1")
    init = DraftHead.load(args.init) if args.init is not None else None
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    max_num_seqs = args.max_num_seqs or (256 if args.device.startswith("cuda") else 64)
    if args.wave is None:
        args.wave = max_num_seqs
    llm = LLM(model=args.model, device=args.device, dtype=dtype, max_num_seqs=max_num_seqs)
    model = llm.engine.model
    device = next(model.parameters()).device
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    cache = Path(args.data_cache) if args.data_cache else None
    if cache is not None and cache.is_file():  # (the same arguments wrote it: see --data-cache)
        data = torch.load(cache)
    else:
        data = make_data(llm, args)
        if cache is not None:
            torch.save(data, cache)
    train_prompts = data["train_prompts"]
    train_seqs, (held_seqs, held_starts) = data["train"], data["held"]
    data_s = time.perf_counter() - started
    if args.draft_vocab:
        vocab = top_tokens(train_seqs, args.draft_vocab)
    else:  # (--init: the saved head's vocabulary, if it has one)
        vocab = None if init is None or init.vocab is None else init.vocab.tolist()
    coverage = None if vocab is None else vocab_coverage(vocab, held_seqs, held_starts)
    if vocab is not None:
        print(f"draft vocabulary: {len(vocab)} tokens; they are {coverage:.4f} of the held-out "
              "answers' tokens")
    if args.epochs == 0:
        print(f"data: {len(train_seqs)} training sequences, {len(held_seqs)} held out; "
              f"generated in {data_s:.0f} s (--epochs 0: no training)")
        if args.vocab_into:
            add_vocab(Path(args.vocab_into), vocab, coverage, argv)
        return {"history": [], "vocab_coverage": coverage}
    if eagle3:
        aux = (tuple(int(i) for i in args.aux_layers.split(",")) if args.aux_layers
               else default_aux_layers(model.config.num_hidden_layers))
        feats_of = lambda seqs: features_of(model, seqs, device, aux_layers=aux)  # noqa: E731
        # (draft ids in target order: d2t offsets >= 0, as the speculators library writes)
        head = new_eagle3(model.config, lm_head.weight.shape[0],
                          None if vocab is None else sorted(vocab), aux,
                          args.intermediate_size).to(device)
        vocab_rows = None
    else:
        feats_of = lambda seqs: features_of(model, seqs, device)  # noqa: E731
        head = head_for(model.config, args.intermediate_size).to(device)
        if init is not None:
            if init.shape() != head.shape():
                raise ValueError(f"--init {args.init!r}: its shape {init.shape()} is not the "
                                 f"shape of a head for this target {head.shape()} (see "
                                 "--intermediate-size)")
            head.load_state_dict(init.state_dict())
        head.set_vocab(vocab)  # (trained and measured through it, as the proposer drafts)
        vocab_rows = None if vocab is None else head.vocab.to(device)  # [draft_vocab]
    train_feats = feats_of(train_seqs)
    held = {name: (feats_of(seqs), seqs, starts)
            for name, (seqs, starts) in held_out_sets(data).items()}
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
    history, first_epoch, spent = [], 0, 0.0
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        if state["epochs"] != args.epochs:
            raise ValueError(f"checkpoint {str(checkpoint)!r} is of a run of "
                             f"--epochs {state['epochs']}, not {args.epochs}")
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        shuffle.set_state(state["shuffle"])
        history, first_epoch, spent = state["history"], state["epoch"], state["seconds"]
        print(f"resumed from {checkpoint} after epoch {first_epoch}")
    for epoch in range(first_epoch, args.epochs):
        head.train()
        total = torch.zeros((), device=device)
        groups = batches(lengths, args.batch_tokens, shuffle)
        for group in groups:
            feats, tokens, lens = padded(train_feats, train_seqs, group, device)
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=device.type == "cuda"):
                if eagle3:
                    loss = eagle3_loss(head, embed, lm_head, feats.float(), tokens, lens,
                                       args.unroll, args.true_tokens)
                else:
                    loss = unrolled_loss(head, embed, lm_head, feats.float(), tokens, lens,
                                         args.unroll, args.ce_weight, vocab_rows)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.detach()  # (no sync per step)
        head.eval()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            measured = {name: eagle3_acceptance(head, embed, *sets) if eagle3
                        else held_out_acceptance(head, embed, lm_head, *sets)
                        for name, sets in held.items()}
        acc = {**measured.pop("held"), **measured}  # (all held-out prompts, then each part)
        mean_loss = total.item() / len(groups)
        history.append({"epoch": epoch + 1, "loss": mean_loss, **acc})
        print(f"epoch {epoch + 1}: loss {mean_loss:.4f}, held-out first draft "
              f"{acc['first_draft']:.3f}, per position "
              f"{[round(x, 3) for x in acc['per_position']]}, mean accepted "
              f"{acc['mean_accepted']:.2f} of {DRAFTS} ({acc['positions']} positions)"
              + "".join(f"; {name}: first draft {part['first_draft']:.3f}, mean accepted "
                        f"{part['mean_accepted']:.2f}" for name, part in measured.items()))
        if checkpoint is not None:
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict(), "shuffle": shuffle.get_state(),
                        "history": history, "epoch": epoch + 1, "epochs": args.epochs,
                        "seconds": spent + time.perf_counter() - started}, checkpoint)
            if (args.time_limit is not None and epoch + 1 < args.epochs
                    and time.perf_counter() - started > args.time_limit):
                print(f"stopped after epoch {epoch + 1} (--time-limit); the same command "
                      f"resumes from {checkpoint}")
                return {"history": history}
    elapsed = spent + time.perf_counter() - started
    copy_note = (f"; copy tasks over the greedy answers to {args.copy_prompts} of them"
                 if args.copy_prompts else "")
    multi_note = (f"; multi-turn chats over the greedy answers to {args.multi_turn} more"
                  if args.multi_turn else "")
    sets = held_out_sets(data)
    held_note = "".join(f", {len(sets[name][0])} {words} over their answers"
                        for name, words in (("copy", "copy tasks"),
                                            ("multi_turn", "multi-turn chats")) if name in sets)
    card = {"target": args.model,
            "command": "python examples/train_draft_head.py " + " ".join(argv or sys.argv[1:]),
            "data": f"{len(train_prompts)} prompts (examples/draft_head_prompts.py"
                    f"{', and the target rewording each' if args.self_instruct else ''}"
                    f"{copy_note}{multi_note}), "
                    f"answered by the target greedily and {args.samples} times sampled "
                    f"(temperatures {SAMPLE_TEMPERATURES}, alternately; every second sampled "
                    f"answer goes on past the end of the turn, as under ignore_eos), up to "
                    f"{args.max_tokens} tokens: {len(train_seqs)} sequences, "
                    f"{sum(lengths)} positions; held out: {len(held_seqs)} prompts on "
                    f"unseen subjects ({len(sets.get('prose', ([],))[0])} of them prose)"
                    f"{held_note}",
            "seconds": round(elapsed, 1), "device": str(device), "history": history,
            "draft_vocab_coverage": coverage}
    if init is not None:  # (the training time that the head has had in all)
        before = json.loads((Path(args.init) / CONFIG_NAME).read_text())
        earlier = before.get("total_seconds", before.get("seconds"))
        card["init"] = {"from": args.init, "command": before.get("command"),
                        "total_seconds": earlier}
        if earlier is not None:
            card["total_seconds"] = round(earlier + elapsed, 1)
    if args.out and eagle3:
        verifier = args.verifier or VERIFIER_NAMES.get(args.model, args.model)
        save_eagle3(head.to(dtype=getattr(torch, dtype)), args.out, rope_fields(model.config),
                    verifier, list(getattr(model.config, "architectures", None)
                                   or [type(model).__name__]),
                    args.unroll, card)
        print(f"saved to {args.out} in the speculators format ({elapsed:.0f} s in all)")
    elif args.out:
        head.to(dtype=getattr(torch, dtype)).save(args.out, card)
        print(f"saved to {args.out} ({elapsed:.0f} s in all)")
    return card


if __name__ == "__main__":
    main()
