"""The runner's logits equal one plain full-sequence forward of each sequence, over random
interleavings of prefills, multi-token appends, rollbacks, joins and leaves."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from torch import nn

from engine.runner import ForwardOutput, model_runner, step_layout
from engine.runner import executor as executor_module
from engine.runner.model_runner import KVCacheFull, ModelRunner
from samplers.greedy import argmax_tokens
from tests.conftest import TINY_FAMILIES, tiny_model

ATOL = 1e-5


def full_logits(model, token_ids: list[int]) -> torch.Tensor:
    """Oracle: one plain Hugging Face forward of the whole sequence, no cache."""
    with torch.no_grad():
        ids = torch.tensor([token_ids], device=model.device)
        return model(input_ids=ids).logits[0].float()  # [seq_len, vocab]


def check_step(runner, model, seqs: dict[int, list[int]], new: dict[int, list[int]]) -> bool:
    """Run one step of ``new`` tokens per slot and compare with the oracle, row by row; a
    decode graph's argmax with the logits' own. Whether the step brought one."""
    slots = list(new)
    starts = [len(seqs[s]) for s in slots]
    step = runner.forward(slots, [new[s] for s in slots])
    out = step.logits
    if step.argmax is not None:  # (a decode bucket's graph ran the head and the argmax: a
        # step of one token a sequence, or a folded or packed one, one token a row)
        assert torch.equal(step.argmax, argmax_tokens(out))
    assert out.shape == (sum(len(new[s]) for s in slots), runner.vocab_size)
    assert out.dtype == torch.float32
    row = 0
    for slot, start in zip(slots, starts, strict=True):
        seqs[slot] += new[slot]
        n = len(new[slot])
        expected = full_logits(model, seqs[slot])[start:start + n]
        torch.testing.assert_close(out[row:row + n], expected, atol=ATOL, rtol=ATOL)
        assert runner.seq_len(slot) == len(seqs[slot])
        row += n
    return step.argmax is not None


def random_schedule(runner, model, seed: int, num_steps: int, vocab_size: int) -> int:
    """Random joins, leaves, rollbacks, prefills and (k+1)-token appends, checked every step;
    how many steps brought a decode graph's argmax."""
    rng = random.Random(seed)
    seqs: dict[int, list[int]] = {}
    argmaxes = 0
    tokens = lambda n: [rng.randrange(vocab_size) for _ in range(n)]
    for _ in range(num_steps):
        if len(seqs) < runner.max_num_seqs and (not seqs or rng.random() < 0.3):
            seqs[runner.allocate_slot()] = []
        if len(seqs) > 1 and rng.random() < 0.15:
            leaving = rng.choice(list(seqs))
            runner.free_slot(leaving)
            del seqs[leaving]
        for slot in seqs:  # rollback after a verification: keep a random accepted prefix
            if seqs[slot] and rng.random() < 0.4:
                keep = rng.randint(max(0, len(seqs[slot]) - 5), len(seqs[slot]))
                runner.truncate(slot, keep)
                del seqs[slot][keep:]
        batch = rng.sample(list(seqs), rng.randint(1, len(seqs)))
        new = {}
        for slot in batch:
            room = runner.max_model_len - len(seqs[slot])
            n = rng.randint(6, 12) if not seqs[slot] else rng.choice([1, 1, 2, 5])
            if room >= 1:
                new[slot] = tokens(min(n, room))
        if not new:
            continue
        needed = sum(len(t) for t in new.values())
        if needed > runner.num_free_tokens:
            with pytest.raises(KVCacheFull):
                runner.forward(list(new), list(new.values()))
            victim = max(seqs, key=lambda s: len(seqs[s]))
            runner.free_slot(victim)
            del seqs[victim]
            continue
        argmaxes += check_step(runner, model, seqs, new)
        assert runner.num_cached_tokens == sum(len(s) for s in seqs.values())
    return argmaxes


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_random_interleavings_match_full_forward(family):
    model = tiny_model(family, vocab_size=96, seed=1)
    runner = ModelRunner(model, max_num_seqs=4, max_num_tokens=96, max_model_len=40)
    random_schedule(runner, model, seed=11, num_steps=30, vocab_size=96)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_graph_bucket_layout_matches_full_forward(family):
    """Steps of <= 3 new tokens run in their CUDA-graph bucket's padded layout (batch rounded
    up with scratch sequences, key length rounded up), here eagerly: logits stay exact."""
    from engine.runner.cuda_graphs import CudaGraphs

    model = tiny_model(family, vocab_size=96, seed=4)
    runner = ModelRunner(model, max_num_seqs=5, max_num_tokens=160, max_model_len=40)
    runner.use_graph_buckets(3, capture=False)
    assert random_schedule(runner, model, seed=14, num_steps=30, vocab_size=96) >= 3
    assert runner.graphs.num_replays > 10
    # each width has its own bucket (nothing captured here, so no wider twin stands in); the
    # key length rounds up to 128, capped at the slot table's max_model_len + 1 = 41 columns
    assert runner.graphs.bucket(3, 2, 20) == (4, 2, 41)
    assert runner.graphs.bucket(3, 1, 20) == (4, 1, 41)
    # more tokens than max_num_new: a prefill bucket (a power of two, at least 16), up to
    # PREFILL_MAX_BATCH sequences of PREFILL_MAX_TOKENS padded tokens
    assert runner.graphs.bucket(3, 4, 20) == (4, 16, 41)
    assert runner.graphs.bucket(1, 17, 20) == (1, 32, 41)
    graphs = CudaGraphs(None, None, 32, 3, 2000, torch.device("cpu"), capture=False)
    assert graphs.bucket(8, 100, 300) == (8, 128, 384)
    assert graphs.bucket(9, 100, 300) is None  # (more than 8 sequences)
    assert graphs.bucket(2, 600, 700) is None  # (more than 1024 padded tokens)


