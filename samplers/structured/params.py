"""``StructuredOutputsParams``: what a request's output must match (vLLM's names).

Exactly one of ``json`` (a JSON Schema, as a dict or a JSON string), ``regex``, ``choice`` (a
list of strings, the output is one of them), ``grammar`` (an EBNF grammar in the GBNF form
llama.cpp and xgrammar read, rule ``root`` first) or ``json_object=True`` (any JSON object) is
set. ``disable_any_whitespace`` (vLLM's): JSON without free whitespace, so that the separators
``", "`` and ``": "`` are the only ones (more of the output is forced: see
``samplers.structured.matcher``). Every check raises ``ValueError`` / ``TypeError`` naming the
field and the value; whether a schema, regex or grammar compiles is checked when the engine
takes the request (``samplers.structured.grammars``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

KINDS = ("json", "regex", "choice", "grammar", "json_object")


def _fail(name: str, value: object, allowed: str, kind: type[Exception] = ValueError) -> None:
    raise kind(f"StructuredOutputsParams.{name}={value!r} is invalid: allowed {allowed}")


@dataclass
class StructuredOutputsParams:
    """One request's output constraint (vLLM's ``StructuredOutputsParams``)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    parsed = json.loads(self.json)
                except json.JSONDecodeError as exc:
                    _fail("json", self.json, f"a JSON Schema (the string is not JSON: {exc})")
                if not isinstance(parsed, (dict, bool)):
                    _fail("json", self.json, "a JSON Schema object")
            elif not isinstance(self.json, dict):
                _fail("json", self.json, "a JSON Schema as a dict or a JSON string", TypeError)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                _fail(name, value, "a non-empty string",
                      ValueError if isinstance(value, str) else TypeError)
        if self.choice is not None:
            if isinstance(self.choice, (str, bytes)) or not isinstance(self.choice, (list, tuple)):
                _fail("choice", self.choice, "a list of strings", TypeError)
            self.choice = list(self.choice)
            if not self.choice or any(not isinstance(c, str) or not c for c in self.choice):
                _fail("choice", self.choice, "a non-empty list of non-empty strings")
        if self.json_object is not None and not isinstance(self.json_object, bool):
            _fail("json_object", self.json_object, "None, True or False", TypeError)
        if not isinstance(self.disable_any_whitespace, bool):
            _fail("disable_any_whitespace", self.disable_any_whitespace, "True or False",
                  TypeError)
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("StructuredOutputsParams: exactly one of json, regex, choice, "
                             f"grammar or json_object=True must be set, got {given or 'none'}")

    @property
    def kind(self) -> str:
        """The constraint's kind: one of ``KINDS``."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple[str, str, bool]:
        """What identifies the compiled grammar (its cache key)."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json" and isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        elif kind == "choice":
            value = json.dumps(value)
        return kind, str(value), self.disable_any_whitespace

    @classmethod
    def coerce(cls, value: object, field: str) -> StructuredOutputsParams:
        """``value`` as params: the params themselves or a dict of their fields (unknown keys
        are an error naming ``field``)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"SamplingParams.{field}={value!r} is invalid: unknown keys "
                                 f"{unknown}; allowed {sorted(cls.__dataclass_fields__)}")
            return cls(**value)
        raise TypeError(f"SamplingParams.{field}={value!r} has type {type(value).__name__}: "
                        "allowed None, StructuredOutputsParams or a dict of its fields")
