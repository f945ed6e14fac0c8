"""Structured output: a request's output held to a JSON Schema, regex, choice or grammar.

:class:`StructuredOutputsParams` says what (vLLM's names); :class:`Grammars` compiles it once
per distinct constraint; a :class:`GrammarState` per sample masks the target's logits at every
position a step verifies (:func:`walk_drafts`) and names the tokens the grammar forces, which
the engine verifies as drafts. :func:`apply_bitmask` applies a step's masks to its logits rows.

The names are imported on first use, so that ``SamplingParams`` (which reads
``StructuredOutputsParams``) and the CLI's ``--help`` import neither torch nor the grammar
library.
"""

from __future__ import annotations

import importlib
from typing import Any

# name: the module that defines it
_LAZY = {
    "apply_bitmask": "samplers.structured.apply",
    "Grammars": "samplers.structured.grammars",
    "GrammarState": "samplers.structured.matcher",
    "bitmask_words": "samplers.structured.matcher",
    "walk_drafts": "samplers.structured.matcher",
    "StructuredOutputsParams": "samplers.structured.params",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'samplers.structured' has no attribute {name!r}")
