"""Plain PyTorch verification: the test oracle and the CPU path.

Vectorised over the batch (no per-request Python loop), free of host-device synchronisation. The
Triton implementation (``samplers/verify_triton.py``) computes the same tokens from the same random
numbers; both follow the rules documented on the sampler classes:

- ``p_j = softmax(logits_j * inv_temperature)`` for each row ``j`` of a request;
- rejection mode: accept draft ``x_j`` when ``p_j(x_j) > u_j * d_j(x_j)`` (``d_j(x) = 1`` for
  one-hot drafts), i.e. with probability ``min(1, p/d)``;
- typical mode: accept when ``p_j(x_j) > min(threshold, alpha * exp(-H(p_j)))``;
- greedy requests: accept when ``x_j == argmax(logits_j)``;
- keyed requests (a seed): accept when ``x_j == t_j``, ``t_j`` the keyed Gumbel-max sample of
  row ``j`` (:mod:`samplers.keyed_random`), and emit ``t_s`` at the stop position;
- at the stop position ``s`` (first rejection, or ``k`` when all are accepted) emit, for greedy
  requests or a typical rejection, ``argmax(logits_s)``; otherwise race ``argmax(w / q)`` over
  ``w = max(p_s - d_s, 0)`` (``d_k = 0`` for the bonus row), falling back to ``w = p_s`` if the
  residual is empty after rounding.
"""

from __future__ import annotations

import torch

from samplers.keyed_random import keyed_sample
from samplers.metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata

REJECTION_MODE = 0
TYPICAL_MODE = 1


