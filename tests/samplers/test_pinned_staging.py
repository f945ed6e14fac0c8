"""PinnedStaging's choice of buffer (CUDA's events faked on CPU): a buffer whose copy has not
finished is never reused; a new one is made instead, up to MAX_BUFFERS, then the oldest in turn
is waited for."""

from __future__ import annotations

import torch

from samplers.metadata import PinnedStaging


class FakeEvent:
    """A CUDA event that finishes only when told (``done``)."""

    def __init__(self) -> None:
        self.done, self.waited = True, 0  # (never recorded: finished, as CUDA says)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def test_a_busy_buffer_is_not_reused_and_the_pool_is_bounded(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    staging = PinnedStaging("cpu")
    first = staging._free_buffer()
    staging._copied[first].done = False  # (its copy is queued behind a step in flight)
    second = staging._free_buffer()
    assert second != first and len(staging._buffers) == 2
    staging._copied[second].done = False
    staging._copied[first].done = True  # (the first copy finished: it is taken again)
    assert staging._free_buffer() == first
    for event in staging._copied:
        event.done = False
    while len(staging._buffers) < PinnedStaging.MAX_BUFFERS:
        i = staging._free_buffer()
        staging._copied[i].done = False
    waited = staging._free_buffer()  # (all busy, none more allowed: the oldest, waited for)
    assert staging._copied[waited].waited == 1
    assert len(staging._buffers) == PinnedStaging.MAX_BUFFERS
