"""The draft head's own KV cache: one contiguous row of positions per request, grown on demand.

The head has one layer, so its cache is one pair of tensors ``[num_slots + 1, capacity,
num_kv_heads, head_dim]``; the last slot is scratch, where padding rows of a batched (CUDA graph)
step write. Only verified pairs are *committed* (``length``); a chain's drafts write their pairs
past a request's newest one, where the next verified pairs overwrite them before they are read,
so a rejected draft needs no rollback (:mod:`proposers.head_drafting`).
Capacity starts small and doubles up to what the engine's longest sequence needs (a CPU engine
for 64 sequences of 8k tokens would otherwise hold 0.8 GB that short prompts never touch);
growing moves the tensors, so :attr:`generation` counts moves (CUDA graphs captured on the old
tensors must be dropped).
"""

from __future__ import annotations

import torch

MIN_CAPACITY = 256


class HeadKVCache:
    def __init__(self, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, max_len: int) -> None:
        self.num_slots, self.max_len = num_slots, max_len
        self.scratch = num_slots  # the padding rows' slot
        self._shape = (num_slots + 1, num_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.keys = self.values = torch.empty(0)
        self.capacity, self.generation = 0, 0
        self.ensure(MIN_CAPACITY)
        self._free = list(range(num_slots - 1, -1, -1))
        self.slot_of: dict[str | int, int] = {}
        self.length: dict[str | int, int] = {}  # committed (verified) pairs per request

    def ensure(self, needed: int) -> None:
        """Room for positions ``0 .. needed - 1`` in every slot."""
        if needed <= self.capacity:
            return
        # (doubling, but never past what the longest sequence needs: max_len)
        capacity = max(MIN_CAPACITY, min(1 << (needed - 1).bit_length(),
                                         max(self.max_len, needed)))
        slots, heads, dim = self._shape
        keys = torch.zeros((slots, capacity, heads, dim), dtype=self.dtype, device=self.device)
        values = torch.zeros_like(keys)  # [num_slots + 1, capacity, num_kv_heads, head_dim]
        if self.capacity:
            keys[:, :self.capacity] = self.keys
            values[:, :self.capacity] = self.values
        self.keys, self.values, self.capacity = keys, values, capacity
        self.generation += 1

    def open(self, req_id: str | int) -> int:
        """The request's slot (a fresh one, committed length 0, on its first call)."""
        slot = self.slot_of.get(req_id)
        if slot is None:
            if not self._free:
                raise RuntimeError(f"the draft head's cache has no free slot of "
                                   f"{self.num_slots} for request {req_id!r}")
            slot = self.slot_of[req_id] = self._free.pop()
            self.length[req_id] = 0
        return slot

    def close(self, req_id: str | int) -> None:
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self._free.append(slot)
            del self.length[req_id]
