"""OpenAI's request and response shapes for ``/v1/completions`` and ``/v1/chat/completions``
(and vLLM's for ``/tokenize`` and ``/detokenize``).

Requests are pydantic models with OpenAI's fields and names, plus vLLM's extra sampling fields
(``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``, ``skip_special_tokens``, ``include_stop_str_in_output``,
``allowed_token_ids``, ``bad_words``, ``prompt_logprobs``) and a per-request speculation control,
``num_speculative_tokens`` (``SamplingParams.num_speculative_tokens``: at most this many
drafts per step; 0 turns speculation off for the request). Structured output comes as OpenAI's
``response_format`` (``json_object``, ``json_schema``), vLLM's ``structured_outputs`` object or
its older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` fields, at
most one of them (:func:`structured_outputs`); OpenAI features not built here (``tools``, ...:
``UNSUPPORTED_FEATURES``) are refused by name, saying so. Fields that OpenAI clients send and
that change nothing here (``store``, ``metadata``, ``user``, ``service_tier``,
``parallel_tool_calls``) are accepted and ignored; other unknown fields are refused (a typo should
not be silently dropped). :func:`sampling_params` turns a request into :class:`SamplingParams`,
whose own checks name the field of a bad value; :func:`message_text` joins a message's text
parts.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine.logprobs import Logprob
from engine.outputs import RequestOutput
from samplers import SamplingParams, StructuredOutputsParams


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    # accepted and ignored: they change nothing in what this server computes
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's extra sampling fields
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    # this engine's per-request speculation control
    num_speculative_tokens: int | None = None
    # structured output: OpenAI's, vLLM's, and vLLM's older names
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[Any]  # text, or OpenAI's content parts (text parts only: message_text)


class ChatRequest(_Request):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize`` body: a ``prompt`` (tokenized as ``/v1/completions`` does) or
    ``messages`` (rendered and tokenized as ``/v1/chat/completions`` does)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # None: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """vLLM's ``/detokenize`` body."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


# OpenAI features that this server knows and does not build: a 400 that names the feature, rather
# than the "not supported" of an unknown field (a typo).
UNSUPPORTED_FEATURES = {
    "tools": "tool calling", "tool_choice": "tool calling",
    "functions": "function calling", "function_call": "function calling",
    "audio": "audio output", "modalities": "output modalities other than text",
    "prediction": "predicted outputs", "web_search_options": "web search",
}

_PASSED = ("n", "temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty",
           "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
           "skip_special_tokens", "include_stop_str_in_output", "allowed_token_ids", "bad_words",
           "prompt_logprobs", "num_speculative_tokens")


def sampling_params(request: CompletionRequest | ChatRequest,
                    defaults: SamplingParams) -> SamplingParams:
    """The request's :class:`SamplingParams`: its fields over the server's defaults."""
    values = {name: getattr(request, name) for name in _PASSED
              if getattr(request, name) is not None}
    max_tokens = request.max_tokens
    if isinstance(request, ChatRequest):
        if request.max_completion_tokens is not None:
            max_tokens = request.max_completion_tokens
        if request.logprobs:
            values["logprobs"] = request.top_logprobs or 0
    else:
        if request.logprobs is not None:
            values["logprobs"] = request.logprobs
        if request.best_of is not None:
            values["best_of"] = request.best_of
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    if request.logit_bias is not None:
        values["logit_bias"] = request.logit_bias
    structured = structured_outputs(request)
    if structured is not None:
        values["structured_outputs"] = structured
    base = {name: getattr(defaults, name) for name in ("max_tokens", "temperature")}
    return SamplingParams(**{**base, **values})


_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def structured_outputs(request: CompletionRequest | ChatRequest) -> StructuredOutputsParams | None:
    """The request's output constraint from whichever of its fields gives one (None: none).
    Raises ``ValueError`` naming the field for a bad or doubled one (a 400)."""
    given: list[tuple[str, StructuredOutputsParams]] = []
    fmt = request.response_format
    if fmt is not None:
        given += [("response_format", _response_format(fmt))] if fmt.get("type") != "text" else []
    if request.structured_outputs is not None:
        given.append(("structured_outputs", _params("structured_outputs",
                                                     dict(request.structured_outputs))))
    for name, kind in _GUIDED.items():
        value = getattr(request, name)
        if value is not None:
            given.append((name, _params(name, {kind: value})))
    if len(given) > 1:
        raise ValueError(f"SamplingParams.structured_outputs=... is invalid: one of "
                         f"{[name for name, _ in given]} at a time")
    return given[0][1] if given else None


