"""The device n-gram lookup (``proposers.ngram_device``): the host proposer's rule, on random
contexts of small vocabularies (many matches, loops, overlapping occurrences), and the index's
rows written from the host and given back."""

from __future__ import annotations

import random

import pytest
import torch

from engine import SamplingParams
from proposers.base import ProposeRequest
from proposers.ngram import NgramProposer
from proposers.ngram_device import PAD, DeviceNgramIndex, lookup_ngrams


@pytest.mark.parametrize("sizes", [(1, 4), (2, 3), (1, 1), (3, 5)])
def test_the_lookup_is_the_host_rule(sizes):
    rng = random.Random(sizes[0] * 10 + sizes[1])
    params = SamplingParams(temperature=0.0)
    matched = unmatched = 0
    for _ in range(60):
        k = rng.randint(1, 7)
        contexts = [[rng.randrange(rng.choice([2, 3, 5, 20])) for _ in range(rng.randint(1, 40))]
                    for _ in range(6)]
        host = NgramProposer(*sizes).propose(
            [ProposeRequest(i, c, k, params) for i, c in enumerate(contexts)]).draft_token_ids
        history = torch.full((6, 48), PAD, dtype=torch.long)
        for i, c in enumerate(contexts):
            history[i, :len(c)] = torch.tensor(c)
        lengths = torch.tensor([len(c) for c in contexts])
        drafts, found = lookup_ngrams(history, lengths, *sizes, k)
        for i, c in enumerate(contexts):
            assert bool(found[i]) == bool(host[i])
            assert drafts[i].tolist() == (host[i] or [c[-1]] * k)
            matched += bool(host[i])
            unmatched += not host[i]
    assert matched > 20 and unmatched > 10  # (both cases met)


def test_the_worked_example_of_the_host_module():
    """proposers/ngram.py's docstring: 5 7 9 2 7 9 4 7 9, n = 1..3: [4, 7], then the period-3
    repetition for k = 5."""
    history = torch.tensor([[5, 7, 9, 2, 7, 9, 4, 7, 9, PAD, PAD]])
    for k, expected in ((2, [4, 7]), (5, [4, 7, 9, 4, 7])):
        drafts, found = lookup_ngrams(history, torch.tensor([9]), 1, 3, k)
        assert found.tolist() == [True] and drafts.tolist() == [expected]


def test_rows_are_written_from_the_host_once_and_given_back():
    index = DeviceNgramIndex(1, 3, max_len=30, device=torch.device("cpu"))
    contexts = {f"r{i}": [i + 1] * (i + 2) for i in range(10)}  # (past the first 8 rows)
    index.sync(list(contexts), list(contexts.values()))
    for req_id, context in contexts.items():
        row = index._row_of[req_id]
        assert index.history[row, :len(context)].tolist() == context
        assert index.holds(req_id) == len(context)
    contexts["r0"] = contexts["r0"] + [9, 9]
    index.history[index._row_of["r0"], 0] = 77  # (a held token is not written again)
    index.sync(["r0"], [contexts["r0"]])
    assert index.history[index._row_of["r0"], :4].tolist() == [77, 1, 9, 9]
    # a step: tokens after positions 3, 4, 5 (one accepted draft, then the bonus)
    drafts = index.draft_after(["r0"], torch.tensor([[1, 9, -1]]), torch.tensor([1]),
                               torch.tensor([3]), 2, base_hi=3)
    assert index.history[index._row_of["r0"], :6].tolist() == [77, 1, 9, 9, 1, 9]
    assert drafts.tolist() == [[9, 1]]  # ("9" last seen at 3, followed by 9, then period 2)
    row = index._row_of["r3"]
    index.remove("r3")
    assert index.holds("r3") == 0 and "r3" not in index._row_of
    index.sync(["new"], [[4, 4]])
    assert index._row_of["new"] == row  # (its row reused, written from position 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graph_replays_write_and_draft_what_eager_steps_do():
    """Steps of 3 requests (padded to 4 rows, the padding on the scratch row), then of 2 of them
    (stale padding rows), widths 4 and 2 in turn, spans growing with the contexts, and more
    requests than rows (the history grows and the graphs are captured anew): the drafts and
    every row as the eager index's."""
    device = torch.device("cuda")
    rng = random.Random(5)
    contexts = {f"r{i}": [rng.randrange(4) for _ in range(rng.randint(3, 12))] for i in range(3)}
    indexes = [DeviceNgramIndex(1, 4, max_len=200, device=device, max_rows=2, graphs=g)
               for g in (True, False)]
    for index in indexes:
        index.sync(list(contexts), list(contexts.values()))
    for step in range(20):
        if step == 12:  # (three more requests: the history grows, its graphs go)
            new = {f"n{i}": [rng.randrange(4) for _ in range(5)] for i in range(3)}
            contexts.update(new)
            for index in indexes:
                index.sync(list(new), list(new.values()))
            assert not indexes[0]._graphs
        ids = list(contexts) if not 8 <= step < 12 else list(contexts)[:2]
        width = 4 if step % 2 else 2
        tokens = torch.tensor([[rng.randrange(4) for _ in range(width)] for _ in ids],
                              device=device)
        accepted = torch.tensor([rng.randrange(width) for _ in ids], device=device)
        base = torch.tensor([len(contexts[r]) - 1 for r in ids], device=device)
        base_hi = max(len(contexts[r]) for r in ids)
        drafts = [index.draft_after(ids, tokens, accepted, base, 3, base_hi).tolist()
                  for index in indexes]
        assert drafts[0] == drafts[1]
        for b, r in enumerate(ids):
            contexts[r] += tokens[b, :int(accepted[b]) + 1].tolist()
            for index in indexes:
                index.advance(r, len(contexts[r]))
    assert indexes[0]._graphs and not indexes[1]._graphs
    assert indexes[0].history.shape[0] == 12  # (3 rows, 6, then 12)
    for r, context in contexts.items():
        rows = [index.history[index._row_of[r], :len(context)].tolist() for index in indexes]
        assert rows[0] == rows[1] == context