def _aliased_capture(self, batch_size: int, num_new: int, kv_len: int):
    """:func:`_eager_capture` whose replay then spoils every other captured graph's static
    output (NaN, or -1 for integers), as a graph sharing the memory pool may: its scratch can
    lie where another graph's output does."""
    graph = _eager_capture(self, batch_size, num_new, kv_len)
    run = graph.graph.replay
    others = self.__dict__.setdefault("_aliased", [])

    def replay() -> None:
        run()
        for output in others:
            if output is not graph.output:
                for t in output:
                    if t is not None:
                        t.fill_(float("nan") if t.is_floating_point() else -1)

    graph.graph.replay = replay
    others.append(graph.output)
    return graph


@pytest.mark.parametrize("graphs", ["none", "layout", "aliased"])
def test_mixed_steps_split_in_two_forwards_stay_exact(monkeypatch, graphs):
    """A step of decoding and prefilling sequences runs as two forwards (the decodes padded
    only among themselves); the logits, in the step's row order, are a full forward's. With
    graphs (their bucket layouts run eagerly; ``aliased``: captured, each replay spoiling the
    other graphs' static outputs) the first forward's logits outlive the second's replay."""
    from engine.runner.cuda_graphs import CudaGraphs

    monkeypatch.setattr(step_layout, "SPLIT_MIN_SAVED", 1)
    monkeypatch.setattr(step_layout, "SPLIT_SHORT", 5)  # (the schedule's prompts: 6-12 tokens)
    splits = spy_on_splits(monkeypatch)
    model = tiny_model("llama", vocab_size=96, seed=4)
    runner = ModelRunner(model, max_num_seqs=5, max_num_tokens=200, max_model_len=40)
    if graphs != "none":
        monkeypatch.setattr(CudaGraphs, "_capture", _aliased_capture)
        monkeypatch.setattr(CudaGraphs, "_time_replays", lambda self, graph: 1e-3)
        runner.use_graph_buckets(5, capture=graphs == "aliased")
        runner.fold_mixed = False  # (else such steps fold: the test below)
    random_schedule(runner, model, seed=21, num_steps=40, vocab_size=96)
    assert len(splits) >= 3 and all(short and long for short, long in splits)
    if graphs == "aliased":
        assert runner.graphs.num_graphs >= 2 and len(runner.graphs._aliased) >= 2


def spy_on_splits(monkeypatch) -> list[tuple[list[int], list[int]]]:
    """The groups of every step the runners split, as they come."""
    splits = []
    forward_split = ModelRunner._forward_split
    monkeypatch.setattr(ModelRunner, "_forward_split", lambda self, plan, *a: (
        splits.append(plan.groups), forward_split(self, plan, *a))[1])
    return splits


def mixed_prompts() -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(96) for _ in range(n)] for n in (5, 7, 30, 3)]


