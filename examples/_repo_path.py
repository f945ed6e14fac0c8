"""Importing this puts the repository root on ``sys.path``, so that the example scripts run from a
checkout without ``pip install -e .`` (``python examples/compare_speedups.py``)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
