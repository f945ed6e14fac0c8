"""The OpenAI-compatible server, as a real process on a tiny model, through the official `openai`
client (and httpx for what a client library hides: disconnects, metrics, raw errors)."""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from tests.engine.cli.cli_helpers import save_tiny_model
from tests.engine.serving.server_helpers import running_server

MAX_PENDING = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_server"))


@pytest.fixture(scope="module", params=[[], ["--async-scheduling"]], ids=["sync", "overlapped"])
def server(model_dir, request):
    """The server, also with overlapped steps (on CUDA by default; forced here on CPU, where
    the path is the same: flights committed a call later, aborts and disconnects mid-flight)."""
    with running_server(model_dir, "--served-model-name", "tiny", "--max-pending",
                        str(MAX_PENDING), "--kv-cache-tokens", "512",
                        "--max-num-seqs", "4", *request.param) as base:
        yield base


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(model_dir):
    """``LLM.generate`` on the same model: what the server must give for greedy requests."""
    llm = LLM(str(model_dir), device="cpu")

    def run(prompts: list[str], max_tokens: int) -> list[str]:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]

    return run


def metric(base: str, name: str, **labels: str) -> float:
    """The value of the series ``name`` whose labels include ``labels`` (0 when none has
    them yet); every series carries vLLM's ``model_name`` label."""
    text = httpx.get(f"{base}/metrics").text
    for line in text.splitlines():
        match = re.fullmatch(r"([\w:]+)(?:\{(.*)\})? (\S+)", line)
        if match and match.group(1) == name:
            have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            assert have.get("model_name") == "tiny", line
            if labels.items() <= have.items():
                return float(match.group(3))
    family = re.sub(r"_(count|sum|bucket)$", "", name)
    assert f"# HELP {family} " in text, f"no metric {name}"
    return 0.0


def wait_idle(base: str, free_at_start: float) -> None:
    for _ in range(100):
        if (metric(base, "specdec_queue_depth") == 0
                and metric(base, "specdec_kv_cache_free_tokens") == free_at_start):
            return
        time.sleep(0.1)
    raise AssertionError("the server still holds requests or KV rows")


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(f"{server}/health").status_code == 200


def test_completions_equal_llm_generate(client, reference):
    prompts = ["w5 w6 w7 w5 w6", "w40 w41 w42"]
    out = client.completions.create(model="tiny", prompt=prompts, max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == reference(prompts, 8)
    assert out.usage.completion_tokens == 16 and out.usage.prompt_tokens == 8
    stream = client.completions.create(model="tiny", prompt=prompts[0], max_tokens=8,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == reference(prompts[:1], 8)[0]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_n_samples_stop_and_logprobs(client):
    messages = [{"role": "user", "content": "w9 w10 w9 w10"}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, n=3,
                                         temperature=0.9, seed=5, logprobs=True, top_logprobs=2)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    for choice in out.choices:
        assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
        assert len(choice.logprobs.content) >= 1
        assert all(len(t.top_logprobs) <= 2 for t in choice.logprobs.content)
    greedy = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                            temperature=0).choices[0].message.content
    stop_word = greedy.split()[1]
    stopped = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                             temperature=0, stop=[stop_word])
    assert stopped.choices[0].finish_reason == "stop" and stop_word not in \
        stopped.choices[0].message.content
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == greedy


@pytest.mark.parametrize("kwargs, param", [
    ({"top_p": 2.0}, "top_p"),
    ({"extra_body": {"temprature": 0.5}}, "temprature"),  # a typo is not silently dropped
    ({"extra_body": {"bad_words": "w5 w6"}}, "bad_words"),
    ({"extra_body": {"num_speculative_tokens": -1}}, "num_speculative_tokens"),
    ({"prompt": "w5 " * 300}, "prompt"),  # longer than the context
    ({"max_tokens": 10**9}, "max_tokens"),  # beyond the context: was run for minutes
    ({"prompt": [["w5"]]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"logit_bias": {"999": 1}}, "logit_bias"),  # outside the vocabulary: was a 500
    ({"extra_body": {"prompt_logprobs": 1000}}, "prompt_logprobs"),
    ({"best_of": 3}, "best_of"),  # was ignored without logprobs
])
def test_bad_requests_are_400_naming_the_field(client, kwargs, param):
    args = {"model": "tiny", "prompt": "w5 w6", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**args)
    assert info.value.status_code == 400 and info.value.body["param"] == param
    # ... and the next request is served
    assert client.completions.create(model="tiny", prompt="w5", max_tokens=2).choices


def test_a_disconnect_aborts_the_request_and_frees_its_kv(server, client):
    wait_idle(server, 512)
    aborted = metric(server, "vllm:request_success_total", finished_reason="abort")
    with httpx.stream("POST", f"{server}/v1/completions", json={
            "model": "tiny", "prompt": "w5 w6 w7", "max_tokens": 200, "temperature": 0,
            "ignore_eos": True, "stream": True}, timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    wait_idle(server, 512)  # aborted at once, not run to its 200 tokens
    # counted as vLLM counts it: a request that ended with finished_reason="abort"
    assert metric(server, "vllm:request_success_total", finished_reason="abort") == aborted + 1


def test_metrics_have_vllms_names(server, client):
    before = metric(server, "vllm:generation_tokens_total")
    done = metric(server, "vllm:request_success_total", finished_reason="length")
    client.completions.create(model="tiny", prompt="w5 w6 w7 w5 w6 w7", max_tokens=6,
                              temperature=0, extra_body={"ignore_eos": True})
    assert metric(server, "vllm:generation_tokens_total") == before + 6
    assert metric(server, "vllm:request_success_total", finished_reason="length") == done + 1
    assert metric(server, "vllm:prompt_tokens_total") > 0
    for name in ("vllm:time_to_first_token_seconds_count",
                 "vllm:time_per_output_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_count"):
        assert metric(server, name) >= 1, name
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert metric(server, name) == 0, name
    drafted = metric(server, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(server, "vllm:spec_decode_num_accepted_tokens_total")
    assert 0 <= accepted <= drafted and metric(server, "vllm:spec_decode_num_drafts_total") >= 0
    assert sum(metric(server, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                      position=str(i)) for i in range(4)) == accepted


def test_concurrent_clients_get_what_generate_gives(client, reference):
    prompts = [f"w{5 + i} w{6 + i} w{7 + i} w{5 + i}" for i in range(6)]

    def one(prompt: str) -> str:
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=10,
                                         temperature=0, extra_body={"ignore_eos": True}
                                         ).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(one, prompts))
    assert texts == reference(prompts, 10)


def test_a_request_of_more_prompts_than_the_queue_holds_leaves_nothing(server, client):
    """Found in review: a 429 part-way through a list of prompts left the earlier ones running."""
    wait_idle(server, 512)
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="tiny", prompt=["w5 w6"] * (MAX_PENDING + 2),
                                  max_tokens=40, extra_body={"ignore_eos": True})
    wait_idle(server, 512)


def test_a_full_queue_answers_429_with_retry_after(server, client):
    wait_idle(server, 512)
    body = {"model": "tiny", "prompt": "w5 w6", "max_tokens": 60, "ignore_eos": True}

    def post(_: int) -> httpx.Response:
        return httpx.post(f"{server}/v1/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(3 * MAX_PENDING) as pool:
        responses = list(pool.map(post, range(3 * MAX_PENDING)))
    codes = [r.status_code for r in responses]
    assert codes.count(200) >= MAX_PENDING and 429 in codes
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    wait_idle(server, 512)
