"""What the suites' smoke tests share: a tiny saved model, and one suite run through the entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.__main__ import main
from benchmarks.record import Record


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random LLaMA with a word-level tokenizer and a chat template, saved once."""
    from tests.engine.cli.cli_helpers import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def run_suite(*argv: str) -> Record:
    """``python -m benchmarks *argv`` in this process; its record."""
    record = main([str(a) for a in argv])
    assert record is not None
    return record
