"""A drafting flight's greedy verification replayed from a graph (``samplers.greedy.GreedyChains``)
gives the greedy sampler's tokens, step after step, through the graph's static buffers.

On CPU the layout runs eagerly through the same static buffers (``KeyedGraphs(capture=False)``);
on a GPU it is captured and replayed. Cases: ties (the first maximum wins), every draft accepted
(the bonus token), a rejection at each position, a NaN row and an out-of-vocabulary draft (the
request's row is marked invalid), batch sizes met in turn.
"""

from __future__ import annotations

import os

import pytest
import torch

from samplers import GreedySampler, SamplingParams, SamplingTensors
from samplers.greedy import GreedyChains
from samplers.keyed_graphs import KeyedGraphs
from samplers.limits import INVALID_TOKEN_ID, PLACEHOLDER_TOKEN_ID
from samplers.metadata import SpecDecodeMetadata

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
V = 50
K = 3

pytestmark = pytest.mark.skipif(
    not CUDA and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the greedy sampler's Triton kernels need a GPU or TRITON_INTERPRET=1 (make test)")


def _step(gen: torch.Generator, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[batch * (K + 1), V]`` whose argmaxes the drafts follow for a random number of
    positions (then differ), with ties to the first maximum."""
    logits = torch.randn(batch * (K + 1), V, generator=gen)
    logits[:, 7] = logits.max(dim=1).values  # (a tie: column 7 equals the maximum ...)
    best = logits.argmax(dim=1).view(batch, K + 1)  # (... and the first one wins)
    keep = torch.randint(0, K + 1, (batch,), generator=gen)  # drafts that match
    drafts = best[:, :K].clone()
    for b in range(batch):
        if keep[b] < K:
            drafts[b, keep[b]] = (best[b, keep[b]] + 1) % V
    return logits, drafts


def _greedy(batch: int) -> SamplingTensors:
    return SamplingTensors.from_params([SamplingParams(temperature=0.0)] * batch, None, DEVICE)


@pytest.mark.parametrize("capture", [True, False] if CUDA else [False])
def test_replayed_greedy_chains_give_the_samplers_tokens(capture):
    sampler = GreedySampler(validate=False, use_triton=True)  # (the kernels mark bad rows)
    chains = GreedyChains(sampler, KeyedGraphs(DEVICE, capture=capture))
    gen = torch.Generator().manual_seed(0)
    outputs = []
    for step, batch in enumerate([2, 2, 3, 2, 3, 3, 2, 1, 1, 1]):
        logits, drafts = _step(gen, batch)
        if step == 4:  # a NaN row, then an out-of-vocabulary draft: invalid requests
            logits[1 * (K + 1) + 2, 5] = float("nan")
            drafts[2, 0] = V + 3
        logits, drafts = logits.to(DEVICE), drafts.to(DEVICE)
        want = sampler.verify(logits, SpecDecodeMetadata.uniform(drafts), _greedy(batch))
        got = chains.verify(logits, drafts, _greedy(batch))
        assert got.tolist() == want.tolist()
        outputs.append((got, want.clone()))
        if step == 4:
            assert got[1].tolist() == [INVALID_TOKEN_ID] * (K + 1)
            assert got[2].tolist() == [INVALID_TOKEN_ID] * (K + 1)
    # (every shape met twice or more: the static layout served, or a graph replayed)
    assert chains.graphs.num_replays >= 6
    # each step's answer is its own tensor: later replays did not overwrite it
    for got, want in outputs:
        assert got.tolist() == want.tolist()
    # the cases the steps met: a full acceptance and a rejection at position 0
    rows = [row for got, _ in outputs for row in got.tolist() if row[0] != INVALID_TOKEN_ID]
    assert any(PLACEHOLDER_TOKEN_ID not in row for row in rows)
    assert any(row[1:] == [PLACEHOLDER_TOKEN_ID] * K for row in rows)


def test_only_a_greedy_sampler_is_replayed_as_greedy_chains():
    from samplers import RejectionSampler

    with pytest.raises(ValueError, match="greedy sampler"):
        GreedyChains(RejectionSampler(), KeyedGraphs(DEVICE, capture=False))


@pytest.mark.parametrize("capture", [True, False] if CUDA else [False])
def test_a_shrinking_batch_is_served_by_one_graph_a_power_of_two(capture):
    """Batch sizes 8 down to 1 meet the graphs of 8, 4, 2 and 1 requests; the rows a smaller
    batch leaves over in a graph's buffers (a NaN row among them) change none of its answers."""
    sampler = GreedySampler(validate=False, use_triton=True)
    chains = GreedyChains(sampler, KeyedGraphs(DEVICE, capture=capture))
    gen = torch.Generator().manual_seed(1)
    for batch in [8, 8, 7, 6, 5, 4, 3, 2, 1, 8]:
        logits, drafts = _step(gen, batch)
        if batch == 8:  # (a NaN row in the last request: left over for the smaller batches)
            logits[-1, 3] = float("nan")
        logits, drafts = logits.to(DEVICE), drafts.to(DEVICE)
        want = sampler.verify(logits, SpecDecodeMetadata.uniform(drafts), _greedy(batch))
        assert chains.verify(logits, drafts, _greedy(batch)).tolist() == want.tolist()
    assert set(chains.graphs._graphs) <= {(8, K), (4, K), (2, K), (1, K)}
    assert chains.graphs.num_graphs == 2  # (8 and 4 met twice or more: captured)


@pytest.mark.parametrize("capture", [False, pytest.param(True, marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device"))])
def test_a_fixed_input_is_copied_in_only_when_it_is_another_tensor(capture):
    """``KeyedGraphs.run(fixed=...)``: an input the caller never writes again is copied into
    the layout's buffer once per tensor. Writing it in place anyway (what the promise rules
    out) shows the skipped copy: the replay still reads the values it had; another tensor
    of those values is copied in; the other inputs are copied every time."""
    device = torch.device("cuda" if capture else "cpu")
    graphs = KeyedGraphs(device, capture=capture)
    fixed, x = torch.arange(4, device=device), torch.ones(4, dtype=torch.long, device=device)
    for _ in range(3):  # (eager, then captured, then replayed)
        assert graphs.run("k", torch.add, [fixed, x], fixed=(0,)).tolist() == [1, 2, 3, 4]
    fixed += 10  # (against the promise: not copied again)
    x = x * 2  # (another tensor: copied)
    assert graphs.run("k", torch.add, [fixed, x], fixed=(0,)).tolist() == [2, 3, 4, 5]
    again = fixed.clone()  # (another tensor: copied in)
    assert graphs.run("k", torch.add, [again, x], fixed=(0,)).tolist() == [12, 13, 14, 15]
    assert graphs.run("k", torch.add, [again, x]).tolist() == [12, 13, 14, 15]
