"""Per-step metadata for ragged speculative drafts (vLLM V1's ``SpecDecodeMetadata``).

Request ``i`` proposes ``num_draft_tokens[i]`` drafts (0 allowed). The drafts of the whole batch
are flattened in request order; ``cu_num_draft_tokens`` is their inclusive cumulative sum. The
target logits for a step hold ``num_draft_tokens[i] + 1`` rows per request (one per draft position,
then the bonus row), so request ``i`` starts at row ``cu_num_draft_tokens[i - 1] + i``.

Example: drafts ``[[5, 7], [], [9]]`` give ``draft_token_ids = [5, 7, 9]``,
``num_draft_tokens = [2, 0, 1]``, ``cu_num_draft_tokens = [2, 2, 3]``, ``max_spec_len = 2`` and
target rows ``0..2`` (request 0), ``3`` (request 1), ``4..5`` (request 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from samplers.limits import (  # noqa: F401 (their home before samplers.limits)
    INVALID_TOKEN_ID,
    MAX_SPEC_LEN,
    PLACEHOLDER_TOKEN_ID,
)


def aligned(count: int) -> int:
    """``count`` 4-byte elements rounded up to a whole number of 16 bytes. Triton compiles a
    kernel per pointer alignment class, so rows that the kernels read from one buffer start on
    16 bytes whatever the batch size (else a new batch size recompiles mid-run)."""
    return -(-count // 4) * 4


_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


def host_to_device(values: list, dtype: torch.dtype,
                   device: torch.device | str) -> torch.Tensor:
    """Copy a (nested) host list to ``device`` without waiting for the GPU stream.

    The copy is from pageable memory: CUDA stages it and returns without a device sync, and the
    few bytes of a step's metadata do not pay for pinning a fresh buffer every step.
    """
    np_dtype = _NUMPY.get(dtype)
    # (through numpy where it can: torch.tensor of a list of Python numbers costs several
    # times the host time: docs/design.md, "Measured reasons behind the runner's choices")
    tensor = (torch.tensor(values, dtype=dtype) if np_dtype is None
              else torch.from_numpy(np.array(values, dtype=np_dtype)))
    device = torch.device(device)
    if device.type == "cuda":
        return tensor.to(device, non_blocking=True)
    return tensor.to(device)


class PinnedStaging:
    """Long index arrays to ``device`` without waiting for the GPU stream: through persistent
    pinned buffers and non-blocking copies (page-locking a fresh tensor every step costs more
    than the copy, and a copy from pageable memory may wait for the queued work: the draft
    head's writes in a forward's shadow waited for the whole forward). A buffer is reused once
    its last copy has left it (its event); when none has, another is made (up to
    ``MAX_BUFFERS``, then the oldest is waited for): an overlapped step queues its copies
    behind the step in flight, and a copy must not wait for those. Off CUDA a plain copy."""

    MAX_BUFFERS = 8

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._pinned = self.device.type == "cuda"
        self._buffers: list[torch.Tensor] = []  # each [capacity] pinned (CUDA only)
        self._copied: list[torch.cuda.Event] = []  # each buffer's last copy's end
        self._turn = 0  # the buffer to wait for when every one is busy

    def _free_buffer(self) -> int:
        """A buffer whose last copy has finished: one that has, else a new one, else the
        oldest in turn, waited for."""
        for i, event in enumerate(self._copied):
            if event.query():
                return i
        if len(self._buffers) < self.MAX_BUFFERS:
            self._buffers.append(torch.empty(0, dtype=torch.long))
            self._copied.append(torch.cuda.Event())
            return len(self._buffers) - 1
        i, self._turn = self._turn, (self._turn + 1) % self.MAX_BUFFERS
        self._copied[i].synchronize()
        return i

    def __call__(self, values: np.ndarray) -> torch.Tensor:
        """``values`` (int64, any shape) on the device."""
        host = torch.from_numpy(values)
        if not self._pinned:
            return host.to(self.device)
        i = self._free_buffer()
        if self._buffers[i].numel() < host.numel():
            with torch.inference_mode(False):  # (written in and out of inference mode)
                self._buffers[i] = torch.empty(max(2 * host.numel(), 1024),
                                               dtype=torch.long).pin_memory()
        staged = self._buffers[i][:host.numel()].view(host.shape).copy_(host)
        out = staged.to(self.device, non_blocking=True)
        self._copied[i].record(torch.cuda.current_stream(self.device))  # (its device's stream)
        return out


@dataclass
class SpecDecodeMetadata:
    """Ragged drafts of one verification step."""

    # [num_tokens] int64: every request's drafts, flattened in request order.
    draft_token_ids: torch.Tensor
    # [batch_size] host copy, each in 0..max_spec_len.
    num_draft_tokens: list[int]
    # [batch_size] int32: inclusive cumulative sum of num_draft_tokens.
    cu_num_draft_tokens: torch.Tensor
    max_spec_len: int

    @property
    def batch_size(self) -> int:
        return len(self.num_draft_tokens)

    @property
    def num_tokens(self) -> int:
        return int(self.draft_token_ids.shape[0])

    @property
    def num_rows(self) -> int:
        """Rows of target logits this step: ``num_tokens + batch_size``."""
        return self.num_tokens + self.batch_size

    @classmethod
    def from_lists(cls, drafts: list[list[int]],
                   device: torch.device | str = "cpu") -> SpecDecodeMetadata:
        """Build the metadata from one list of draft token ids per request."""
        num_draft_tokens = [len(d) for d in drafts]
        flat = [int(t) for d in drafts for t in d]
        cumulative, total = [], 0
        for n in num_draft_tokens:
            total += n
            cumulative.append(total)
        return cls(
            draft_token_ids=host_to_device(flat, torch.int64, device),
            num_draft_tokens=num_draft_tokens,
            cu_num_draft_tokens=host_to_device(cumulative, torch.int32, device),
            max_spec_len=max(num_draft_tokens, default=0),
        )

    @classmethod
    def uniform(cls, draft_token_ids: torch.Tensor) -> SpecDecodeMetadata:
        """The metadata of ``draft_token_ids [batch_size, k]`` (on the device; every request
        ``k`` drafts), built without reading them: drafts an overlapped step keeps on the
        device."""
        batch_size, k = draft_token_ids.shape
        device = draft_token_ids.device
        # (made on the device: a copy from pageable memory would wait for the queued work)
        cumulative = torch.arange(1, batch_size + 1, dtype=torch.int32, device=device) * k
        return cls(
            draft_token_ids=draft_token_ids.reshape(-1).contiguous(),
            num_draft_tokens=[k] * batch_size,
            cu_num_draft_tokens=cumulative,
            max_spec_len=k,
        )
