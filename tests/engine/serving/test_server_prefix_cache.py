"""The server with ``--enable-prefix-caching``: a prompt sent again is served from the cache
(OpenAI's ``usage.prompt_tokens_details.cached_tokens``), with the same text, and the hits are
on ``/metrics``."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.engine.cli.cli_helpers import save_tiny_model
from tests.engine.serving.server_helpers import running_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = save_tiny_model(tmp_path_factory.mktemp("tiny_cache_server"))
    with running_server(model_dir, "--kv-cache-tokens", "512", "--max-num-seqs", "4",
                        "--enable-prefix-caching") as base:
        yield base


def test_a_repeated_prompt_is_served_from_the_cache(server):
    body = {"prompt": " ".join(f"w{i % 40 + 3}" for i in range(30)), "max_tokens": 6,
            "temperature": 0, "ignore_eos": True}
    first = httpx.post(f"{server}/v1/completions", json=body, timeout=60).json()
    again = httpx.post(f"{server}/v1/completions", json=body, timeout=60).json()
    assert "prompt_tokens_details" not in first["usage"]
    prompt_tokens = again["usage"]["prompt_tokens"]
    # (the prompt's last token is always computed: all but one are cached)
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": prompt_tokens - 1}
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    metrics = httpx.get(f"{server}/metrics", timeout=10).text
    hits = float(re.search(r'^vllm:prefix_cache_hits_total\{model_name="[^"]*"\} (\S+)$', metrics,
                           re.M).group(1))
    assert hits == prompt_tokens - 1
