"""One forward's index layout on hand-built steps: chains, a draft tree, padding to a bucket.
No model."""

from __future__ import annotations

import random

import numpy as np
import torch

from engine.runner.chain_layout import write_chains_reference
from engine.runner.step_inputs import (
    LAYOUT_ROWS,
    Scratch,
    StepInputs,
    _lay_out_rows,
    lay_out,
    lay_out_chains,
    scratch_inputs,
    tree_columns,
)

# scratch slot 2, scratch pool row 9, a slot table 8 columns wide (scratch column 7)
SCRATCH = Scratch(slot=2, row=9, table_width=8)


def test_a_padding_only_layout_writes_the_scratch_row_through_the_scratch_cell():
    assert SCRATCH.column == 7
    # ids, positions, pool rows, cells, limits, ancestors (2 x 1 tokens each), then the slots
    assert scratch_inputs(SCRATCH, 2, 1) == [0, 0, 0, 0, 9, 9, 23, 23, 0, 0, 0, 0, 2, 2]


def test_chains_padded_to_a_bucket():
    """Slot 0 decodes one token after 2 cached ones, slot 1 prefills two; padded to a bucket of
    3 rows x 2 tokens (a padding token repeats its row's last position and limit, and writes the
    scratch row through its own slot's scratch column; the padding row is the scratch slot)."""
    got = lay_out([0, 1], [[7], [3, 4]], [2, 0], [[5], [0, 1]], [None, None], 3, 2, SCRATCH)
    assert got == StepInputs(
        host=[7, 0, 3, 4, 0, 0,  # input ids
              2, 2, 0, 1, 0, 0,  # positions
              5, 9, 0, 1, 9, 9,  # pool rows
              2, 7, 8, 9, 23, 23,  # slot-table cells
              2, 2, 0, 1, 0, 0,  # mask limits
              0, 0, 0, 0, 0, 0,  # ancestor bits
              0, 1, 2],  # slots
        token_rows=[0, 2, 3], batch_size=3, num_new=2)
    assert len(got.host) == LAYOUT_ROWS * 3 * 2 + 3


def test_a_decode_step_padded_to_a_bucket():
    """Slots 3 and 0 decode one token each after 4 and 2 cached ones; padded to 4 rows."""
    got = lay_out([3, 0], [[7], [8]], [4, 2], [[11], [5]], [None, None], 4, 1, SCRATCH)
    assert got == StepInputs(
        host=[7, 8, 0, 0,  # input ids
              4, 2, 0, 0,  # positions
              11, 5, 9, 9,  # pool rows
              28, 2, 23, 23,  # slot-table cells
              4, 2, 0, 0,  # mask limits
              0, 0, 0, 0,  # ancestor bits
              3, 0, 2, 2],  # slots
        token_rows=[0, 1], batch_size=4, num_new=1)


def test_decode_layouts_built_whole_equal_the_row_by_row_layout():
    rng = random.Random(4)
    scratch = Scratch(slot=40, row=999, table_width=300)
    for _ in range(50):
        n = rng.randint(1, 33)
        slots = rng.sample(range(40), n)
        starts = [rng.randrange(299) for _ in slots]
        ids = [[rng.randrange(5000)] for _ in slots]
        rows = [[rng.randrange(999)] for _ in slots]
        bucket = n + rng.choice([0, 0, 1, 7])
        assert lay_out(slots, ids, starts, rows, [None] * n, bucket, 1, scratch) == _lay_out_rows(
            slots, ids, starts, rows, [None] * n, bucket, 1, scratch)


def test_a_fed_chains_layout_is_the_row_by_row_layout_once_its_chains_are_written():
    """``lay_out_chains`` (arrays, no row by row Python) against ``lay_out`` of stand-ins (ids 0,
    the scratch pool row), as a fed-chains forward laid them out before: equal token rows, and
    equal layouts once the chains' rows are written on the device (``write_chains``), which
    overwrites the stand-ins; padding columns and rows keep the host's."""
    rng = random.Random(5)
    scratch = Scratch(slot=40, row=999, table_width=300)
    table = torch.arange(41 * 300).view(41, 300) + 5000  # (cell c points at pool row 5000 + c)
    for case in range(60):
        n = rng.randint(1, 33)
        width = rng.randint(1, 5)
        num_new = width + rng.choice([0, 0, 1, 3])
        bucket = n + rng.choice([0, 0, 1, 7])
        slots = rng.sample(range(40), n)
        base = [rng.randrange(300 - num_new) for _ in slots]
        old = lay_out(slots, [[0] * width] * n, base, [[scratch.row] * width] * n, [None] * n,
                      bucket, num_new, scratch)
        new = lay_out_chains(slots, width, bucket, num_new, scratch)
        assert isinstance(new.host, np.ndarray) and (new.batch_size, new.num_new) == (
            bucket, num_new)
        assert new.token_rows.tolist() == old.token_rows, case
        tokens = torch.tensor([[rng.randrange(5000) for _ in range(width)] for _ in slots])
        layouts = []
        for host in (torch.tensor(old.host), torch.from_numpy(new.host.copy())):
            write_chains_reference(host, bucket, num_new, tokens, torch.tensor(base), table)
            layouts.append(host)
        assert torch.equal(*layouts), case


def test_tree_nodes_sit_past_their_parents_and_see_their_ancestors():
    """After 5 cached tokens: the fed token (position 5), then nodes 0 and 1 (children of it)
    and node 2 (a child of node 0). Every node's limit is the column before the tree; its bits
    are its own node and its ancestors'."""
    positions, limits, ancestors = tree_columns(5, 4, (1, [-1, -1, 0]))
    assert positions == [5, 6, 6, 7]
    assert limits == [5, 5, 5, 5]
    assert ancestors == [0, 0b001, 0b010, 0b101]
    got = lay_out([1], [[3, 4, 5, 6]], [5], [[10, 11, 12, 13]], [(1, [-1, -1, 0])], 1, 4,
                  SCRATCH)
    assert got.host[4:8] == positions and got.host[16:20] == limits
    assert got.host[20:24] == ancestors and got.host[12:16] == [13, 14, 15, 16]  # (columns)