def mixed_step(runner) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Two sequences decode, then one step of a 2-token verification, a 30-token prompt, a
    decode and a 3-token prompt, its rows asked in no order (one twice): the logits, every new
    token's features, and each slot's length after it."""
    prompts = mixed_prompts()
    slots = [runner.allocate_slot() for _ in range(4)]
    runner.forward(slots[:2], prompts[:2])
    runner.forward(slots[:2], [[1], [2]])
    step = [[4, 5], prompts[2], [6], prompts[3]]
    asked = [33, 0, 2, 35, 34, 1, 10, 33]
    out = runner.forward([slots[0], slots[2], slots[1], slots[3]], step, asked, keep_hidden=True)
    return out.logits, out.hidden.clone(), [runner.seq_len(s) for s in slots]


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
def test_mixed_steps_fold_into_one_bucket_stay_exact(monkeypatch, family):
    """With graph buckets, a step of decoding and prefilling sequences runs as one forward, each
    prompt chunk cut into rows of the step's width on its slot (here the buckets' padded layout,
    eagerly); every row's logits stay a full forward's, and no step is split."""
    folds, splits = [], spy_on_splits(monkeypatch)
    cut_rows = step_layout.cut_rows
    monkeypatch.setattr(model_runner, "cut_rows", lambda width, *a: (
        folds.append((width, [len(t) for t in a[1]])), cut_rows(width, *a))[1])
    model = tiny_model(family, vocab_size=96, seed=4)
    runner = ModelRunner(model, max_num_seqs=5, max_num_tokens=200, max_model_len=40)
    runner.use_graph_buckets(5, capture=False)
    random_schedule(runner, model, seed=21, num_steps=40, vocab_size=96)
    assert len(folds) >= 3 and not splits
    # each fold: a width from the longest short row up to 5, and a prompt chunk cut in rows
    assert all(max(n for n in lens if n <= 5) <= width <= 5 and max(lens) > 5
               for width, lens in folds)
    assert any(width < 5 for width, _ in folds)


def test_the_runner_lays_out_steps_within_its_own_limits():
    """The planner gets the runner's limits: no graphs, nothing folded; with graph buckets
    their widths, key length and captured graphs (the fold's cases themselves:
    tests/engine/runner/test_step_layout.py)."""
    model = tiny_model("llama", vocab_size=96, seed=4)
    runner = ModelRunner(model, max_num_seqs=4, max_num_tokens=400, max_model_len=2000)
    lens, trees = [1, 1, 1, 40], [None] * 4
    assert step_layout.fold_width(lens, trees, 60, runner._limits()) is None  # (no graphs)
    runner.use_graph_buckets(5, capture=False)
    limits = runner._limits()
    assert (limits.max_num_new, limits.max_kv_len, runner.fold_rows) == (5, 2001, 64)
    assert step_layout.fold_width(lens, trees, 60, limits) == 2
    # a width whose bucket a captured graph serves comes first: with (16, 5, 128) captured,
    # 4 tokens a row (13 rows: covered) rather than 2 (24 rows: no graph, eager first)
    runner.graphs._graphs[(16, 5, 128)] = None  # (stands for a captured graph)
    runner.graphs._covers.clear()
    assert step_layout.fold_width(lens, trees, 60, runner._limits()) == 4
    runner.fold_mixed = runner.split_mixed = runner.pack_verifications = False
    assert not any((runner._limits().fold, runner._limits().split, runner._limits().pack))


def test_packed_rows_rule():
    """A verification step of unequal rows is packed (one token a row) with graph buckets only,
    at PACK_MIN_BATCH sequences or more whose drafts add at most PACK_MAX_EXTRA rows a
    sequence, within fold_rows; never equal rows, decodes, prompt chunks or a runner that
    packs nothing."""
    model = tiny_model("llama", vocab_size=96, seed=4)
    runner = ModelRunner(model, max_num_seqs=128, max_num_tokens=4000, max_model_len=100)
    assert runner.packed_rows(128, 5, 132) is None  # (no graphs)
    runner.use_graph_buckets(5, capture=False)
    assert runner.fold_rows == 256
    # 128 sequences, one verifying 4 drafts: 132 rows against 128 rows of 5 tokens
    assert runner.packed_rows(128, 5, 132) == 132
    assert runner.packed_rows(128, 5, 128 + 16) == 144  # (an eighth more rows)
    assert runner.packed_rows(128, 5, 128 + 17) is None
    assert runner.packed_rows(64, 5, 72) == 72
    assert runner.packed_rows(32, 5, 36) is None  # (fewer than 64 sequences: padded)
    assert runner.packed_rows(128, 5, 128 * 5) is None  # (equal rows)
    assert runner.packed_rows(128, 1, 128) is None  # (decodes)
    assert runner.packed_rows(128, 6, 133) is None  # (a row past max_num_new: a prompt chunk)
    small = ModelRunner(model, max_num_seqs=64, max_num_tokens=4000, max_model_len=100)
    small.use_graph_buckets(5, capture=False)
    assert small.fold_rows == 128 and small.packed_rows(64, 5, 72) == 72
    runner.pack_verifications = False
    assert runner.packed_rows(128, 5, 132) is None


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_packed_verifications_stay_exact(monkeypatch, family):
    """Packed steps (one token a row on its slot, here the buckets' padded layout, eagerly)
    give every row the logits of a full forward and the same hidden states and lengths as an
    unpacked runner; a step with a draft tree is never packed."""
    monkeypatch.setattr(step_layout, "PACK_MIN_BATCH", 1)  # (packed at any size)
    monkeypatch.setattr(step_layout, "PACK_MAX_EXTRA", 100)
    model = tiny_model(family, vocab_size=96, seed=5)
    runners = [ModelRunner(model, max_num_seqs=6, max_num_tokens=400, max_model_len=60)
               for _ in range(2)]
    for runner in runners:
        runner.use_graph_buckets(5, capture=False)
    runners[1].pack_verifications = False
    rng = random.Random(8)
    slots = [runners[0].allocate_slot() for _ in range(5)]
    assert [runners[1].allocate_slot() for _ in range(5)] == slots
    seqs = {slot: [rng.randrange(96) for _ in range(rng.randint(3, 9))] for slot in slots}
    for runner in runners:
        for slot in slots:
            runner.forward([slot], [seqs[slot]])
    packed = 0
    for _ in range(6):
        new = {slot: [rng.randrange(96) for _ in range(rng.choice([1, 1, 2, 5]))]
               for slot in slots}
        new[slots[0]] = [rng.randrange(96)]  # (one decode at least: rows stay unequal)
        new[slots[1]] = [rng.randrange(96) for _ in range(4)]
        steps = [runner.forward(slots, [new[s] for s in slots], keep_hidden=True)
                 for runner in runners]
        packed += steps[0].packed_rows is not None
        assert steps[0].packed_rows == sum(map(len, new.values()))
        assert steps[1].packed_rows is None
        outs = [(step.logits, step.hidden) for step in steps]
        torch.testing.assert_close(outs[0][0], outs[1][0], atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(outs[0][1], outs[1][1], atol=ATOL, rtol=ATOL)
        row = 0
        for slot in slots:
            start = len(seqs[slot])
            seqs[slot] += new[slot]
            n = len(new[slot])
            expected = full_logits(model, seqs[slot])[start:start + n]
            torch.testing.assert_close(outs[0][0][row:row + n], expected, atol=ATOL, rtol=ATOL)
            row += n
            assert runners[0].seq_len(slot) == runners[1].seq_len(slot) == len(seqs[slot])
        for runner in runners:  # (a verification keeps an accepted prefix: roll back some)
            for slot in slots[1:3]:
                runner.truncate(slot, len(seqs[slot]) - 2)
        for slot in slots[1:3]:
            del seqs[slot][-2:]
    assert packed == 6
    # a draft tree's step keeps its row: not packed
    out = runners[0].forward(slots[:2], [[1], [2, 3, 4]], trees=[None, (1, [-1, -1])])
    assert out.packed_rows is None


def test_a_folded_step_keeps_the_asked_rows_order_and_the_features():
    """Folded and unfolded runners give the same logits for rows asked in any order, and the
    same hidden states (every new token's features, step order)."""
    model = tiny_model("llama", vocab_size=96, seed=6)
    runners = [ModelRunner(model, max_num_seqs=5, max_num_tokens=200, max_model_len=60)
               for _ in range(2)]
    for runner in runners:
        runner.use_graph_buckets(5, capture=False)
    runners[1].fold_mixed = runners[1].split_mixed = False
    outs = [mixed_step(runner) for runner in runners]
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=ATOL, rtol=ATOL)
    assert outs[0][1].shape[0] == 2 + 30 + 1 + 3 and outs[0][2] == outs[1][2] == [8, 9, 30, 3]
    # the first runner folded the step: the 3-token prompt sets the width, 3 + 30 / 3 = 13 rows
    assert runners[0].graphs.num_replays == 3 and runners[0].graphs.decision[0][:2] == (16, 3)


def test_a_split_step_keeps_the_asked_rows_order_and_the_features(monkeypatch):
    """Split and unsplit runners give the same logits for rows asked in any order, and the same
    hidden states (every new token's features, step order)."""
    splits = spy_on_splits(monkeypatch)
    model = tiny_model("llama", vocab_size=96, seed=6)
    runners = [ModelRunner(model, max_num_seqs=5, max_num_tokens=200, max_model_len=60)
               for _ in range(2)]
    runners[1].split_mixed = False
    monkeypatch.setattr(step_layout, "SPLIT_MIN_SAVED", 1)
    outs = [mixed_step(runner) for runner in runners]
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=ATOL, rtol=ATOL)
    assert outs[0][1].shape[0] == 2 + 30 + 1 + 3
    assert splits == [([0, 2, 3], [1])]  # the first runner split the step, the second did not
    # only short rows asked (the prompt's forward gives no logits): the same rows
    for runner in runners:
        slot = runner.allocate_slot()
        outs.append(runner.forward([0, slot], [[8], mixed_prompts()[2]], [0]).logits)
    torch.testing.assert_close(outs[-2], outs[-1], atol=ATOL, rtol=ATOL)
    assert outs[-1].shape == (1, 96) and len(splits) == 2


