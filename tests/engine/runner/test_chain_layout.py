"""A fed-chains forward's layout rows in one launch (engine/runner/chain_layout.py): the kernel
against values worked out by hand and against its PyTorch reference; rows past the chains and
columns past a chain's width keep what the host laid out."""

from __future__ import annotations

import pytest
import torch

from engine.runner.chain_layout import write_chains, write_chains_reference
from engine.runner.step_inputs import LAYOUT_ROWS
from tests.conftest import DEVICE, needs_triton

pytestmark = [needs_triton, pytest.mark.layout_kernel]  # (the kernel itself: tests/conftest.py)

BATCH, NUM_NEW, TABLE_WIDTH = 4, 5, 20


def host_layout() -> torch.Tensor:
    """A layout as the host sends it before the chains are written: every part 7 (the
    host's stand-ins), slots 3, 1, 0, 2."""
    layout = torch.full((LAYOUT_ROWS * BATCH * NUM_NEW + BATCH,), 7, dtype=torch.long)
    layout[LAYOUT_ROWS * BATCH * NUM_NEW:] = torch.tensor([3, 1, 0, 2])
    return layout.to(DEVICE)


def table() -> torch.Tensor:
    """A slot table whose cell ``c`` points at pool row ``1000 + c``."""
    return (1000 + torch.arange(5 * TABLE_WIDTH)).view(5, TABLE_WIDTH).to(DEVICE)


@pytest.mark.parametrize("write", [write_chains, write_chains_reference],
                         ids=["kernel", "reference"])
def test_the_chains_rows_hold_their_tokens_positions_cells_rows_and_limits(write):
    layout = host_layout()
    tokens = torch.tensor([[5, 17, 40], [8, 1, 2]], device=DEVICE)  # (width 3 of 5 columns)
    base = torch.tensor([10, 4], device=DEVICE)
    write(layout, BATCH, NUM_NEW, tokens, base, table())
    parts = layout[:LAYOUT_ROWS * BATCH * NUM_NEW].view(LAYOUT_ROWS, BATCH, NUM_NEW).cpu()
    # (slot 3 at positions 10-12, then the last repeated; slot 1 at 4-6)
    assert parts[0, :2].tolist() == [[5, 17, 40, 7, 7], [8, 1, 2, 7, 7]]
    assert parts[1, :2].tolist() == [[10, 11, 12, 12, 12], [4, 5, 6, 6, 6]]
    assert parts[3, :2].tolist() == [[70, 71, 72, 7, 7], [24, 25, 26, 7, 7]]
    assert parts[2, :2].tolist() == [[1070, 1071, 1072, 7, 7], [1024, 1025, 1026, 7, 7]]
    assert parts[4, :2].tolist() == parts[1, :2].tolist()
    assert (parts[5] == 7).all()  # (no tree bits written)
    assert (parts[:, 2:] == 7).all()  # (rows past the chains: the host's)
    assert layout[LAYOUT_ROWS * BATCH * NUM_NEW:].tolist() == [3, 1, 0, 2]


def test_the_kernel_writes_what_the_reference_writes():
    gen = torch.Generator().manual_seed(3)
    for n, width in [(1, 1), (3, 5), (4, 2)]:
        tokens = torch.randint(0, 500, (n, width), generator=gen).to(DEVICE)
        base = torch.randint(0, TABLE_WIDTH - NUM_NEW, (n,), generator=gen).to(DEVICE)
        layouts = [host_layout(), host_layout()]
        write_chains(layouts[0], BATCH, NUM_NEW, tokens, base, table())
        write_chains_reference(layouts[1], BATCH, NUM_NEW, tokens, base, table())
        assert torch.equal(layouts[0], layouts[1]), (n, width)


@pytest.mark.parametrize("write", [write_chains, write_chains_reference],
                         ids=["kernel", "reference"])
def test_a_negative_token_goes_in_as_id_0(write):
    """A row the sampling kernels marked invalid (a negative id) is fed as id 0."""
    layout = host_layout()
    write(layout, BATCH, NUM_NEW, torch.tensor([[-1], [12]], device=DEVICE),
          torch.tensor([3, 6], device=DEVICE), table())
    parts = layout[:LAYOUT_ROWS * BATCH * NUM_NEW].view(LAYOUT_ROWS, BATCH, NUM_NEW).cpu()
    assert parts[0, :2, 0].tolist() == [0, 12]


def test_a_chains_tensor_with_a_column_stride_is_read_as_its_values():
    """Tokens sliced out of a wider tensor (the drafting step feeds a view)."""
    wide = torch.tensor([[5, 9, 17, 9, 40, 9]], device=DEVICE)
    layouts = [host_layout(), host_layout()]
    base = torch.tensor([2], device=DEVICE)
    write_chains(layouts[0], BATCH, NUM_NEW, wide[:, ::2], base, table())
    write_chains_reference(layouts[1], BATCH, NUM_NEW, torch.tensor([[5, 17, 40]],
                                                                     device=DEVICE), base, table())
    assert torch.equal(layouts[0], layouts[1])
