"""The output projection (``lm_head``) on CPU in float32, through a oneDNN-packed weight.

A verification step scores k + 1 positions, so its ``lm_head`` is a GEMM with k + 1 rows against
the whole vocabulary. MKL's float32 GEMM (what ``nn.Linear`` runs) streams the weight well for one
row but not for a few; through oneDNN with the weight reordered once, the weight is read once
whatever the number of rows. One row keeps ``nn.Linear`` (as fast, and the decode path as
before). Logits differ from ``nn.Linear``'s by float32 rounding only (the order of the sums), as
those of one row and of several already do. The measurements: docs/design.md, "Measured reasons
behind the runner's choices".

The packed copy costs the head's size in memory again and is taken when the runner is built:
weights changed afterwards are not seen. Elsewhere (GPU, other dtypes,
a PyTorch without oneDNN, a head that is not an ``nn.Linear``) the model's own head runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.runner.cpu_linears import available, reordered_linear, reordered_weight


def output_head(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``hidden [rows, hidden_size] -> logits [rows, vocab_size]`` for ``model``'s head."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if (not isinstance(head, nn.Linear) or weight.device.type != "cpu"
            or weight.dtype != torch.float32 or not available()):
        return head
    with torch.no_grad():
        packed = reordered_weight(weight)  # [vocab, hidden] blocked
    bias = None if head.bias is None else head.bias.detach()  # [vocab_size]

    def packed_head(hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[0] == 1:  # one row: MKL's GEMV already reads the weight once
            return head(hidden)
        return reordered_linear(hidden, packed, bias)

    return packed_head
