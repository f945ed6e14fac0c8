"""CUDA graphs of the draft head's chain of draft steps, one per (batch bucket, number of drafts).

A draft of the head (:mod:`proposers.draft_head`) is a dozen small kernels: the token's
embedding, two norms, two GEMMs, the target's output head and an argmax; ``k`` drafts for a batch
are ``k`` such steps in a row. On a GPU every launch costs host time, and a step of a small
target is mostly host time, so the whole chain is captured once per (batch size rounded up to a
bucket, ``k``) and replayed as one launch. The head has no attention, so its shapes depend on the
batch size alone: a handful of graphs covers every step (buckets: powers of two up to the
engine's ``max_num_seqs``). A bucket's chain runs eager the first time it is met (a shape's
first run initialises cuBLAS and the caching allocator) and is captured the second time.
Padding rows draft from zero features and token 0; their drafts are dropped.

The reference is the eager chain itself (``chain``): what runs on CPU, with ``enforce_eager``, and
what the graph captures unchanged. ``capture=False`` runs each bucket's padded layout eagerly, to
check the padding off-GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

# chain(features [n, hidden_size], tokens [n], steps) -> drafts [n, steps] (long)
Chain = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
CAPTURE_AT = 2  # a bucket is captured the second time it is met (the first runs eager)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph | None
    features: torch.Tensor  # [bucket, hidden_size] static input
    tokens: torch.Tensor  # [bucket] static input
    out: torch.Tensor  # [bucket, steps] static output


class HeadGraphs:
    """Replays ``chain`` from CUDA graphs by (batch bucket, steps); see the module docstring."""

    def __init__(self, chain: Chain, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, max_batch: int, capture: bool = True) -> None:
        self.chain = chain
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, device
        self.buckets = [1 << i for i in range(max(max_batch - 1, 0).bit_length() + 1)]
        self.capture = capture
        self._graphs: dict[tuple[int, int], _Captured] = {}
        self._met: Counter[tuple[int, int]] = Counter()
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.num_replays = 0

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def bucket(self, batch_size: int) -> int:
        return next((b for b in self.buckets if b >= batch_size), batch_size)

    def run(self, features: torch.Tensor, tokens: torch.Tensor, steps: int) -> torch.Tensor:
        """``chain(features [n, hidden_size], tokens [n], steps)``: drafts ``[n, steps]``."""
        n = features.shape[0]
        key = (self.bucket(n), steps)
        captured = self._graphs.get(key)
        if captured is None:
            self._met[key] += 1
            if self._met[key] < CAPTURE_AT:
                return self.chain(features, tokens, steps)
            captured = self._graphs[key] = self._capture(*key)
        captured.features[:n].copy_(features)
        captured.features[n:].zero_()
        captured.tokens[:n].copy_(tokens)
        captured.tokens[n:].zero_()
        if captured.graph is None:  # (capture=False: the padded layout, eagerly)
            captured.out.copy_(self.chain(captured.features, captured.tokens, steps))
        else:
            captured.graph.replay()
        self.num_replays += 1
        return captured.out[:n]

    def _capture(self, bucket: int, steps: int) -> _Captured:
        features = torch.zeros((bucket, self.hidden_size), dtype=self.dtype, device=self.device)
        tokens = torch.zeros(bucket, dtype=torch.long, device=self.device)
        if not self.capture:
            return _Captured(None, features, tokens, self.chain(features, tokens, steps))
        side = torch.cuda.Stream(self.device)  # (warm-up off the capture, as CUDA graphs want)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.chain(features, tokens, steps)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self.chain(features, tokens, steps)
        return _Captured(graph, features, tokens, out)
