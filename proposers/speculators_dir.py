"""Whether a head is in the speculators format, without torch: its directory and its
``speculators_model_type`` (what ``engine.config`` reads to infer ``method``, as vLLM does,
and what the CLI's ``--help`` must not pay torch's import for). Loading is
:mod:`proposers.speculators`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SUPPORTED_TYPES = ("eagle3",)


def head_directory(model: Any) -> Path | None:
    """The directory of a head given as a path, or as a hub id already in the local Hugging
    Face cache (nothing is downloaded); None when it is neither."""
    try:
        if Path(model).is_dir():
            return Path(model)
    except TypeError:
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(model), local_files_only=True))
    except Exception:  # (not an id, or not cached: huggingface_hub's errors vary by version)
        return None


def speculators_type(model: Any) -> str | None:
    """The ``speculators_model_type`` of a head directory's (or cached hub id's)
    ``config.json`` (None: not a speculators head)."""
    directory = head_directory(model)
    if directory is None:
        return None
    try:
        path = directory / CONFIG_FILE
        if not path.is_file():
            return None
        config = json.loads(path.read_text())
    except (TypeError, OSError, ValueError):
        return None
    kind = config.get("speculators_model_type") if isinstance(config, dict) else None
    return None if kind is None else str(kind)
