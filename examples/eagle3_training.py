"""EAGLE-3 training pieces for ``examples/train_draft_head.py --arch eagle3``.

Features per position: the target's final hidden state ``f_j`` (its next-token distribution,
the training target) followed by the inputs of its auxiliary layers (what the head reads, as
the runner returns them in the engine), ``[len, (1 + 3) * hidden]``. Loss: training-time test
(EAGLE-3): ``--unroll`` chained blocks (:meth:`proposers.eagle3_head.Eagle3Head.unrolled`),
block ``u`` reading block ``u - 1``'s own state and its own greedy draft (``--true-tokens``:
the true next token instead), each scored by the cross entropy of its draft-vocabulary
distribution against the target's distribution renormalised over the draft vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from proposers.eagle3_head import Eagle3Head

DRAFTS = 4  # drafts chained in the held-out acceptance (as for the eagle head)


def split(feats: torch.Tensor, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(final [..., hidden], aux [..., n * hidden])`` of the rows that
    ``examples.train_draft_head.features_of`` gives with aux layers."""
    return feats[..., :hidden], feats[..., hidden:]


def eagle3_loss(head: Eagle3Head, embed, lm_head, feats: torch.Tensor, tokens: torch.Tensor,
                lengths: torch.Tensor, unroll: int, true_tokens: bool) -> torch.Tensor:
    """Mean over blocks of the cross entropy of block ``u``'s draft distribution at ``j`` (it
    predicts ``x_{j+u+2}``) against the target's at ``j + u + 1``, over the draft vocabulary,
    on the positions inside each sequence. ``feats [b, T, (1 + n) * hidden]``."""
    final, aux = split(feats, head.target_hidden_size)
    logits = head.unrolled(aux, tokens, embed, unroll, teacher=true_tokens)
    j = torch.arange(tokens.shape[1] - 1, device=tokens.device)
    ids = head.target_ids  # [draft_vocab]
    with torch.no_grad():  # [b, T - 1, draft_vocab]: the target's, made once for all blocks
        rows = lm_head.weight[ids]
        bias = None if getattr(lm_head, "bias", None) is None else lm_head.bias[ids]
        target_p = F.softmax(F.linear(final[:, 1:], rows, bias).float(), dim=-1)
    total = 0.0
    for u, block in enumerate(logits):
        n = tokens.shape[1] - 1 - u
        valid = j[None, :n] + u + 1 < lengths[:, None]  # [b, n]
        p = target_p[:, u:][valid]  # [rows, draft_vocab]
        logq = F.log_softmax(block[:, :n][valid].float(), dim=-1)
        total = total - (p * logq).sum(-1).mean()
    return total / unroll


@torch.no_grad()
def eagle3_acceptance(head: Eagle3Head, embed, features: list[torch.Tensor],
                      sequences: list[list[int]], prompt_lens: list[int]) -> dict:
    """Chained greedy drafts (as the proposer makes them: its own drafts fed back) from every
    answer position, against the target's greedy text."""
    accepted = torch.zeros(DRAFTS)
    tried = torch.zeros(DRAFTS)
    device = features[0].device
    ids_map = head.target_ids
    for f, seq, start in zip(features, sequences, prompt_lens, strict=True):
        last = len(seq) - 1 - DRAFTS
        if last < start:
            continue
        ids = torch.tensor(seq, device=device)
        blocks = head.unrolled(split(f, head.target_hidden_size)[1][None], ids[None], embed,
                               DRAFTS)  # DRAFTS x [1, n, draft_vocab]
        js = torch.arange(start - 1, last, device=device)
        alive = torch.ones(len(js), dtype=torch.bool, device=device)
        for d, block in enumerate(blocks):
            hit = ids_map[block[0, js].argmax(-1)] == ids[js + 2 + d]
            tried[d] += alive.sum().item()
            alive = alive & hit
            accepted[d] += alive.sum().item()
    rates = (accepted / tried.clamp(min=1)).tolist()
    return {"first_draft": rates[0], "per_position": rates,
            "mean_accepted": (accepted.sum() / tried[0].clamp(min=1)).item(),
            "positions": int(tried[0].item())}
