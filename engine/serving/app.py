"""The HTTP routes (FastAPI): OpenAI's completions, chat completions and models, plus /health,
/metrics and vLLM's /version, /tokenize and /detokenize.

Streaming answers are server-sent events, one ``data: {json}`` per delta and ``data: [DONE]``
at the end. A client that disconnects cancels its handler, which aborts the request (its KV rows
are freed at the engine's next step). Every error has OpenAI's body, ``{"error": {"message",
"type", "param", "code"}}``: a bad request (a value out of range, an unknown field, malformed
JSON, a prompt and ``max_tokens`` beyond the context) is a 400 naming the field in ``param``; a
``model`` other than the served one and an unknown route a 404; a full queue a 429 with
``Retry-After``; a known OpenAI feature this server does not build (``tools``, ...) a 400 that
says so; a ``/v1`` request without the ``--api-key`` a 401. The other requests run on.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.metadata
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from engine.inputs import normalize_conversations, normalize_prompts
from engine.outputs import RequestOutput, StreamDelta
from engine.serving import protocol as p
from engine.serving.async_engine import EngineFrontend, QueueFull
from engine.serving.metrics import ServerMetrics
from samplers import SamplingParams

RETRY_AFTER_S = 1
PROTECTED_PREFIX = "/v1/"  # the routes an --api-key guards (vLLM's choice)
_PARAM = re.compile(r"(?:Sampling|StructuredOutputs)Params\.(\w+)=|(prompt)\b")


class EngineStopped(Exception):
    """The engine loop stopped (its error is the message): the server cannot serve."""


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ModelNotFound(Exception):
    """The request names a model this server does not serve."""


def _error(status: int, message: str, kind: str, param: str | None = None,
           headers: dict[str, str] | None = None, code: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """pydantic's first complaint about a body, as OpenAI's 400."""
    first = exc.errors()[0]
    loc = [str(x) for x in first.get("loc", ())[1:]]
    param = loc[0] if loc else None  # the request's field (the rest: where inside it)
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", first.get("msg"))
        return _error(400, f"the request body is not valid JSON: {detail} (at character "
                      f"{param})", "invalid_request_error")
    if first.get("type") == "extra_forbidden":
        if len(loc) == 1 and loc[0] in p.UNSUPPORTED_FEATURES:
            return _error(400, f"{loc[0]}: {p.UNSUPPORTED_FEATURES[loc[0]]} is not supported by "
                          "this server", "invalid_request_error", param, code="unsupported")
        return _error(400, f"{'.'.join(loc)}: the field {loc[-1]!r} is not supported by this "
                      "server", "invalid_request_error", param)
    where = ".".join(loc) if loc else "the request body"
    return _error(400, f"{where}: {first.get('msg')}", "invalid_request_error", param)


def build_app(engine: EngineFrontend, model_name: str, metrics: ServerMetrics,
              api_key: str | None = None) -> FastAPI:
    """The server's FastAPI app over a (not yet started) engine frontend (:class:`AsyncEngine`,
    or :class:`~engine.serving.engine_process.ProcessEngine`). With ``api_key``, the ``/v1``
    routes answer 401 to a request without ``Authorization: Bearer <api_key>``; as in vLLM,
    the others (``/health``, ``/metrics``, ``/version``, ``/tokenize``, ``/detokenize``) stay
    open."""
    tokenizer = engine.engine.tokenizer

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start(asyncio.get_running_loop())
        yield
        engine.stop()

    app = FastAPI(title="specdec", lifespan=lifespan)

    if api_key is not None:
        expected = f"Bearer {api_key}".encode()

        @app.middleware("http")
        async def authenticate(request: Request, call_next: Any) -> Response:
            given = request.headers.get("authorization", "").encode()
            if request.url.path.startswith(PROTECTED_PREFIX) and not hmac.compare_digest(
                    given, expected):
                return _error(401, "Incorrect or missing API key: send the header "
                              "'Authorization: Bearer <key>' with the server's --api-key",
                              "invalid_request_error", code="invalid_api_key")
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        route = f"{request.method} {request.url.path}"
        message = {404: f"Invalid URL ({route}): no such route",
                   405: f"Method not allowed ({route})"}.get(exc.status_code, str(exc.detail))
        return _error(exc.status_code, message, "invalid_request_error",
                      headers=getattr(exc, "headers", None))

    @app.exception_handler(BadRequest)
    async def bad(request: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, str(exc), "invalid_request_error", exc.param, code=exc.code)

    @app.exception_handler(ModelNotFound)
    async def no_model(request: Request, exc: ModelNotFound) -> JSONResponse:
        return _error(404, str(exc), "invalid_request_error", "model", code="model_not_found")

    def check_model(requested: str | None) -> None:
        if requested is not None and requested != model_name:
            raise ModelNotFound(f"The model `{requested}` does not exist. This server serves "
                                f"`{model_name}`.")

    @app.exception_handler(EngineStopped)
    async def stopped(request: Request, exc: EngineStopped) -> JSONResponse:
        return _error(503, f"the engine stopped: {exc}", "server_error")

    @app.exception_handler(QueueFull)
    async def full(request: Request, exc: QueueFull) -> JSONResponse:
        return _error(429, f"the server is busy: {exc}; retry later", "rate_limit_error",
                      headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.get("/health")
    async def health() -> Response:
        if engine.error is not None:
            return _error(503, f"the engine stopped: {engine.error}", "server_error")
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.render_ready()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": importlib.metadata.version("specdec")}

    @app.post("/tokenize")
    async def tokenize(body: p.TokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise BadRequest("give exactly one of prompt and messages", "prompt")
        if body.prompt is not None:
            special = True if body.add_special_tokens is None else body.add_special_tokens
            text = body.prompt
        else:
            special = bool(body.add_special_tokens)
            text = _chat_text(tokenizer, body.messages, body.chat_template,
                              body.add_generation_prompt, body.continue_final_message)
        ids = list(tokenizer(text, add_special_tokens=special)["input_ids"])
        return {"count": len(ids), "max_model_len": engine.engine.max_model_len, "tokens": ids,
                "token_strs": tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs
                else None}

    @app.post("/detokenize")
    async def detokenize(body: p.DetokenizeRequest) -> dict[str, str]:
        check_model(body.model)
        vocab_size = engine.engine.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab_size]
        if bad:
            raise BadRequest(f"tokens {bad[:5]} are outside the vocabulary [0, {vocab_size})",
                             "tokens")
        return {"prompt": tokenizer.decode(body.tokens)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": p.now(), "owned_by": "specdec"}]}

    @app.post("/v1/completions")
    async def completions(body: p.CompletionRequest, request: Request) -> Response:
        check_model(body.model)
        if body.suffix is not None:
            raise BadRequest("suffix is not supported", "suffix")
        params = _params(body, SamplingParams(max_tokens=16))
        try:
            prompts = normalize_prompts(body.prompt, tokenizer)
        except (TypeError, ValueError) as exc:
            raise BadRequest(str(exc), "prompt") from None
        if not prompts:
            raise BadRequest("prompt: at least one prompt is needed", "prompt")
        for i, (_, ids) in enumerate(prompts):
            _check_context(len(ids), body.max_tokens, "max_tokens", engine.engine.max_model_len,
                           "prompt", "the prompt" if len(prompts) == 1 else f"prompt {i}")
        runs = _submit_all(engine, prompts, params)
        rid = p.new_id("cmpl")
        if body.stream:
            return _sse(_completion_chunks(engine, rid, model_name, runs, params.n,
                                           _include_usage(body)))
        outputs = await _collect(engine, runs, request)
        if outputs is None:
            return Response(status_code=499)
        return JSONResponse(_completion_body(rid, model_name, outputs, body, tokenizer))

    @app.post("/v1/chat/completions")
    async def chat(body: p.ChatRequest, request: Request) -> Response:
        check_model(body.model)
        params = _params(body, SamplingParams(max_tokens=None))
        text = _chat_text(tokenizer, body.messages, body.chat_template,
                          body.add_generation_prompt, body.continue_final_message)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        max_field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
        _check_context(len(ids), getattr(body, max_field), max_field,
                       engine.engine.max_model_len, "messages", "the messages")
        runs = _submit_all(engine, [(text, ids)], params)
        rid = p.new_id("chatcmpl")
        if body.stream:
            return _sse(_chat_chunks(engine, rid, model_name, runs[0], _include_usage(body)))
        outputs = await _collect(engine, runs, request)
        if outputs is None:
            return Response(status_code=499)
        return JSONResponse(_chat_body(rid, model_name, outputs[0], body))

    return app


def _chat_text(tokenizer: Any, messages: list[p.ChatMessage], chat_template: str | None,
               add_generation_prompt: bool, continue_final_message: bool) -> str:
    """The conversation rendered by the chat template; a 400 naming ``messages`` if it cannot
    be (a content part that is not text, a template error)."""
    dumped = [m.model_dump() for m in messages]
    try:
        for i, message in enumerate(dumped):
            message["content"] = p.message_text(message["content"], f"messages[{i}].content")
    except ValueError as exc:
        raise BadRequest(str(exc), "messages") from None
    try:
        (conversation,) = normalize_conversations(dumped)
        return tokenizer.apply_chat_template(
            conversation, chat_template=chat_template, tokenize=False,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message)
    except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
        raise BadRequest(f"messages: {exc}", "messages") from None


def _check_context(num_prompt_tokens: int, max_tokens: int | None, max_field: str,
                   max_model_len: int, prompt_field: str, what: str) -> None:
    """A 400 (as vLLM words it) when the prompt leaves no room for output, or when it and the
    ``max_tokens`` asked for (None: the server's default, cut at the context) exceed it."""
    limit = f"This model's maximum context length is {max_model_len} tokens."
    if num_prompt_tokens >= max_model_len:
        raise BadRequest(f"{limit} However, your request has {num_prompt_tokens} tokens in "
                         f"{what}, which leaves no room for the completion. Please reduce the "
                         f"length of {what}.", prompt_field, "context_length_exceeded")
    if max_tokens is not None and num_prompt_tokens + max_tokens > max_model_len:
        raise BadRequest(f"{limit} However, you requested {num_prompt_tokens + max_tokens} tokens "
                         f"({num_prompt_tokens} in {what}, {max_tokens} in the completion). "
                         f"Please reduce the length of {what} or {max_field}={max_tokens}.",
                         max_field, "context_length_exceeded")


def _bad_request(exc: Exception) -> BadRequest:
    """A 400 for a TypeError/ValueError of the parameters, ``param`` read from its message."""
    match = _PARAM.search(str(exc))
    return BadRequest(str(exc), next((g for g in match.groups() if g), None) if match else None)


def _params(body: p.CompletionRequest | p.ChatRequest, defaults: SamplingParams) -> SamplingParams:
    try:
        return p.sampling_params(body, defaults)
    except (TypeError, ValueError) as exc:
        raise _bad_request(exc) from None


def _submit_all(engine: EngineFrontend, prompts: list[tuple[str | None, list[int]]],
                params: SamplingParams) -> list[tuple[str, asyncio.Queue]]:
    """Queue every prompt of a request, or none: a full queue part-way aborts those added."""
    if engine.error is not None:
        raise EngineStopped(str(engine.error))
    try:
        engine.engine.check_params(params)  # ids outside the vocabulary: before any work
    except (TypeError, ValueError) as exc:
        raise _bad_request(exc) from None
    runs: list[tuple[str, asyncio.Queue]] = []
    try:
        for text, ids in prompts:
            runs.append(engine.add(text, ids, params))
    except QueueFull:
        for request_id, _ in runs:
            engine.abort(request_id)
        raise
    return runs


async def _collect(engine: EngineFrontend, runs: list[tuple[str, asyncio.Queue]],
                   request: Request) -> list[RequestOutput] | None:
    """Every run's final output; None (and every run aborted) if the client went away."""

    async def one(run: tuple[str, asyncio.Queue]) -> RequestOutput | None:
        final = None
        async for item in engine.results(*run):
            if isinstance(item, RequestOutput):
                final = item
        return final

    task = asyncio.gather(*(one(r) for r in runs))
    while not task.done():
        await asyncio.wait([task], timeout=0.5)
        if not task.done() and await request.is_disconnected():
            task.cancel()  # (each run's generator aborts its request)
            try:
                await task
            except asyncio.CancelledError:
                pass
            return None
    outputs = task.result()
    if any(o is None for o in outputs):  # (ended without an output: the engine loop stopped)
        raise EngineStopped(str(engine.error or "the request ended without an output"))
    failed = next((o for o in outputs if o.error is not None), None)
    if failed is not None and len(outputs) == 1:
        raise BadRequest(failed.error, "prompt")
    return outputs


def _sse(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def _merged(engine: EngineFrontend, runs: list[tuple[str, asyncio.Queue]],
                  ) -> AsyncIterator[tuple[int, StreamDelta | RequestOutput]]:
    """Every run's items as they come, tagged with the run's index."""
    out: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, run: tuple[str, asyncio.Queue]) -> None:
        async for item in engine.results(*run):
            await out.put((i, item))
        await out.put((i, None))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(runs)]
    try:
        remaining = len(runs)
        while remaining:
            i, item = await out.get()
            if item is None:
                remaining -= 1
            else:
                yield i, item
    finally:  # (a client that went away: cancelling the pumps aborts the requests)
        for task in tasks:
            task.cancel()


