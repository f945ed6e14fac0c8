"""Attention-backend choice for the runner's forwards.

On Hopper (sm_90) and sm_100 with a recent cuDNN, PyTorch tries its cuDNN SDPA backend first.
That backend caches one execution plan per exact set of sizes and strides (batch, heads, query
and key lengths), and every miss builds a plan on the host: tens of milliseconds. A speculative
engine's key length grows every step, so nearly every forward would miss: on an H200 the 4-layer
self-draft measured 170-280 ms per proposal step with cuDNN against 25-43 ms once the same shapes
were planned. The flash and memory-efficient kernels need no per-shape build, so the runner's
forwards run with cuDNN SDPA off (the other backends stay as the user set them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def without_cudnn_attention() -> Iterator[None]:
    """cuDNN SDPA off for the block, then restored to its previous (process-wide) setting."""
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(enabled)
