"""Temperature, top-k, top-p and min-p on ragged batches of logits.

Each request owns ``rows_per_request[i]`` consecutive rows (its k + 1 verification positions, or
one row for plain sampling) and its parameters apply to all of them. The filters run in this
order, each on the distribution left by the previous one (as Hugging Face's warpers do):

1. temperature: ``z = logits / T`` (computed as ``logits * (1 / T)``);
2. top-k: keep the tokens whose logit is at least the k-th largest (ties at the k-th value are
   kept); found with ``torch.topk``, never a sort of the whole vocabulary;
3. top-p: keep the smallest set of most probable tokens whose mass reaches ``top_p`` (the most
   probable token is always kept);
4. min-p: keep tokens with ``p >= min_p * max(p)``.

Filtered entries become ``-inf``. Greedy rows (temperature 0) are left untouched, so their argmax
is the raw argmax. Penalties, ``logit_bias``, ``allowed_token_ids`` and ``bad_words`` need each
position's prefix: the engine applies them to the raw logits, row by row, before these calls.
"""

from __future__ import annotations

import torch

from samplers.metadata import host_to_device
from samplers.sampling_tensors import SamplingTensors


def request_index_of_rows(rows_per_request: list[int], device: torch.device) -> torch.Tensor:
    """``[num_rows]`` int64: the request each row belongs to."""
    return host_to_device([i for i, n in enumerate(rows_per_request) for _ in range(n)],
                          torch.int64, device)


def apply_filters(logits: torch.Tensor, sampling: SamplingTensors,
                  row_request: torch.Tensor) -> torch.Tensor:
    """Top-k / top-p / min-p on *unscaled* logits; returns float32 raw logits with ``-inf`` holes.

    ``logits``: ``[num_rows, vocab_size]``; ``row_request``: ``[num_rows]`` request of each row.
    The temperature is used to decide top-p and min-p but is not applied to the result, so that
    the verification kernels can fuse it into their softmax.
    """
    out = logits.float()  # [num_rows, vocab_size]
    if out is logits:
        out = out.clone()
    vocab_size = out.shape[-1]
    inv_t = sampling.inv_temperature[row_request].unsqueeze(1)  # [num_rows, 1]
    if sampling.max_top_k > 0:
        max_k = min(sampling.max_top_k, vocab_size)  # k >= vocab_size keeps everything
        k = sampling.top_k[row_request].long().unsqueeze(1)  # [num_rows, 1]
        top = torch.topk(out, max_k, dim=-1).values  # [num_rows, max_k]
        kth = top.gather(1, (k.clamp(1, max_k) - 1))  # [num_rows, 1]
        threshold = torch.where(k > 0, kth, torch.full_like(kth, float("-inf")))
        out.masked_fill_(out < threshold, float("-inf"))
    if sampling.any_top_p:
        top_p = sampling.top_p[row_request].unsqueeze(1)  # [num_rows, 1]
        probs = torch.softmax(out * inv_t, dim=-1)  # [num_rows, vocab_size]
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = (mass_before >= top_p) & (top_p < 1.0)  # [num_rows, vocab_size]
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        out.masked_fill_(drop, float("-inf"))
    if sampling.any_min_p:
        min_p = sampling.min_p[row_request].unsqueeze(1)  # [num_rows, 1]
        probs = torch.softmax(out * inv_t, dim=-1)  # [num_rows, vocab_size]
        drop = probs < min_p * probs.amax(dim=-1, keepdim=True)
        out.masked_fill_(drop, float("-inf"))
    return out


def process_logits(logits: torch.Tensor, sampling: SamplingTensors,
                   rows_per_request: list[int]) -> torch.Tensor:
    """Processed float32 logits ``[num_rows, vocab_size]``: filters, then ``z = logits / T``.

    Greedy rows come back unscaled (their ``inv_temperature`` is 1).
    """
    _check_rows(logits, sampling, rows_per_request)
    row_request = request_index_of_rows(rows_per_request, logits.device)
    if sampling.needs_filters:
        filtered = apply_filters(logits, sampling, row_request)
    else:
        filtered = logits.float()
    return filtered * sampling.inv_temperature[row_request].unsqueeze(1)


def logits_to_probs(logits: torch.Tensor, sampling: SamplingTensors,
                    rows_per_request: list[int]) -> torch.Tensor:
    """Processed probabilities ``[num_rows, vocab_size]``; greedy rows are one-hot at the argmax."""
    z = process_logits(logits, sampling, rows_per_request)  # [num_rows, vocab_size]
    probs = torch.softmax(z, dim=-1)
    row_request = request_index_of_rows(rows_per_request, logits.device)
    greedy = sampling.is_greedy[row_request].bool().unsqueeze(1)  # [num_rows, 1]
    one_hot = torch.zeros_like(probs).scatter_(1, z.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy, one_hot, probs)


def _check_rows(logits: torch.Tensor, sampling: SamplingTensors,
                rows_per_request: list[int]) -> None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a 2-D float tensor [num_rows, vocab_size], got "
                         f"{tuple(logits.shape)} {logits.dtype}")
    if len(rows_per_request) != sampling.batch_size:
        raise ValueError(f"rows_per_request has {len(rows_per_request)} entries, expected "
                         f"batch_size={sampling.batch_size}")
    if any(n < 0 for n in rows_per_request) or sum(rows_per_request) != logits.shape[0]:
        raise ValueError(f"rows_per_request={rows_per_request} must be >= 0 and sum to the "
                         f"{logits.shape[0]} rows of logits")