def _include_usage(body: p.CompletionRequest | p.ChatRequest) -> bool:
    return bool((body.stream_options or {}).get("include_usage"))


async def _completion_chunks(engine: EngineFrontend, rid: str, model: str,
                             runs: list[tuple[str, asyncio.Queue]], n: int,
                             include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    created = p.now()
    total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    async for i, item in _merged(engine, runs):
        if isinstance(item, RequestOutput):
            if item.error is not None:
                yield {"error": {"message": item.error, "type": "invalid_request_error",
                                 "param": "prompt", "code": None}}
            p.add_usage(total, item)
            continue
        yield {"id": rid, "object": "text_completion", "created": created, "model": model,
               "choices": [{"index": i * n + item.index, "text": item.text, "logprobs": None,
                            "finish_reason": item.finish_reason}]}
    if include_usage:  # (OpenAI's stream_options: one last chunk with the usage, no choices)
        yield {"id": rid, "object": "text_completion", "created": created, "model": model,
               "choices": [], "usage": total}


async def _chat_chunks(engine: EngineFrontend, rid: str, model: str, run: tuple[str, asyncio.Queue],
                       include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    created = p.now()
    started: set[int] = set()
    final = None
    async for _, item in _merged(engine, [run]):
        if isinstance(item, RequestOutput):
            if item.error is not None:
                yield {"error": {"message": item.error, "type": "invalid_request_error",
                                 "param": "messages", "code": None}}
            final = item
            continue
        delta: dict[str, Any] = {"content": item.text}
        if item.index not in started:
            started.add(item.index)
            delta["role"] = "assistant"
        yield {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": item.index, "delta": delta, "logprobs": None,
                            "finish_reason": item.finish_reason}]}
    if include_usage and final is not None:
        yield {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [], "usage": p.usage(final)}


def _completion_body(rid: str, model: str, outputs: list[RequestOutput],
                     body: p.CompletionRequest, tokenizer: Any) -> dict[str, Any]:
    choices = []
    for i, output in enumerate(outputs):
        for c in output.outputs:
            text = (output.prompt or "") + c.text if body.echo else c.text
            choices.append({"index": i * len(output.outputs) + c.index, "text": text,
                            "logprobs": p.completion_logprobs(c.token_ids, c.logprobs, tokenizer),
                            "finish_reason": c.finish_reason})
    total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for output in outputs:
        p.add_usage(total, output)
    return {"id": rid, "object": "text_completion", "created": p.now(), "model": model,
            "choices": choices, "usage": total}


def _chat_body(rid: str, model: str, output: RequestOutput,
               body: p.ChatRequest) -> dict[str, Any]:
    top = body.top_logprobs or 0
    choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": p.chat_logprobs(c.token_ids, c.logprobs, top) if body.logprobs
                else None, "finish_reason": c.finish_reason} for c in output.outputs]
    return {"id": rid, "object": "chat.completion", "created": p.now(), "model": model,
            "choices": choices, "usage": p.usage(output)}
