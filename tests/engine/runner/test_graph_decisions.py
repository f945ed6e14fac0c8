"""CUDA graph decisions under tensor parallelism, on CPU: a rank told each step's decision by the
leader (``CudaGraphs.dictate``) runs the same buckets and captures the same graphs at the same
steps, although its own timings would have decided otherwise.

Captures are faked (a CPU has no CUDA graphs): each rank's ``_capture`` logs the bucket and
returns a graph object whose replay does nothing, and each rank has its own capture cost and
replay times, as two GPUs measure their own.
"""

from __future__ import annotations

import random

import torch

from engine.runner.cuda_graphs import CudaGraphs, Key, _Graph

HIDDEN = 4
MAX_NEW = 5


class _NoGraph:
    def replay(self) -> None:
        pass


class FakeRank(CudaGraphs):
    """A rank's graphs with fake captures: ``capture_s`` per capture, each bucket's replay
    ``replay_s(key)``."""

    def __init__(self, capture_s: float, replay_s) -> None:
        self.eager: list[tuple[int, int, int]] = []  # the steps run eager, in order
        super().__init__(self._body, lambda b, n: [0] * (6 * b * n + b), max_batch_size=16,
                         max_num_new=MAX_NEW, max_kv_len=512, device=torch.device("cpu"))
        self.captured: list[Key] = []
        self._capture_s, self._replay_of = capture_s, replay_s

    def _body(self, inputs: torch.Tensor, batch_size: int, num_new: int,
              kv_len: int) -> torch.Tensor:
        self.eager.append((batch_size, num_new, kv_len))
        return torch.zeros(batch_size * num_new, HIDDEN)

    def _capture(self, batch_size: int, num_new: int, kv_len: int) -> _Graph:
        self.captured.append((batch_size, num_new, kv_len))
        return _Graph(_NoGraph(), torch.zeros(1, dtype=torch.long),
                      torch.zeros(batch_size * num_new, HIDDEN))

    def _time_replays(self, graph: _Graph) -> float:
        return self._replay_of(self.captured[-1])

    def capture_cost(self, prefill: bool = False) -> float:
        return self._capture_s if self.captured else 0.0


def steps(count: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """A run's steps: (batch_size, num_new, kv_len), batches shrinking and growing, decode
    and verification widths, contexts growing."""
    rng = random.Random(seed)
    out, kv = [], 20
    for _ in range(count):
        kv = kv + rng.randint(1, 5) if kv < 480 else 20
        out.append((rng.choice([1, 2, 3, 5, 8, 12, 16]), rng.choice([1, 1, 2, 3, 5]), kv))
    return out


def leader() -> FakeRank:
    return FakeRank(capture_s=0.05, replay_s=lambda k: 1e-4 * k[0] * k[1] + 1e-6 * k[2])


def other_gpu() -> FakeRank:
    # (captures three times faster, replays of wide steps relatively dearer)
    return FakeRank(capture_s=0.015, replay_s=lambda k: 3e-4 * k[0] * k[1] ** 2 + 1e-6 * k[2])


def run(rank: FakeRank, plan: list[tuple[int, int, int]], told=None) -> list:
    """Each step's bucket and captures (``told``: the leader's decisions, dictated)."""
    decisions = []
    for i, (b, n, kv) in enumerate(plan):
        if told is not None:
            rank.dictate(told[i])
        key = rank.bucket(b, n, kv)
        decisions.append(rank.decision)
        assert key == rank.decision[0]
        if key is not None:
            rank.replay(key, torch.zeros(1, dtype=torch.long))
    return decisions


def test_a_told_rank_captures_and_replays_what_the_leader_does():
    plan = steps(400)
    lead = leader()
    told = run(lead, plan)
    assert len(lead.captured) >= 10 and lead.eager  # (a run that captures and runs eager)
    assert all(not caps or caps[0] == key for key, caps in told)  # (its own bucket first)
    alone = other_gpu()
    # The test's point: left to its own timings, the other rank decides otherwise (a graph
    # captured on one rank only would hang both at its collectives).
    assert run(alone, plan) != told
    follower = other_gpu()
    assert run(follower, plan, told) == told
    assert follower.captured == lead.captured
    assert follower.eager == lead.eager
    assert sorted(follower._graphs) == sorted(lead._graphs)


def test_a_decode_capture_takes_its_twin_once():
    """A decode bucket's second step captures it and its widest verification twin, and with
    no verification steps (k = 0: the twin is the bucket itself) only the bucket."""
    rank = leader()
    for _ in range(2):
        rank.bucket(2, 1, 100)
    assert rank.decision == ((2, 1, 128), ((2, 1, 128), (2, MAX_NEW, 128)))
    plain = FakeRank(0.05, lambda k: 1e-4)
    plain.max_num_new = 1
    plain.twin_width = lambda batch_size: 1
    for _ in range(2):
        key = plain.bucket(2, 1, 100)
    plain.replay(key, torch.zeros(1, dtype=torch.long))
    assert plain.captured == [(2, 1, 128)]