class _EagerGraph:
    """Stands in for ``torch.cuda.CUDAGraph`` off-GPU: a replay runs the captured body."""

    def __init__(self, run) -> None:
        self.replay = run


def _eager_capture(self, batch_size: int, num_new: int, kv_len: int):
    """``CudaGraphs._capture`` without CUDA: the same static inputs and output, filled eagerly."""
    from engine.runner.cuda_graphs import _Graph

    inputs = torch.tensor(self._scratch_inputs(batch_size, num_new), dtype=torch.long)
    output = [None if t is None else t.clone()
              for t in self._body(inputs, batch_size, num_new, kv_len)]

    def run() -> None:
        for static, t in zip(output, self._body(inputs, batch_size, num_new, kv_len),
                             strict=True):
            if static is not None:
                static.copy_(t)
    return _Graph(_EagerGraph(run), inputs, output)


def test_a_covered_bucket_is_captured_once_its_padding_has_cost_a_capture(monkeypatch):
    """Graph bookkeeping, with captures that run eagerly and set costs: a capture costs 2.5 ms
    and a graph of ``b`` sequences replays in ``b * (1 + 0.01 * (num_new - 1))`` ms. A bucket
    that a captured one covers replays it padded (steady: what its width costs until then)
    until the padding has cost a capture: batch 1 padded to batch 2 (2 ms a step, no graph
    inside it) is captured at its second step; 2 tokens padded to the 3-token twin at its third
    (1.02 ms a step: the batch-1 decode graph inside it runs the output head too, so its replay
    bounds nothing). Every step's logits stay those of a full forward."""
    from engine.runner.cuda_graphs import CudaGraphs

    monkeypatch.setattr(CudaGraphs, "_capture", _eager_capture)
    captured = []

    def replay_seconds(self, graph):
        key = next(k for k, g in self._graphs.items() if g is graph)
        captured.append(key)
        batch_size, num_new, _ = key
        return batch_size * (1 + 0.01 * (num_new - 1)) / 1e3

    monkeypatch.setattr(CudaGraphs, "_time_replays", replay_seconds)
    monkeypatch.setattr(CudaGraphs, "capture_cost", lambda self, prefill=False: 2.5e-3)
    model = tiny_model("llama", vocab_size=96, seed=4)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=96, max_model_len=40)
    runner.use_graph_buckets(3, capture=True)
    prompts = {runner.allocate_slot(): [3, 4, 5, 6], runner.allocate_slot(): [9, 8, 7]}
    for slot, prompt in prompts.items():
        runner.forward([slot], [prompt])  # prefills: eager
    steady, graphs = [], []
    first = next(iter(prompts))
    both = {slot: [7] for slot in prompts}
    steps = [both] * 3 + [{first: [7]}] * 4 + [{first: [7, 8]}] * 4 + [{first: [7, 8, 9]}]
    for new in steps:
        out = runner.forward(list(new), list(new.values()))
        expected = torch.cat([full_logits(model, prompts[slot] + ids)[len(prompts[slot]):]
                              for slot, ids in new.items()])
        torch.testing.assert_close(out.logits, expected, rtol=0, atol=ATOL)
        steady.append(out.steady)
        graphs.append(runner.graphs.num_graphs)
        for slot in new:
            runner.truncate(slot, len(prompts[slot]))
    # batch 2 decode: eager, captured (with its 3-token twin), replayed; batch 1 decode: padded
    # in the batch-2 graph once (2 ms paid), captured at the second (4 ms >= 2.5; with its
    # twin), replayed; 2 tokens: padded in the batch-1 twin (1.02 ms a step), captured at the
    # third (3.06 ms >= 2.5), replayed; 3 tokens: the twin, replayed
    # (eager first steps and captures are not steady; replays are, padded or not)
    assert steady == [False, False, True] + [True, False, True, True] + [True, True, False,
                                                                          True] + [True]
    assert graphs == [0, 2, 2] + [2, 4, 4, 4] + [4, 4, 5, 5] + [5]
    kv = captured[0][2]
    assert captured == [(2, 1, kv), (2, 3, kv), (1, 1, kv), (1, 3, kv), (1, 2, kv)]


