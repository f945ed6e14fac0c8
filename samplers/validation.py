"""Input checks for verification.

``check_structure`` reads only shapes, dtypes and host lists: it never synchronises and always
runs. ``check_values`` reads tensor contents (NaN / inf logits, draft ids outside the vocabulary,
bad draft probabilities): it synchronises, so it runs on CPU tensors always and on CUDA only when
the sampler was built with ``validate=True``. Without it, the CUDA kernels still never read out of
bounds: a request with bad logits or out-of-vocabulary drafts gets ``INVALID_TOKEN_ID`` (-2) in
every slot, which ``parse_output`` turns into a ``ValueError``.
"""

from __future__ import annotations

import torch

from samplers.metadata import (
    INVALID_TOKEN_ID,
    MAX_SPEC_LEN,
    PLACEHOLDER_TOKEN_ID,
    SpecDecodeMetadata,
)
from samplers.sampling_tensors import SamplingTensors

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def check_structure(logits: torch.Tensor, metadata: SpecDecodeMetadata,
                    sampling: SamplingTensors, draft_probs: torch.Tensor | None) -> None:
    """Shapes, dtypes, devices and the host lists; raises ``ValueError``."""
    if logits.dim() != 2 or logits.dtype not in _FLOATS:
        raise ValueError(f"target_logits must be float32/float16/bfloat16 [num_tokens + "
                         f"batch_size, vocab_size], got {tuple(logits.shape)} {logits.dtype}")
    vocab_size = logits.shape[1]
    counts = metadata.num_draft_tokens
    if any(n < 0 for n in counts):
        raise ValueError(f"num_draft_tokens={counts} must be >= 0")
    if metadata.max_spec_len != max(counts, default=0):
        raise ValueError(f"max_spec_len={metadata.max_spec_len} must equal max(num_draft_tokens)="
                         f"{max(counts, default=0)}")
    if metadata.max_spec_len > MAX_SPEC_LEN:
        raise ValueError(f"max_spec_len={metadata.max_spec_len} is above the supported maximum: "
                         f"allowed [0, {MAX_SPEC_LEN}] draft tokens per request")
    ids = metadata.draft_token_ids
    if ids.dim() != 1 or ids.dtype != torch.int64 or ids.shape[0] != sum(counts):
        raise ValueError(f"draft_token_ids must be int64 [num_tokens={sum(counts)}], got "
                         f"{tuple(ids.shape)} {ids.dtype}")
    cu = metadata.cu_num_draft_tokens
    if cu.dtype != torch.int32 or tuple(cu.shape) != (len(counts),):
        raise ValueError(f"cu_num_draft_tokens must be int32 [batch_size={len(counts)}], got "
                         f"{tuple(cu.shape)} {cu.dtype}")
    if logits.shape[0] != metadata.num_rows:
        raise ValueError(f"target_logits has {logits.shape[0]} rows, expected num_tokens + "
                         f"batch_size = {metadata.num_rows}")
    if sampling.batch_size != len(counts):
        raise ValueError(f"sampling covers {sampling.batch_size} requests, metadata "
                         f"{len(counts)}")
    if draft_probs is not None:
        if draft_probs.dtype not in _FLOATS or tuple(draft_probs.shape) != (ids.shape[0],
                                                                             vocab_size):
            raise ValueError(f"draft_probs must be float [num_tokens={ids.shape[0]}, "
                             f"vocab_size={vocab_size}], got {tuple(draft_probs.shape)} "
                             f"{draft_probs.dtype}")
    devices = {t.device for t in (logits, ids, cu, sampling.inv_temperature)}
    if draft_probs is not None:
        devices.add(draft_probs.device)
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def check_values(logits: torch.Tensor, metadata: SpecDecodeMetadata,
                 draft_probs: torch.Tensor | None) -> None:
    """Contents of the tensors (synchronises); raises ``ValueError``."""
    vocab_size = logits.shape[1]
    row_max = logits.amax(dim=1)  # [num_rows]: NaN propagates, +inf and all -inf show
    if not bool(torch.isfinite(row_max).all()):
        row = int((~torch.isfinite(row_max)).nonzero()[0, 0])
        if bool(torch.isneginf(row_max[row])):
            raise ValueError(f"target_logits row {row} is -inf everywhere: no token can be "
                             "sampled")
        raise ValueError(f"target_logits row {row} contains NaN or +inf")
    cumulative, total = [], 0
    for n in metadata.num_draft_tokens:
        total += n
        cumulative.append(total)
    if metadata.cu_num_draft_tokens.tolist() != cumulative:
        raise ValueError(f"cu_num_draft_tokens={metadata.cu_num_draft_tokens.tolist()} is not the "
                         f"cumulative sum of num_draft_tokens={metadata.num_draft_tokens}")
    ids = metadata.draft_token_ids
    if ids.numel() and bool(((ids < 0) | (ids >= vocab_size)).any()):
        raise ValueError(f"draft_token_ids {ids.tolist()} must be in [0, {vocab_size})")
    if draft_probs is not None and draft_probs.numel():
        mass = draft_probs.sum(dim=1)  # [num_tokens]: NaN and inf propagate
        if not bool(torch.isfinite(mass).all()) or bool((draft_probs.amin(dim=1) < 0).any()):
            raise ValueError("draft_probs must be finite and >= 0")
        if bool((mass <= 0).any()):
            raise ValueError("every row of draft_probs must have positive mass")


def parse_output(output_token_ids: torch.Tensor) -> list[list[int]]:
    """Tokens of each request from a verification output, -1 placeholders removed.

    Raises ``ValueError`` for a request marked invalid (-2) by the CUDA kernels.
    """
    rows = output_token_ids.tolist()
    for i, row in enumerate(rows):
        if row and row[0] == INVALID_TOKEN_ID:
            raise ValueError(f"request {i}: invalid verification input (NaN/inf target logits, "
                             "a row with no finite logit, or draft ids outside the vocabulary)")
    return [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in rows]
