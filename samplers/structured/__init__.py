"""Structured output: a request's output held to a JSON Schema, regex, choice or grammar.

:class:`StructuredOutputsParams` says what (vLLM's names); :class:`Grammars` compiles it once
per distinct constraint; a :class:`GrammarState` per sample masks the target's logits at every
position a step verifies (:func:`walk_drafts`) and names the tokens the grammar forces, which
the engine verifies as drafts. :func:`apply_bitmask` applies a step's masks to its logits rows.
"""

from samplers.structured.apply import apply_bitmask
from samplers.structured.grammars import Grammars
from samplers.structured.matcher import GrammarState, bitmask_words, walk_drafts
from samplers.structured.params import StructuredOutputsParams

__all__ = ["GrammarState", "Grammars", "StructuredOutputsParams", "apply_bitmask",
           "bitmask_words", "walk_drafts"]