def test_the_padding_bound_and_the_capture_cost_are_the_measured_ones():
    """A covered step's padding is bounded by the cover's replay less the slowest captured
    graph inside the bucket (none: the whole replay), a decode graph (whose body also runs the
    output head) only inside a decode bucket; the capture cost is the captures' mean."""
    from engine.runner.cuda_graphs import CudaGraphs

    graphs = CudaGraphs(None, None, 8, 3, 256, torch.device("cpu"))
    graphs._replay_s = {(8, 3, 256): 5e-3, (2, 2, 128): 1e-3, (4, 2, 256): 3e-3,
                        (8, 2, 128): 4e-3, (4, 1, 256): 4.5e-3, (8, 1, 512): 6e-3,
                        (2, 1, 128): 0.5e-3}
    assert graphs._padding((4, 3, 256), (8, 3, 256)) == pytest.approx(2e-3)  # (4, 2, 256)
    assert graphs._padding((8, 2, 128), (8, 3, 256)) == pytest.approx(1e-3)  # (8, 2, 128)
    assert graphs._padding((1, 2, 256), (8, 3, 256)) == pytest.approx(5e-3)  # nothing inside
    assert graphs._padding((4, 1, 256), (8, 1, 512)) == pytest.approx(1.5e-3)  # (4, 1, 256)
    assert graphs.capture_cost() == 0.0
    graphs.capture_seconds, graphs._num_captures = 0.12, 2  # (two captures: 0.05 and 0.07 s)
    assert graphs.capture_cost() == pytest.approx(0.06)


def test_a_decode_step_is_covered_only_by_a_decode_graph():
    from engine.runner.cuda_graphs import CudaGraphs

    graphs = CudaGraphs(None, None, 8, 3, 41, torch.device("cpu"))
    graphs._graphs = dict.fromkeys([(8, 3, 41), (4, 1, 41), (8, 2, 41)])
    assert graphs._cover((2, 1, 41)) == (4, 1, 41)
    assert graphs._cover((8, 1, 41)) is None  # never padded to a verification graph
    assert graphs._cover((2, 2, 41)) == (8, 2, 41)  # the fewest padded tokens
    assert graphs._cover((2, 3, 41)) == (8, 3, 41)
    assert graphs._cover((16, 2, 41)) is None


