"""vLLM's /version, /tokenize and /detokenize, in-process on the tiny model (``test_refusals``'s
app): the ids are those the generation routes queue."""

from __future__ import annotations

import importlib.metadata

from tests.engine.serving.test_refusals import MAX_MODEL_LEN, http  # noqa: F401


def test_version(http):  # noqa: F811
    assert http.get("/version").json() == {"version": importlib.metadata.version("specdec")}


def test_tokenize_a_prompt_and_messages_as_the_generation_routes_do(http):  # noqa: F811
    out = http.post("/tokenize", json={"model": "tiny", "prompt": "w5 w6 w70",
                                       "return_token_strs": True}).json()
    assert out == {"count": 3, "max_model_len": MAX_MODEL_LEN, "tokens": [5, 6, 70],
                   "token_strs": ["w5", "w6", "w70"]}
    messages = [{"role": "user", "content": [{"type": "text", "text": "w5"}]}]
    chat = http.post("/tokenize", json={"messages": messages}).json()
    assert chat["tokens"] == [2, 5, 3] and chat["token_strs"] is None  # <user> w5 <bot>
    usage = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
                      ).json()["usage"]
    assert usage["prompt_tokens"] == chat["count"]


def test_detokenize_and_what_both_refuse(http):  # noqa: F811
    assert http.post("/detokenize", json={"tokens": [5, 6, 70]}).json() == {"prompt": "w5 w6 w70"}
    refusals = [("/detokenize", {"tokens": [5, 999]}, 400, "tokens"),
                ("/tokenize", {"prompt": "w5", "messages": []}, 400, "prompt"),
                ("/tokenize", {"model": "gpt-4", "prompt": "w5"}, 404, "model")]
    for route, body, status, param in refusals:
        response = http.post(route, json=body)
        assert response.status_code == status and response.json()["error"]["param"] == param
