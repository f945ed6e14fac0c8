"""What the server refuses, and how: each refusal in OpenAI's error shape, naming the field, through
the official `openai` client (and httpx for raw bodies) against the app in-process, its engine on a
thread, on a tiny model (context 256 tokens)."""

from __future__ import annotations

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.serving.app import build_app
from engine.serving.async_engine import AsyncEngine
from engine.serving.metrics import ServerMetrics
from tests.engine.cli.cli_helpers import save_tiny_model

MAX_MODEL_LEN = 256  # the tiny model's max_position_embeddings


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    model_dir = save_tiny_model(tmp_path_factory.mktemp("tiny_refusals"))
    engine = AsyncEngine(LLMEngine(EngineConfig(model=str(model_dir), device="cpu",
                                                kv_cache_tokens=512, max_num_seqs=4)))
    assert engine.engine.max_model_len == MAX_MODEL_LEN
    with TestClient(build_app(engine, "tiny", ServerMetrics(engine, 0))) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def client(http) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="unused", max_retries=0,
                         http_client=http)


def words(n: int) -> str:
    return " ".join(f"w{5 + i % 100}" for i in range(n))


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("route, body, param, message", [
    ("completions", {"prompt": "w5 w6", "max_tokens": 10**9}, "max_tokens",
     "you requested 1000000002 tokens (2 in the prompt, 1000000000 in the completion)"),
    ("completions", {"prompt": words(250), "max_tokens": 10}, "max_tokens",
     "you requested 260 tokens (250 in the prompt, 10 in the completion)"),
    ("completions", {"prompt": ["w5", words(300)]}, "prompt",
     "your request has 300 tokens in prompt 1, which leaves no room"),
    ("chat/completions", {"messages": [{"role": "user", "content": "w5"}],
                          "max_completion_tokens": 300}, "max_completion_tokens",
     "you requested 303 tokens (3 in the messages, 300 in the completion)"),  # <user> w5 <bot>
], ids=["huge_max_tokens", "long_prompt", "prompt_alone", "chat"])
def test_a_request_beyond_the_context_is_400_as_vllm_words_it(http, route, body, param, message):
    response = http.post(f"/v1/{route}", json={"model": "tiny", **body})
    error = error_of(response)
    assert response.status_code == 400
    assert error["message"].startswith(f"This model's maximum context length is "
                                       f"{MAX_MODEL_LEN} tokens. However, ")
    assert message in error["message"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", param, "context_length_exceeded")


def test_a_request_that_just_fits_runs_and_no_max_tokens_keeps_its_default(client):
    fits = client.completions.create(model="tiny", prompt=words(250), max_tokens=6,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert fits.usage.completion_tokens == 6
    default = client.completions.create(model="tiny", prompt=words(250), temperature=0,
                                        extra_body={"ignore_eos": True})  # 16: cut at 256
    assert default.usage.completion_tokens == 6
    assert default.choices[0].finish_reason == "length"


def test_a_model_other_than_the_served_one_is_404(client, http):
    for create in (lambda m: client.completions.create(model=m, prompt="w5", max_tokens=2),
                   lambda m: client.chat.completions.create(
                       model=m, max_tokens=2, messages=[{"role": "user", "content": "w5"}])):
        with pytest.raises(openai.NotFoundError) as info:
            create("gpt-4")
        assert info.value.body["message"].startswith("The model `gpt-4` does not exist.")
        assert (info.value.body["code"], info.value.body["param"]) == ("model_not_found",
                                                                       "model")
        assert create("tiny").choices  # the served name ...
    no_model = http.post("/v1/completions", json={"prompt": "w5", "max_tokens": 2})
    assert no_model.status_code == 200  # ... and no name at all (vLLM's default model)


def test_malformed_json_and_unknown_routes_get_openai_errors(http):
    response = http.post("/v1/completions", content=b'{"model": "tiny", prompt: 1}',
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert error_of(response)["message"].startswith("the request body is not valid JSON: ")
    assert error_of(response)["type"] == "invalid_request_error"
    response = http.post("/v1/completions", json=["w5"])
    assert response.status_code == 400 and error_of(response)["message"].startswith(
        "the request body: ")
    for method, route, status in (("GET", "/v1/nope", 404), ("POST", "/v1/embeddings", 404),
                                  ("GET", "/v1/completions", 405)):
        response = http.request(method, route)
        assert response.status_code == status
        assert route in error_of(response)["message"]
        assert error_of(response)["type"] == "invalid_request_error"
    assert "POST" in response.headers["Allow"]


def test_chat_content_as_text_parts_is_joined_and_other_parts_are_refused(client):
    def chat(content):
        return client.chat.completions.create(
            model="tiny", max_tokens=5, temperature=0, extra_body={"ignore_eos": True},
            messages=[{"role": "system", "content": "w7"}, {"role": "user", "content": content}])

    parts = chat([{"type": "text", "text": "w5 w6"}, {"type": "text", "text": "w9"}])
    text = chat("w5 w6\nw9")
    assert parts.choices[0].message.content == text.choices[0].message.content
    assert parts.usage.prompt_tokens == text.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as info:
        chat([{"type": "text", "text": "w5"},
              {"type": "image_url", "image_url": {"url": "http://x/y.png"}}])
    assert info.value.body["param"] == "messages"
    assert info.value.body["message"] == ("messages[1].content[1]: a content part of type "
                                          "'image_url' is not supported (this server takes "
                                          "text parts only)")


def test_harmless_unknown_fields_are_ignored_and_others_are_not_supported(client):
    out = client.chat.completions.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "w5"}], store=False,
        metadata={"run": "a"}, user="u1", service_tier="auto", parallel_tool_calls=False)
    assert out.choices
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="w5", max_tokens=2,
                                  extra_body={"temprature": 0.5})
    assert info.value.body["param"] == "temprature"
    assert info.value.body["message"] == ("temprature: the field 'temprature' is not supported "
                                          "by this server")


@pytest.mark.parametrize("field, value, feature", [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "tool calling"),
    ("tool_choice", "auto", "tool calling"),
    ("functions", [{"name": "f", "parameters": {}}], "function calling"),
])
def test_known_but_unsupported_features_are_400_saying_so(client, field, value, feature):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[
            {"role": "user", "content": "w5"}], extra_body={field: value})
    assert info.value.body["param"] == field and info.value.body["code"] == "unsupported"
    assert info.value.body["message"] == f"{field}: {feature} is not supported by this server"