def test_prefill_buckets_cover_only_each_other_and_price_their_captures_apart(monkeypatch):
    from engine.runner.cuda_graphs import CudaGraphs

    graphs = CudaGraphs(None, None, 8, 3, 8192, torch.device("cpu"))
    graphs._graphs = dict.fromkeys([(8, 3, 256), (1, 16, 256), (2, 64, 256)])
    assert graphs._cover((1, 2, 128)) == (8, 3, 256)  # never a prefill graph
    assert graphs._cover((1, 32, 128)) == (2, 64, 256)  # never a verification graph
    assert graphs._cover((1, 16, 200)) == (1, 16, 256)
    assert graphs._cover((4, 16, 128)) is None
    # rounded to a quarter of the next power of two (at least 16); mask cells capped
    assert [graphs.bucket(1, n, 100)[1] for n in (4, 17, 40, 100, 300)] == [16, 32, 48, 128, 384]
    assert graphs.bucket(1, 1000, 5000) is None  # (1024 tokens * 5120 keys: too many cells)
    graphs.capture_seconds, graphs._num_captures = 0.5, 3
    graphs._prefill_captures = (0.4, 1)  # one prefill capture of 0.4 s, two others of 0.05
    assert graphs.capture_cost() == pytest.approx(0.05)
    assert graphs.capture_cost(prefill=True) == pytest.approx(0.4)
    # without room for one more graph, a prefill bucket runs eager instead of being captured
    monkeypatch.setattr(CudaGraphs, "_room_for_another", lambda self: False)
    assert graphs.bucket(4, 20, 100) == (4, 32, 128)  # (its first step: eager in its bucket)
    assert graphs.bucket(4, 20, 100) is None  # (the second: eager, unbucketed, no capture)


def test_a_decode_captures_the_twin_its_batch_can_use(monkeypatch):
    """With draft trees a batch's widest step narrows with the batch (the runner's
    ``twin_width``): a decode bucket's capture brings that twin, not the widest of all."""
    from engine.runner.cuda_graphs import CudaGraphs

    monkeypatch.setattr(CudaGraphs, "_capture", _eager_capture)
    model = tiny_model("llama", vocab_size=96, seed=1)
    runner = ModelRunner(model, max_num_seqs=8, max_num_tokens=200, max_model_len=40,
                         twin_width=lambda batch_size: 1 + max(4, 16 // batch_size))
    runner.use_graph_buckets(9)
    slots = [runner.allocate_slot() for _ in range(4)]
    runner.forward(slots, [[1, 2, 3]] * 4)
    for _ in range(2):  # met, then captured with its twin
        runner.forward(slots, [[5]] * 4)
    assert set(runner.graphs._graphs) == {(4, 1, 41), (4, 5, 41)}  # (not (4, 9, 41))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("split", [False, True])
def test_cuda_graphs_match_full_forward(family, split, monkeypatch):
    """Decode, verification and prefill steps replay captured CUDA graphs and stay exact
    (float32), with mixed steps split in two forwards or not."""
    if split:
        monkeypatch.setattr(step_layout, "SPLIT_MIN_SAVED", 1)
    model = tiny_model(family, vocab_size=96, seed=5).cuda()
    runner = ModelRunner(model, max_num_seqs=5, max_num_tokens=400, max_model_len=300,
                         cuda_graph_max_new=4)
    assert runner.graphs is not None
    assert random_schedule(runner, model, seed=15, num_steps=40, vocab_size=96) >= 3
    assert runner.graphs.num_graphs > 0 and runner.graphs.num_replays > 10
    assert any(num_new > 4 for _, num_new, _ in runner.graphs._graphs)  # a prefill graph


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_eager_attention_matches_full_forward(family):
    model = tiny_model(family, seed=2, attn_implementation="eager")
    runner = ModelRunner(model, max_num_seqs=3, max_num_tokens=80, max_model_len=32)
    random_schedule(runner, model, seed=12, num_steps=12, vocab_size=128)


def test_kv_cache_full_changes_nothing():
    model = tiny_model("llama", seed=3)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=10, max_model_len=16)
    a, b = runner.allocate_slot(), runner.allocate_slot()
    seqs = {a: [], b: []}
    check_step(runner, model, seqs, {a: [5, 6, 7, 8, 9, 10], b: [1, 2]})
    with pytest.raises(KVCacheFull) as info:
        runner.forward([a, b], [[11, 12], [3, 4, 5]])
    assert (info.value.tokens_needed, info.value.tokens_free) == (5, 2)
    assert (runner.seq_len(a), runner.seq_len(b), runner.num_free_tokens) == (6, 2, 2)
    runner.truncate(a, 3)  # rollback frees three tokens: the same step now fits
    del seqs[a][3:]
    check_step(runner, model, seqs, {a: [11, 12], b: [3, 4, 5]})
    assert runner.num_free_tokens == 0


def test_freed_slots_are_reused_without_stale_state():
    model = tiny_model("qwen2", seed=4)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20)
    a, b = runner.allocate_slot(), runner.allocate_slot()
    seqs = {a: [], b: []}
    check_step(runner, model, seqs, {a: list(range(3, 15)), b: list(range(40, 50))})
    with pytest.raises(RuntimeError, match="slots are in use"):
        runner.allocate_slot()
    runner.free_slot(a)
    assert runner.num_cached_tokens == 10
    c = runner.allocate_slot()
    assert c == a and runner.seq_len(c) == 0
    seqs[c] = []
    check_step(runner, model, seqs, {c: [7, 8, 9], b: [1]})


