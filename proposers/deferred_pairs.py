"""Plain steps' pairs held on the device until the draft head's cache is next read.

Why. An overlapped plain step hands the draft head its pairs (each sequence's feature at its
fed token, with the token sampled after it) while the step is still on the GPU
(``DraftHeadProposer.write_after``). Writing them at once cost every plain step a head
projection of its own (a graph of about twenty small kernels on the GPU, and its inputs laid
out on the host), which an `eagle` engine's plain steps paid and a plain engine's did not
(docs/performance.md, "Overlapped drafting steps"). A pair's keys and values depend on that pair
alone, so the pairs of several steps can be written later in one batched projection (the same
values; on a CPU a float32 product's last bits may move with its number of rows): each step
copies its rows here (two launches), and the head writes them all at its next read or write of
the cache, or when this holds ``max_steps`` steps or is full.

The rows are device tensors that only the stream's order protects: a step's rows are copied in
before anything later reads them, and :meth:`take` hands them out once; a later :meth:`add`
overwrites them after the write that reads them was queued.
"""

from __future__ import annotations

import torch

__all__ = ["DeferredPairs"]


class DeferredPairs:
    """The pairs of at most ``max_steps`` steps of at most ``max_batch`` rows each: features
    ``[rows, width]`` (the cache's dtype), sampled tokens ``[rows]``, and on the host each
    row's slot and position. ``rows`` is a power of two at least ``max_batch * max_steps``, so
    every bucket of held rows rounded up to a power of two is a slice of them."""

    def __init__(self, max_batch: int, max_steps: int, width: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        rows = 1 << (max_batch * max_steps - 1).bit_length()
        self.features = torch.zeros((rows, width), dtype=dtype, device=device)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.max_steps = max_steps
        self.slots: list[int] = []
        self.positions: list[int] = []
        self._steps = 0

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def full(self) -> bool:
        """Whether it holds ``max_steps`` steps: the next one goes in after a write."""
        return self._steps == self.max_steps

    def add(self, features: torch.Tensor, tokens: torch.Tensor, slots: list[int],
            positions: list[int]) -> None:
        """A step's pairs: ``features [batch, width]`` and ``tokens [batch]`` (copied: the
        step's own tensors are reused by the next step), written at ``slots`` and
        ``positions``; at most ``max_batch`` rows, and not when :attr:`full`."""
        start, batch = len(self.slots), len(slots)
        self.features[start:start + batch].copy_(features)
        self.tokens[start:start + batch].copy_(tokens)
        self.slots += slots
        self.positions += positions
        self._steps += 1

    def take(self) -> tuple[list[int], list[int]]:
        """Every held row's slot and position (rows ``0 .. len - 1`` of :attr:`features` and
        :attr:`tokens`, in that order); nothing is held after."""
        slots, positions = self.slots, self.positions
        self.slots, self.positions, self._steps = [], [], 0
        return slots, positions
