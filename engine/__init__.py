"""specdec engine: ``from engine import LLM, SamplingParams`` is all a user needs.

The configuration and output types are exported too, for type hints and explicit configs.
``LLM`` and the types that pull in torch / transformers are imported on first use, so that
``from engine import SamplingParams`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from samplers.sampling_params import SamplingParams
from samplers.structured.params import StructuredOutputsParams

_LAZY = {
    "LLM": "engine.llm",
    "SpeculativeConfig": "engine.config",
    "EngineConfig": "engine.config",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
    "StreamDelta": "engine.outputs",
    "EngineMetrics": "engine.outputs",
}

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams",
           *[name for name in _LAZY if name != "LLM"]]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
