"""Structured output through the real server process (n-gram speculation on, a tiny random
model with a character-level vocabulary) and the official `openai` client: OpenAI's
``response_format``, vLLM's ``structured_outputs`` and ``guided_*`` fields, and the 400s."""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest

from tests.engine.serving.server_helpers import running_server
from tests.engine.structured_helpers import save_char_model

SCHEMA = {"type": "object", "properties": {"name": {"enum": ["ann", "bob"]},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": 'give {"name": "ann", "ok": true}'}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir: Path = save_char_model(tmp_path_factory.mktemp("char_server"))
    with running_server(model_dir, "--served-model-name", "tiny", "--kv-cache-tokens", "1024",
                        "--max-num-seqs", "4", "--method", "ngram",
                        "--num-speculative-tokens", "4") as base:
        yield base


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def person(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"name", "ok"} and value["name"] in ("ann", "bob") and isinstance(
        value["ok"], bool)


def valid_or_cut(choice, valid) -> None:
    """JSON with free whitespace (OpenAI's response_format) lets a random model write spaces
    until max_tokens: a finished output must be valid, a cut one a started object."""
    text = getattr(choice, "message", choice)
    text = text.content if hasattr(text, "content") else choice.text
    if choice.finish_reason == "stop":
        assert valid(text), text
    else:
        assert choice.finish_reason == "length" and text.startswith("{"), text


def test_response_format_json_schema_and_json_object(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                  "strict": True}}
    for temperature in (0.0, 1.0):
        out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=60,
                                             temperature=temperature, seed=1,
                                             response_format=fmt)
        valid_or_cut(out.choices[0], person)
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12,
                                         temperature=0, response_format={"type": "json_object"})
    valid_or_cut(out.choices[0], lambda t: isinstance(json.loads(t), dict))
    out = client.completions.create(model="tiny", prompt="abc", max_tokens=60, temperature=0,
                                    extra_body={"guided_json": SCHEMA})
    valid_or_cut(out.choices[0], person)


def test_json_without_free_whitespace_is_always_valid(client):
    extra = {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}}
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=60, n=4,
                                         temperature=1.0, seed=2, extra_body=extra)
    for choice in out.choices:
        assert choice.finish_reason == "stop" and person(choice.message.content)


@pytest.mark.parametrize("extra, valid", [
    ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
    ({"guided_regex": r"[0-9]{3}"}, lambda t: re.fullmatch(r"[0-9]{3}", t)),
    ({"guided_grammar": 'root ::= "a" | "bc"'}, lambda t: t in ("a", "bc")),
    ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
])
def test_vllm_fields_on_both_routes(client, extra, valid):
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=60,
                                          temperature=0, extra_body=extra)
    assert valid(chat.choices[0].message.content)
    completion = client.completions.create(model="tiny", prompt="abc", max_tokens=60,
                                           temperature=0.8, seed=3, n=2, extra_body=extra)
    assert all(valid(c.text) and c.finish_reason == "stop" for c in completion.choices)


@pytest.mark.parametrize("extra, param, message", [
    ({"guided_regex": "[0-"}, "regex", "does not compile"),
    ({"guided_json": {"type": "objekt"}}, "json", "does not compile"),
    ({"guided_grammar": "root ::= missing"}, "grammar", "does not compile"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "structured_outputs", "one of"),
    ({"structured_outputs": {"choices": ["a"]}}, "structured_outputs", "unknown keys"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools",
     "tool calling is not supported"),
])
def test_bad_constraints_are_400s_naming_them(client, server, extra, param, message):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8,
                                       extra_body=extra)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param
    assert message in error["message"]
    # the server serves on: the next request completes
    ok = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20,
                                        temperature=0, extra_body={"guided_choice": ["fine"]})
    assert ok.choices[0].message.content == "fine"
