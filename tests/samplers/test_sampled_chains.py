"""Sampling of uniform chains replayed from a graph (``samplers.sampled_chains.SampledChains``)
gives the sampler's own tokens for seeded requests (keyed: the same numbers whatever the batch),
step after step, through the graph's static buffers, and draws unseeded requests' tokens from
the processed distribution.

On CPU the layout runs eagerly through the same static buffers (``KeyedGraphs(capture=False)``);
on a GPU it is captured and replayed. Cases: plain steps (no drafts) and chains of three drafts;
top-k, top-p and min-p, each row its own values, greedy rows among them; batch sizes met in turn
(rows left over from a larger batch in the buffers); the batches the graphs do not serve.
"""

from __future__ import annotations

import os

import pytest
import torch

from samplers import RejectionSampler, SamplingParams, SamplingTensors, logits_to_probs
from samplers.greedy import GreedySampler
from samplers.keyed_graphs import KeyedGraphs
from samplers.metadata import SpecDecodeMetadata
from samplers.sampled_chains import SampledChains
from tests.engine.llm_helpers import chi_square_pvalue

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
V = 40

pytestmark = pytest.mark.skipif(
    not CUDA and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the sampler's Triton kernels need a GPU or TRITON_INTERPRET=1 (make test)")

# each request its own filters (a greedy one among them), seeded: keyed samples
PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.7, seed=1),
    SamplingParams(temperature=1.3, top_k=5, seed=2),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.6, min_p=0.2, top_k=11, seed=3),
    SamplingParams(temperature=1.0, top_k=3, top_p=0.9, seed=4),
]


def _tensors(params: list[SamplingParams], positions: list[int],
             generator: torch.Generator | None = None) -> SamplingTensors:
    return SamplingTensors.from_params(params, None, DEVICE, generator,
                                       [p.seed for p in params], positions)


def _chains(capture: bool, generator: torch.Generator | None = None) -> SampledChains:
    sampler = RejectionSampler(validate=False, use_triton=True)
    graphs = KeyedGraphs(DEVICE, capture=capture,
                         generators=[generator] if generator is not None and capture else [])
    return SampledChains(sampler, graphs, generator)


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("capture", [True, False] if CUDA else [False])
def test_seeded_requests_get_the_samplers_tokens_step_after_step(capture, k):
    chains = _chains(capture)
    gen = torch.Generator().manual_seed(0)
    outputs = []
    for step, batch in enumerate([5, 5, 3, 4, 5, 2, 2, 1, 1, 5]):
        params = PARAMS[:batch]
        logits = (3 * torch.randn(batch * (k + 1), V, generator=gen)).to(DEVICE)
        drafts = torch.randint(0, V, (batch, k), generator=gen).to(DEVICE)
        sampling = _tensors(params, [7 * step + i for i in range(batch)])
        want = chains.sampler.verify(logits, SpecDecodeMetadata.uniform(drafts), sampling)
        assert chains.graphed(sampling)
        replays, graphs = chains.graphs.num_replays, chains.graphs.num_graphs
        got, steady = chains.verify(logits, drafts, sampling)
        assert got.tolist() == want.tolist()
        # (steady: a graph captured before replayed; a layout's first runs and capture are not)
        assert steady == (chains.graphs.num_replays > replays
                          and chains.graphs.num_graphs == graphs)
        outputs.append((got, want.clone()))
    # (the layouts of 8, 2 and 1 requests met again: the static layout served, or a graph
    # replayed; batches of 3 and 4 differ in min-p, two layouts met once each)
    assert chains.graphs.num_replays == 5
    for got, want in outputs:  # (each answer its own tensor: later replays left it)
        assert got.tolist() == want.tolist()
    assert {key[0] for key in chains.graphs._met} <= {8, 4, 2, 1}  # (padded batches)


