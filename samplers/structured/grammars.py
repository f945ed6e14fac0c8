"""Compiling a request's :class:`StructuredOutputsParams` into a grammar the matcher runs.

The grammar library is xgrammar (measured against llguidance in docs/performance.md,
"Structured output": its token mask costs a few microseconds a token on the default model's
49k vocabulary, it rolls back accepted tokens, and it finds the tokens a grammar forces).
:class:`Grammars` holds one ``xgrammar.GrammarCompiler`` over the engine's tokenizer and
vocabulary, made on first use (reading the vocabulary takes a fraction of a second), and keeps
each compiled grammar by its params' key, so that a request compiles once and requests that share
a schema share the result. A schema, regex or grammar that does not compile is a ``ValueError``
naming the field. Nothing here downloads anything.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from samplers.structured.params import StructuredOutputsParams

MAX_CACHED = 256  # compiled grammars kept (least recently used dropped first)


class Grammars:
    """Compiled grammars over one tokenizer and a ``vocab_size``-wide logits row."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._compiler: Any = None
        self._batcher: Any = None
        self._cache: OrderedDict[tuple, Any] = OrderedDict()

    @property
    def compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size,
                stop_token_ids=self.stop_token_ids or None)
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    @property
    def batcher(self) -> Any:
        """An ``xgrammar.BatchGrammarMatcher`` (its thread pool fills a batch's masks)."""
        if self._batcher is None:
            import xgrammar as xgr

            self._batcher = xgr.BatchGrammarMatcher()
        return self._batcher

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The ``xgrammar.CompiledGrammar`` of ``params`` (cached by ``params.key``)."""
        key = params.key
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        compiled = self._compile(params)
        self._cache[key] = compiled
        if len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return compiled

    def _compile(self, params: StructuredOutputsParams) -> Any:
        compiler, kind = self.compiler, params.kind
        any_whitespace = not params.disable_any_whitespace
        try:
            if kind == "json":
                return compiler.compile_json_schema(params.json, any_whitespace=any_whitespace)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}',
                                                    any_whitespace=any_whitespace)
            if kind == "regex":
                return compiler.compile_regex(params.regex)
            if kind == "choice":
                return compiler.compile_grammar(choice_grammar(params.choice))
            return compiler.compile_grammar(params.grammar)
        except (RuntimeError, ValueError) as exc:
            value = getattr(params, kind)
            shown = value if len(repr(value)) <= 200 else f"{repr(value)[:200]}..."
            raise ValueError(f"StructuredOutputsParams.{kind}={shown!r} does not compile: "
                             f"{_reason(exc)}") from None


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose strings are exactly ``choices`` (EBNF string literals escape as
    JSON's do)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _reason(exc: Exception) -> str:
    """The library's message without its source location prefix (``[time] file.cc:N: ``)."""
    text = str(exc).strip()
    if text.startswith("[") and ".cc:" in text:
        text = text.split(": ", 1)[-1]
    return text
