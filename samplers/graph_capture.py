"""What every CUDA graph capture in the project needs (the runner's, the draft head's): Python's
cyclic garbage collector paused for the capture.

Collected garbage can hold another CUDA graph or event (an engine dropped in a reference cycle);
destroying one while a stream captures is an operation CUDA does not permit then, and it
invalidates the capture (``cudaErrorStreamCaptureInvalidated``: an earlier engine collected in
the middle of a later engine's capture; docs/history.md). vLLM pauses the collector around its
captures too. Here because ``samplers`` is the layer both capturers import.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block (as it was after); reference counting still
    frees what it can."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