def test_logits_indices_select_rows():
    model = tiny_model("gpt2", seed=5)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20)
    a, b = runner.allocate_slot(), runner.allocate_slot()
    runner.forward([a, b], [[1, 2, 3, 4], [5, 6]])
    seq_a, seq_b = [1, 2, 3, 4, 9, 8], [5, 6, 7]
    out = runner.forward([a, b], [[9, 8], [7]], logits_indices=[1, 2]).logits
    expected = torch.stack([full_logits(model, seq_a)[-1], full_logits(model, seq_b)[-1]])
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=ATOL)
    runner.truncate(a, 4)
    runner.truncate(b, 2)
    out = runner.forward([a, b], [[9, 8], [7]], logits_indices=torch.tensor([2])).logits
    torch.testing.assert_close(out, expected[1:], atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("indices", [[2, 0], torch.tensor([1])], ids=["host", "device"])
def test_a_decode_graphs_head_gives_the_rows_asked_for(indices, monkeypatch):
    """A decode bucket's graph runs the head and the argmax on every row: the rows asked for,
    in their order, are the oracle's logits, and the argmax is theirs; so does a verification
    bucket of a few rows (every new token's), and one whose logits are past
    ``HEAD_GRAPH_LOGITS`` brings no argmax."""
    model = tiny_model("llama", vocab_size=96, seed=7)
    runner = ModelRunner(model, max_num_seqs=4, max_num_tokens=90, max_model_len=30)
    runner.use_graph_buckets(3, capture=False)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    slots = [runner.allocate_slot() for _ in prompts]
    runner.forward(slots, prompts)
    step = runner.forward(slots, [[10], [11], [12]], logits_indices=indices)
    rows = indices.tolist() if isinstance(indices, torch.Tensor) else indices
    expected = torch.stack([full_logits(model, prompts[r] + [10 + r])[-1] for r in rows])
    torch.testing.assert_close(step.logits, expected, atol=ATOL, rtol=ATOL)
    assert torch.equal(step.argmax, expected.argmax(dim=-1))
    verify = runner.forward(slots, [[1, 2]] * 3)
    assert torch.equal(verify.argmax, verify.logits.argmax(dim=-1))
    assert verify.argmax.tolist() == [
        int(full_logits(model, prompts[r] + [10 + r, 1, 2])[-2 + t].argmax())
        for r in range(3) for t in range(2)]
    monkeypatch.setattr(executor_module, "HEAD_GRAPH_LOGITS", 5 * 96)  # (3 rows of 2: past it)
    runner = ModelRunner(model, max_num_seqs=4, max_num_tokens=90, max_model_len=30)
    runner.use_graph_buckets(3, capture=False)
    slots = [runner.allocate_slot() for _ in prompts]
    runner.forward(slots, prompts)
    assert runner.forward(slots, [[1, 2]] * 3).argmax is None


def test_forward_output_carries_the_step_facts():
    """A forward returns its logits with the step's facts: every new token's final hidden
    states only when asked for (the model's own, step order), steady (no graphs: always), not
    packed, and the longest sequence's tokens as its context."""
    model = tiny_model("llama", seed=5)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=20)
    a, b = runner.allocate_slot(), runner.allocate_slot()
    out = runner.forward([a, b], [[1, 2, 3, 4], [5, 6]])
    assert isinstance(out, ForwardOutput) and out.hidden is None
    assert (out.steady, out.packed_rows, out.kv_len) == (True, None, 4)
    out = runner.forward([a, b], [[9, 8], [7]], logits_indices=[2], keep_hidden=True)
    assert out.logits.shape == (1, runner.vocab_size) and out.kv_len == 6
    with torch.no_grad():
        full = [model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0]
                for ids in ([1, 2, 3, 4, 9, 8], [5, 6, 7])]  # each [len, hidden_size]
    torch.testing.assert_close(out.hidden, torch.cat([full[0][4:], full[1][2:]]), atol=ATOL,
                               rtol=ATOL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.steady = False


def truncated_copy(model: nn.Module, num_layers: int) -> nn.Module:
    """The early-exit self-draft: a shallow copy whose decoder runs the first num_layers layers,
    sharing the target's weights. (copy.copy of an nn.Module shares its _modules dict, so each
    copy gets its own before a submodule is replaced; otherwise the target would change too.)"""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner.layers = nn.ModuleList(list(model.model.layers)[:num_layers])
    inner.config = config
    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    draft.model = inner
    draft.config = config
    return draft


def test_truncated_model_shares_weights_and_stays_exact():
    model = tiny_model("llama", seed=6, num_layers=3)
    draft = truncated_copy(model, 1)
    shared = draft.model.layers[0].self_attn.q_proj.weight
    assert shared is model.model.layers[0].self_attn.q_proj.weight
    assert len(model.model.layers) == model.config.num_hidden_layers == 3
    target_runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=64, max_model_len=24)
    draft_runner = ModelRunner(draft, max_num_seqs=2, max_num_tokens=64, max_model_len=24)
    assert len(draft_runner.cache.pools) == 1 and len(target_runner.cache.pools) == 3
    assert draft_runner.kv_bytes_per_token * 3 == target_runner.kv_bytes_per_token
    for runner, m in ((draft_runner, draft), (target_runner, model)):
        random_schedule(runner, m, seed=13, num_steps=8, vocab_size=128)
    # the draft really is shallower: its logits differ from the target's
    assert not torch.allclose(full_logits(draft, [1, 2, 3]), full_logits(model, [1, 2, 3]))