def race(weights: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``argmax(w / q)`` over the last dim, counting only ``w > 0``; returns (index, best score)."""
    score = torch.where(weights > 0, weights / q, torch.zeros_like(weights))
    return score.argmax(dim=-1), score.amax(dim=-1)


def verify_reference(
    logits: torch.Tensor,  # [num_tokens + batch_size, vocab_size]
    metadata: SpecDecodeMetadata,
    inv_temperature: torch.Tensor,  # [batch_size] float32
    is_greedy: torch.Tensor,  # [batch_size] bool
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab_size]
    q: torch.Tensor,  # [batch_size, vocab_size] Exp(1)
    u: torch.Tensor,  # [batch_size, >= max_spec_len] U[0, 1)
    mode: int,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    keys: torch.Tensor | None = None,  # [batch_size, 4] int64 (SamplingTensors.keys)
    keyed_rows: torch.Tensor | None = None,  # [num keyed rows] int64: rows of keyed requests
) -> torch.Tensor:
    """Return int64 ``[batch_size, max_spec_len + 1]`` with -1 after the stop position.

    ``keyed_rows`` lists the logits rows of the keyed requests (those with ``keys[i, 0] == 1``),
    so that only their rows pay for the keyed noise."""
    batch_size, max_len = metadata.batch_size, metadata.max_spec_len
    num_tokens = metadata.num_tokens
    device = logits.device
    cu = metadata.cu_num_draft_tokens.long()  # [batch_size]
    k = cu - torch.cat([cu.new_zeros(1), cu[:-1]])  # [batch_size] drafts per request
    first_draft = cu - k  # [batch_size]
    first_row = first_draft + torch.arange(batch_size, device=device)  # [batch_size]
    pos = torch.arange(max_len + 1, device=device)  # [max_spec_len + 1]
    is_draft = pos[None, :] < k[:, None]  # [batch_size, max_spec_len + 1]
    # Flat draft index of every slot; slots past a request's drafts point at a dummy entry.
    slot = torch.where(is_draft, first_draft[:, None] + pos[None, :], num_tokens)
    drafts = torch.cat([metadata.draft_token_ids, k.new_zeros(1)])[slot]  # [batch, max_len + 1]

    row_request = torch.repeat_interleave(torch.arange(batch_size, device=device), k + 1,
                                          output_size=logits.shape[0])  # [num_rows]
    z = logits.float() * inv_temperature[row_request, None]  # [num_rows, vocab_size]
    argmax = z.argmax(dim=-1)  # [num_rows]
    rows = first_row[:, None] + torch.minimum(pos[None, :], k[:, None])  # [batch, max_len + 1]
    if bool(is_greedy.all()):  # argmax matching only: no probabilities, no race
        accepted = (drafts == argmax[rows]) & is_draft
        stop = accepted.long().cumprod(dim=1).sum(dim=1)  # [batch_size]
        token = argmax[first_row + stop]  # [batch_size]
        out = torch.where(pos[None, :] < stop[:, None], drafts,
                          torch.full_like(drafts, PLACEHOLDER_TOKEN_ID))
        return torch.where(pos[None, :] == stop[:, None], token[:, None], out)
    probs = torch.softmax(z, dim=-1)  # [num_rows, vocab_size]
    keyed = None
    if keys is not None and keyed_rows is not None and keyed_rows.numel() > 0:
        owner = row_request[keyed_rows]  # [num keyed rows]
        position = keys[owner, 3] + keyed_rows - first_row[owner]
        keyed_token = torch.full_like(argmax, PLACEHOLDER_TOKEN_ID)  # [num_rows]
        keyed_token[keyed_rows] = keyed_sample(z[keyed_rows], keys[owner, 1], keys[owner, 2],
                                               position)
        keyed = keys[:, 0].bool()  # [batch_size]

    # Acceptance of every slot; the stop position is the number of leading acceptances.
    p_draft = probs[rows, drafts]  # [batch_size, max_spec_len + 1]
    if mode == TYPICAL_MODE:
        entropy = torch.special.entr(probs).sum(dim=-1)  # [num_rows]
        bar = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
        random_ok = p_draft > bar[rows]
    else:
        d_draft = torch.ones_like(p_draft) if draft_probs is None or num_tokens == 0 else \
            draft_probs[slot.clamp(max=num_tokens - 1), drafts].float()
        uniform = torch.cat([u[:, :max_len], u.new_ones(batch_size, 1)], dim=1)
        random_ok = p_draft > uniform * d_draft
    accepted = torch.where(is_greedy[:, None], drafts == argmax[rows], random_ok)
    if keyed is not None:
        accepted = torch.where(keyed[:, None], drafts == keyed_token[rows], accepted)
    accepted = accepted & is_draft
    stop = accepted.long().cumprod(dim=1).sum(dim=1)  # [batch_size]

    # Token at the stop position: argmax, or the race over the residual (or bonus) distribution.
    rejected = (stop < k)[:, None]  # [batch_size, 1]
    stop_row = first_row + stop  # [batch_size]
    p_stop = probs[stop_row]  # [batch_size, vocab_size]
    stop_slot = slot.gather(1, stop[:, None])  # [batch_size, 1]
    if mode == TYPICAL_MODE or num_tokens == 0:
        d_stop = torch.zeros_like(p_stop)
    elif draft_probs is None:
        d_stop = torch.zeros_like(p_stop).scatter_(1, drafts.gather(1, stop[:, None]), 1.0)
    else:
        d_stop = draft_probs[stop_slot[:, 0].clamp(max=num_tokens - 1)].float()
    d_stop = torch.where(rejected, d_stop, torch.zeros_like(d_stop))
    residual_tok, residual_best = race(torch.clamp(p_stop - d_stop, min=0.0), q)
    target_tok, _ = race(p_stop, q)
    token = torch.where(residual_best > 0, residual_tok, target_tok)
    use_argmax = is_greedy | (rejected[:, 0] & (mode == TYPICAL_MODE))
    token = torch.where(use_argmax, argmax[stop_row], token)
    if keyed is not None:
        token = torch.where(keyed, keyed_token[stop_row], token)

    out = torch.where(pos[None, :] < stop[:, None], drafts,
                      torch.full_like(drafts, PLACEHOLDER_TOKEN_ID))
    return torch.where(pos[None, :] == stop[:, None], token[:, None], out)