def _response_format(fmt: dict[str, Any]) -> StructuredOutputsParams:
    """OpenAI's ``response_format``: ``{"type": "json_object"}`` or ``{"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``."""
    kind = fmt.get("type")
    if kind == "json_object":
        return _params("response_format", {"json_object": True})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ValueError(f"SamplingParams.response_format={fmt!r} is invalid: a json_schema "
                             "response_format needs json_schema.schema")
        return _params("response_format", {"json": spec["schema"]})
    raise ValueError(f"SamplingParams.response_format={fmt!r} is invalid: allowed type "
                     "'text', 'json_object' or 'json_schema'")


def _params(field: str, values: dict[str, Any]) -> StructuredOutputsParams:
    """:class:`StructuredOutputsParams` of ``values``; its errors name the request's field."""
    try:
        return StructuredOutputsParams.coerce(values, field)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"SamplingParams.{field}=... is invalid: {exc}") from None


def message_text(content: str | list[Any], where: str) -> str:
    """A message's ``content`` as text: a string as it is, a list of OpenAI's content parts
    (``{"type": "text", "text": ...}``) joined by newlines, as vLLM joins them. Raises
    ``ValueError`` naming ``where`` (``messages[i].content``) for a part that is not text."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            shown = f"type {kind!r}" if kind is not None else f"{part!r}"
            raise ValueError(f"{where}[{j}]: a content part of {shown} is not supported "
                             "(this server takes text parts only)")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}[{j}]: a text part needs a string 'text'")
        texts.append(part["text"])
    return "\n".join(texts)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(output: RequestOutput) -> dict[str, Any]:
    """OpenAI's usage; ``prompt_tokens_details.cached_tokens`` when the prefix cache served
    some of the prompt."""
    completion = sum(len(c.token_ids) for c in output.outputs)
    prompt = len(output.prompt_token_ids)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
    if output.num_cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": output.num_cached_tokens}
    return out


def add_usage(total: dict[str, Any], output: RequestOutput) -> None:
    """Add ``output``'s :func:`usage` into ``total`` (several prompts of one request)."""
    for key, value in usage(output).items():
        if key == "prompt_tokens_details":
            details = total.setdefault(key, {"cached_tokens": 0})
            details["cached_tokens"] += value["cached_tokens"]
        else:
            total[key] += value


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]] | None,
                        tokenizer: Any) -> dict[str, Any] | None:
    """OpenAI's legacy completions ``logprobs`` object."""
    if entries is None:
        return None
    tokens = [tokenizer.decode([t]) for t in token_ids]
    offsets, offset = [], 0
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens,
            "token_logprobs": [e[t].logprob for e, t in zip(entries, token_ids, strict=True)],
            "top_logprobs": [{lp.decoded_token: lp.logprob for lp in e.values()}
                             for e in entries],
            "text_offset": offsets}


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]] | None,
                  top_n: int) -> dict[str, Any] | None:
    """OpenAI's chat ``logprobs`` object: ``{"content": [{token, logprob, bytes,
    top_logprobs}]}``."""
    if entries is None:
        return None
    content = []
    for entry, token in zip(entries, token_ids, strict=True):
        chosen = entry[token]
        best = sorted(entry.values(), key=lambda lp: lp.rank or 0)[:top_n]
        content.append({"token": chosen.decoded_token, "logprob": chosen.logprob,
                         "bytes": list((chosen.decoded_token or "").encode()),
                         "top_logprobs": [{"token": lp.decoded_token, "logprob": lp.logprob,
                                           "bytes": list((lp.decoded_token or "").encode())}
                                          for lp in best]})
    return {"content": content}


def now() -> int:
    return int(time.time())