@pytest.mark.parametrize("capture", [True, False] if CUDA else [False])
def test_parameters_and_positions_reach_the_layout(capture):
    """A layout's second batch with other filters and positions: its tokens follow them, not
    the first batch's (a top-k of 2 against 30, positions moved on)."""
    chains = _chains(capture)
    logits = (2 * torch.randn(2, V, generator=torch.Generator().manual_seed(3))).to(DEVICE)
    nothing = torch.empty((2, 0), dtype=torch.long, device=DEVICE)
    seen = {}
    for top_k in [30, 2, 30, 2]:
        for position in [0, 1, 2]:
            params = [SamplingParams(temperature=1.5, top_k=top_k, seed=9)] * 2
            sampling = _tensors(params, [position, position + 40])
            want = chains.sampler.verify(logits, SpecDecodeMetadata.uniform(nothing), sampling)
            got, _ = chains.verify(logits, nothing, sampling)
            assert got.tolist() == want.tolist()
            seen.setdefault(top_k, set()).update(got.view(-1).tolist())
    assert seen[2] <= set(logits.topk(2).indices.view(-1).tolist())
    assert len(seen[30]) > 2  # (the top-k of 30 drew outside the best two)


@pytest.mark.parametrize("capture", [True, False] if CUDA else [False])
def test_unseeded_requests_sample_the_processed_distribution(capture):
    """Unseeded rows draw from the generator through the layout: 30 calls of 64 rows (a
    padded batch of 64, the first call eager) give counts that fit the processed distribution
    (top-k 6 and top-p 0.8 at temperature 0.9); a row without numbers drawn would not."""
    generator = torch.Generator(device=DEVICE).manual_seed(5)
    chains = _chains(capture, generator)
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    params = [SamplingParams(temperature=0.9, top_k=6, top_p=0.8)]
    sampling = _tensors(params * 64, [0] * 64, generator)
    nothing = torch.empty((64, 0), dtype=torch.long, device=DEVICE)
    counts = torch.zeros(V)
    for _ in range(30):
        tokens, _ = chains.verify(logits.expand(64, V).contiguous(), nothing, sampling)
        counts += torch.bincount(tokens.view(-1).cpu(), minlength=V)[:V].float()
    probs = logits_to_probs(logits, _tensors(params, [0]), [1])[0].cpu()
    assert int((probs > 0).sum()) <= 6
    assert chi_square_pvalue(counts, probs) > 1e-3


def test_batches_the_graphs_do_not_serve_go_to_the_sampler():
    """Seeded and unseeded sampled requests together, a request with a generator of its own,
    a sampler that verifies by argmax: the sampler's own call, not a layout."""
    chains = _chains(False)
    mixed = _tensors([PARAMS[0], SamplingParams(temperature=0.7)], [0, 0])
    assert not chains.graphed(mixed)
    own = SamplingTensors.from_params([SamplingParams(temperature=0.7)],
                                      [torch.Generator(device=DEVICE)], DEVICE)
    assert not chains.graphed(own)
    greedy = SampledChains(GreedySampler(), KeyedGraphs(DEVICE, capture=False), None)
    assert not greedy.graphed(_tensors(PARAMS[:2], [0, 0]))
    # (greedy requests alone draw nothing eagerly: replayed, they would use up numbers)
    assert not chains.graphed(_tensors([PARAMS[2]] * 3, [0] * 3))
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    nothing = torch.empty((2, 0), dtype=torch.long, device=DEVICE)
    seeded = _tensors([PARAMS[0], PARAMS[0]], [0, 0])
    mixed_keyed = SamplingTensors.from_params([PARAMS[0], PARAMS[2]], None, DEVICE, None,
                                              [1, None], [0, 0])
    assert chains.graphed(mixed_keyed)  # (a greedy row beside seeded ones: every sampled
    # row keyed, served)
    tokens, steady = chains.verify(logits, nothing, seeded)
    assert tokens.tolist() == chains.sampler.verify(
        logits, SpecDecodeMetadata.uniform(nothing), seeded).tolist()
    assert chains.graphs.num_replays == 0 and not steady  # (a layout's first run: eager)
    own_logits = torch.randn(1, V, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    tokens, steady = chains.verify(own_logits, torch.empty((1, 0), dtype=torch.long,
                                                           device=DEVICE), own)
    assert steady and chains.graphs.num_replays == 0  # (the sampler's call: nothing to price)


def test_sampling_tensors_of_another_batch_are_refused():
    """Sampling tensors for two requests with the logits of three: a ValueError naming both,
    not a padded layout that would sample the third as a greedy row."""
    chains = _chains(False)
    with pytest.raises(ValueError, match="2 requests.*3 rows for 3 chains"):
        chains.verify(torch.zeros(3, V, device=DEVICE),
                      torch.empty((3, 0), dtype=torch.long, device=DEVICE),
                      _tensors(PARAMS[:2], [0, 0]))
