"""``--api-key``: the real server process, through the official `openai` client. The ``/v1``
routes need ``Authorization: Bearer <key>`` (else a 401 in OpenAI's error shape); health,
metrics, version and tokenize stay open, as in vLLM."""

from __future__ import annotations

import os

import httpx
import openai
import pytest

from tests.engine.serving.server_helpers import running_server
from tests.engine.serving.test_server import model_dir  # noqa: F401

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def keyed_server(model_dir):  # noqa: F811
    env = {**os.environ, "SPECDEC_API_KEY": KEY}  # (the flag's default: keeps it out of ps)
    with running_server(model_dir, "--served-model-name", "tiny", "--no-engine-process",
                        "--kv-cache-tokens", "512", "--max-num-seqs", "2", env=env) as base:
        yield base


@pytest.mark.parametrize("key", ["wrong", None])
def test_a_v1_request_without_the_key_is_401(keyed_server, key):
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    for method, route in (("GET", "/v1/models"), ("POST", "/v1/completions")):
        response = httpx.request(method, f"{keyed_server}{route}", headers=headers,
                                 json={"model": "tiny", "prompt": "w5", "max_tokens": 2})
        assert response.status_code == 401
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]
    if key is not None:  # (the openai client itself refuses to send no key)
        client = openai.OpenAI(base_url=f"{keyed_server}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model="tiny", prompt="w5", max_tokens=2)


def test_the_key_opens_v1_and_the_other_routes_stay_open(keyed_server):
    client = openai.OpenAI(base_url=f"{keyed_server}/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model="tiny", prompt="w5 w6", max_tokens=3,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3
    assert httpx.get(f"{keyed_server}/health").status_code == 200
    assert "vllm:num_requests_running" in httpx.get(f"{keyed_server}/metrics").text
    assert httpx.get(f"{keyed_server}/version").status_code == 200
    assert httpx.post(f"{keyed_server}/tokenize", json={"prompt": "w5"}).status_code == 200