def test_memory_tracks_tokens_kept():
    model = tiny_model("llama", seed=7)
    runner = ModelRunner(model, max_num_seqs=1, max_num_tokens=50, max_model_len=50)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    # keys + values, every layer, float32
    assert runner.kv_bytes_per_token == 2 * 2 * config.num_key_value_heads * head_dim * 4
    slot = runner.allocate_slot()
    runner.forward([slot], [list(range(10))])
    for _ in range(8):  # verify 4 drafts + bonus, accept 1 each time
        kept = runner.seq_len(slot) + 1
        runner.forward([slot], [[1, 2, 3, 4, 5]])
        runner.truncate(slot, kept)
    assert runner.num_cached_tokens == runner.seq_len(slot) == 18


def test_bad_calls_raise_value_error_before_any_change():
    model = tiny_model("llama", seed=8)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=40, max_model_len=8)
    a = runner.allocate_slot()
    bad_calls = [
        ([a, a], [[1], [2]], "distinct"),
        ([a], [[1] * 9], "max_model_len"),
        ([a], [[]], "max_model_len"),
        ([a], [[128]], "token ids"),
        ([5], [[1]], "not allocated"),
        ([a], [[1], [2]], "one length"),
    ]
    for slots, ids, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            runner.forward(slots, ids)
    with pytest.raises(ValueError, match="logits_indices"):
        runner.forward([a], [[1, 2]], logits_indices=[2])
    with pytest.raises(ValueError, match="length"):
        runner.truncate(a, 1)
    assert runner.seq_len(a) == 0 and runner.num_free_tokens == 40
    with pytest.raises(ValueError, match="max_num_tokens"):
        ModelRunner(model, max_num_seqs=1, max_num_tokens=0, max_model_len=8)


def test_windows_and_position_tables_bound_max_model_len():
    windowed = tiny_model("mistral", seed=9, sliding_window=16)
    with pytest.raises(ValueError, match="sliding-window"):
        ModelRunner(windowed, max_num_seqs=1, max_num_tokens=40, max_model_len=17)
    runner = ModelRunner(windowed, max_num_seqs=1, max_num_tokens=40, max_model_len=16)
    random_schedule(runner, windowed, seed=14, num_steps=6, vocab_size=128)
    with pytest.raises(ValueError, match="n_positions=256"):
        ModelRunner(tiny_model("gpt2"), max_num_seqs=1, max_num_tokens=8, max_model_len=257)


@pytest.mark.parametrize("family,attn", [("llama", "sdpa"), ("gpt2", "sdpa"), ("qwen2", "sdpa"),
                                         ("llama", "eager")])
def test_unmasked_and_view_paths_match_full_forward(family, attn):
    """Uniform steps (no runner mask) and a lone sequence on an ascending run of pool rows (read
    as a view), through rollbacks; then the same sequence once its rows interleave."""
    model = tiny_model(family, seed=10, attn_implementation=attn)
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=64, max_model_len=30)
    rng = random.Random(15)
    a = runner.allocate_slot()
    seqs = {a: []}
    check_step(runner, model, seqs, {a: [rng.randrange(128) for _ in range(7)]})
    for _ in range(3):  # verify 5, keep a random prefix, decode 1: all on the view path
        kept = runner.seq_len(a) + rng.randint(1, 5)
        check_step(runner, model, seqs, {a: [rng.randrange(128) for _ in range(5)]})
        assert runner.cache._run is not None
        runner.truncate(a, kept)
        del seqs[a][kept:]
        check_step(runner, model, seqs, {a: [rng.randrange(128)]})
        assert runner.cache._run is not None
    b = runner.allocate_slot()
    seqs[b] = []
    check_step(runner, model, seqs, {b: [rng.randrange(128) for _ in range(len(seqs[a]))]})
    for n in (5, 1):  # two sequences of one length: uniform steps through the gather
        check_step(runner, model, seqs, {s: [rng.randrange(128) for _ in range(n)] for s in seqs})
    check_step(runner, model, seqs, {a: [rng.randrange(128) for _ in range(3)]})
    assert runner.cache._run is None  # a's rows now interleave with b's


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="the flag matters on CUDA"))])
@pytest.mark.parametrize("cudnn_before", [True, False])
def test_forwards_run_without_cudnn_attention(cudnn_before, device):
    """cuDNN SDPA builds a plan per new key length (tens of ms each on Hopper): every CUDA
    forward runs with it off, and the caller's setting is restored afterwards; a CPU forward
    leaves the process-wide flag alone."""
    model = tiny_model("llama", seed=3).to(device)
    seen = []
    hook = model.base_model.register_forward_pre_hook(
        lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=32, max_model_len=16)
    slots = [runner.allocate_slot(), runner.allocate_slot()]
    torch.backends.cuda.enable_cudnn_sdp(cudnn_before)
    try:
        runner.forward(slots, [[1, 2, 3], [4, 5]])  # a masked (non-uniform) step
        runner.forward(slots, [[6], [7]])
        after = torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        hook.remove()
        torch.backends.cuda.enable_cudnn_sdp(True)
    assert seen == ([False, False] if device == "cuda" else [cudnn_before, cudnn_before])
    assert after is cudnn_before