def test_the_device_index_is_built_where_an_engine_overlaps_with_graphs():
    """Built for an overlapping engine (on CUDA only with CUDA graphs: op by op a lookup costs
    the host more than the synchronous step), with a row for each of its sequences."""
    from dataclasses import replace

    from tests.conftest import tiny_model
    from tests.proposers.proposer_helpers import build, make_context

    ctx = make_context(tiny_model("llama", vocab_size=48, seed=1), 4, 64)
    assert not build("ngram", ctx).drafts_on_device
    overlapped = replace(ctx, overlapped=True)
    proposer = build("ngram", overlapped)
    assert proposer.drafts_on_device and proposer._device.width == 66
    assert proposer._device.history.shape[0] == 5  # (4 requests and the scratch row)
    cuda = replace(overlapped, device=torch.device("cuda"))
    assert not build("ngram", cuda).drafts_on_device  # (no graphs: nothing touches the GPU)


def test_a_step_reads_only_a_span_past_the_longest_context():
    """A long table (max_model_len 4,096): a step of short contexts looks at the first span
    columns only (a power of two past base_hi + width), with the drafts a lookup of the
    context itself gives."""
    index = DeviceNgramIndex(1, 4, max_len=4096, device=torch.device("cpu"))
    context = [3, 4, 5, 6, 3, 4]
    index.sync(["r"], [context])
    row = index._row_of["r"]
    looked: list[int] = []
    lookup = lookup_ngrams

    def spy(history, *args):
        looked.append(history.shape[1])
        return lookup(history, *args)

    import proposers.ngram_device as module
    module.lookup_ngrams, original = spy, module.lookup_ngrams
    try:
        drafts = index.draft_after(["r"], torch.tensor([[5, 6]]), torch.tensor([1]),
                                   torch.tensor([5]), 3, base_hi=5)
    finally:
        module.lookup_ngrams = original
    assert looked == [8]  # (5 + 2 = 7: the next power of two)
    full, _ = lookup_ngrams(index.history[row:row + 1, :8], torch.tensor([8]), 1, 4, 3)
    assert drafts.tolist() == full.tolist() == [[3, 4, 5]]  # (after "5 6" at 2-3)


def test_a_row_the_verifier_marked_invalid_drafts_valid_ids():
    """On CUDA a row with non-finite logits comes back as INVALID_TOKEN_ID (-2) everywhere;
    its request fails at the commit, but the next step is launched from these drafts before
    that, and must embed valid ids: the history gets 0s, the drafts are ids >= 0."""
    from samplers import INVALID_TOKEN_ID

    index = DeviceNgramIndex(1, 3, max_len=40, device=torch.device("cpu"))
    index.sync(["ok", "bad"], [[1, 2, 1, 2], [7, 8, 7]])
    tokens = torch.tensor([[1, 2, -1], [INVALID_TOKEN_ID] * 3])
    drafts = index.draft_after(["ok", "bad"], tokens, torch.tensor([1, 2]),
                               torch.tensor([3, 2]), 3, base_hi=3)
    assert drafts.tolist()[0] == [1, 2, 1] and min(drafts.tolist()[1]) >= 0
    assert index.history[index._row_of["bad"], :6].tolist() == [7, 8, 7, 0, 0, 0]
