"""What the suites' smoke tests share: one suite run through the entry (the tiny saved model
they run on is the ``tiny_dir`` fixture of ``tests/conftest.py``)."""

from __future__ import annotations

from benchmarks.__main__ import main
from benchmarks.record import Record


def run_suite(*argv: str) -> Record:
    """``python -m benchmarks *argv`` in this process; its record."""
    record = main([str(a) for a in argv])
    assert record is not None
    return record
