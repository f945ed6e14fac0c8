"""The real server process for tests: started with ``python -m engine.serve`` on a free port,
waited for until ``/health`` answers, stopped after."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(model_dir: Path | str, *args: str,
                   env: dict[str, str] | None = None) -> Iterator[str]:
    """The server on ``model_dir`` (CPU) with the extra CLI ``args``; yields its base URL.
    Raises ``RuntimeError`` with its stderr when it exits before it is healthy."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.serve", "--model", str(model_dir), "--device", "cpu",
         "--port", str(port), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {proc.stderr.read()}")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
