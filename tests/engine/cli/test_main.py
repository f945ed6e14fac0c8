"""``python -m engine.generate``: flags, merging with presets, prompt files, the error path."""

import dataclasses
import json
import re
import subprocess
import sys
import time

import pytest

from engine.cli.args import CliError, build_parser, merge_overrides, parse_args
from engine.cli.flag_help import FLAG_HELP
from engine.cli.main import main
from engine.cli.prompts import read_prompts, read_prompts_file
from engine.config import EngineConfig, SpeculativeConfig
from engine.presets import build_configs, load_config_file
from samplers.sampling_params import SamplingParams
from tests.engine.cli.cli_helpers import save_tiny_model


def _merged(argv, config="default"):
    args, overrides = parse_args(argv)
    return build_configs(merge_overrides(load_config_file(config), overrides))


@pytest.mark.parametrize("cls, section", [
    (SamplingParams, "sampling"), (SpeculativeConfig, "spec"), (EngineConfig, "engine")])
def test_every_dataclass_field_has_a_flag(cls, section):
    _, specs = build_parser()
    flagged = {s.field for s in specs if s.section == section}
    # (speculative_config has its own group; guided_decoding is structured_outputs' older name)
    expected = {f.name for f in dataclasses.fields(cls)} - {"speculative_config",
                                                             "guided_decoding"}
    assert flagged == expected


def test_flags_override_the_preset_and_the_rest_is_kept():
    engine, sampling = _merged(["--top-p", "0.5", "--temperature", "0.7", "-k", "2",
                                "--max-num-seqs", "3", "--seed", "7", "--request-seed", "11"])
    assert (sampling.temperature, sampling.top_p, sampling.seed) == (0.7, 0.5, 11)
    assert sampling.max_tokens == 128  # from configs/default.yaml
    assert engine.speculative_config.num_speculative_tokens == 2
    assert engine.speculative_config.method == "ngram"  # from the preset
    assert (engine.max_num_seqs, engine.seed) == (3, 7)


def test_list_bool_json_and_none_values():
    _, sampling = _merged(["--stop", "a,b", "--stop", "END", "--stop-token-ids", "1,2",
                           "--stop-token-ids", "3", "--allowed-token-ids", "4,5,6",
                           "--bad-words", "foo", "--logit-bias", '{"5": 1.5, "7": -100}',
                           "--ignore-eos", "--no-skip-special-tokens", "--max-tokens", "none"])
    assert sampling.stop == ["a,b", "END"]
    assert sampling.stop_token_ids == [1, 2, 3]
    assert sampling.allowed_token_ids == [4, 5, 6]
    assert sampling.bad_words == ["foo"]
    assert sampling.logit_bias == {5: 1.5, 7: -100.0}
    assert sampling.ignore_eos is True and sampling.skip_special_tokens is False
    assert sampling.max_tokens is None


def test_method_none_turns_speculation_off():
    engine, _ = _merged(["--method", "none"])
    assert engine.speculative_config is None
    with pytest.raises(CliError, match="drop --num-speculative-tokens"):
        _merged(["--method", "none", "-k", "3"])


def test_changing_method_drops_the_other_methods_keys():
    engine, _ = _merged(["--method", "early_exit", "--num-early-exit-layers", "6"])
    spec = engine.speculative_config
    assert (spec.method, spec.num_early_exit_layers) == ("early_exit", 6)
    assert spec.num_speculative_tokens == 4  # kept from the preset
    engine, _ = _merged(["--draft-model", "some/draft"], config="draft_model")
    assert engine.speculative_config.model == "some/draft"


def test_speculation_flags_on_a_preset_without_speculation(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text("speculative_config: null\n")
    engine, _ = _merged(["-k", "3", "--method", "ngram"], config=path)
    assert engine.speculative_config.method == "ngram"
    assert engine.speculative_config.num_speculative_tokens == 3
    with pytest.raises(ValueError, match=r"SpeculativeConfig\.method=None"):  # (as vLLM)
        _merged(["-k", "3"], config=path)


def test_a_draft_model_without_method_infers_it(tmp_path):
    """The default preset drafts by n-gram; --draft-model alone must not keep that."""
    engine, _ = _merged(["--draft-model", "some/draft"])
    spec = engine.speculative_config
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("draft_model",
                                                                      "some/draft", 4)
    engine, _ = _merged(["--draft-model", "my/head"], config="eagle_tree")  # takes a model
    assert engine.speculative_config.method == "ngram_eagle"
    with pytest.raises(ValueError, match=r"SpeculativeConfig\.model='some/draft'"):
        _merged(["--draft-model", "some/draft", "--method", "ngram"])


def test_threads_and_short_n_flags():
    engine, sampling = _merged(["--threads", "2", "-n", "3"])
    assert (engine.num_threads, sampling.n) == (2, 3)
    engine, _ = _merged([])
    assert engine.num_threads is None  # default_num_threads() when the engine is built


def test_prompts_from_flags_and_files(tmp_path):
    text = tmp_path / "prompts.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "plain"}\n'
                     '{"messages": [{"role": "user", "content": "hi"}]}\n')
    items = read_prompts(["from flag"], str(text))
    assert [i.text for i in items] == ["from flag", "first prompt", "second prompt"]
    items = read_prompts_file(jsonl)
    assert items[0].text == "plain" and items[0].messages is None
    assert items[1].messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("line, message", [
    ('{"promt": "x"}', 'expected an object with "prompt" or "messages"'),
    ('{"prompt": "x", "n": 2}', "unknown key 'n'"),
    ('{"messages": [{"role": "user"}]}', "'messages' must be a non-empty list"),
    ("not json", "not valid JSON"),
])
def test_bad_jsonl_lines_name_the_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as info:
        read_prompts_file(path)
    assert f"{path}:2" in str(info.value)


@pytest.mark.parametrize("argv, expected", [
    (["--top-p", "2.0"], "error: SamplingParams.top_p=2.0 is invalid: allowed (0.0, 1.0]"),
    (["--max-tokens", "lots"], "error: argument --max-tokens: --max-tokens expects int or "
                               "none, got 'lots'"),
    (["--method", "medusa"], "error: argument --method: invalid choice: 'medusa'"),
    (["-k", "99"], "error: SpeculativeConfig.num_speculative_tokens=99 is invalid"),
    (["--config", "nope"], "error: config file 'nope' not found"),
    (["--logit-bias", "[1]"], "error: argument --logit-bias: --logit-bias expects a JSON object"),
    (["--frobnicate"], "error: unrecognized arguments: --frobnicate"),
])
def test_bad_input_is_one_error_line_and_a_nonzero_exit(capsys, argv, expected):
    assert main(argv) != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(expected)
    assert captured.err.count("\n") == 1


def test_bad_config_key_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("sampling:\n  temprature: 0.5\n")
    assert main(["--config", str(path)]) != 0
    err = capsys.readouterr().err
    assert "unknown key 'temprature'" in err and "allowed:" in err and err.count("\n") == 1


def test_error_path_as_a_real_process():
    """The console behaviour itself: exit code, one stderr line, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "engine.generate", "--top-p", "2.0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "error: SamplingParams.top_p=2.0 is invalid: allowed (0.0, 1.0]\n"
    assert proc.stdout == ""


def test_json_output_is_valid_for_bad_runs_too(tmp_path):
    # A failed run writes no JSON at all rather than a partial document.
    out = tmp_path / "out.json"
    assert main(["--top-p", "2.0", "--json", str(out)]) != 0
    assert not out.exists()


# ---------------------------------------------------------------- end to end on a tiny model
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_llama"))


def torch_threads():
    import torch

    return torch.get_num_threads()


def _hf_greedy(path, prompt_ids, max_new_tokens):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])  # [1, prompt_len]
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def test_cli_end_to_end_matches_hf_greedy(tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7 w8 w5 w6 w7 w8 w5 w6"}\n'
                       '{"messages": [{"role": "user", "content": "w9 w10 w9 w10"}]}\n')
    out = tmp_path / "out.json"
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32",
            "--prompts-file", str(prompts), "--prompt", "w40 w41 w42",
            "--max-tokens", "12", "--ignore-eos", "-k", "3", "--no-adaptive-k", "--json",
            str(out), "--threads", "2"]  # (a fixed k: a random model's drafts may lose)
    started = time.time()
    assert main(argv) == 0
    assert torch_threads() == 2  # (the default is 1 on 2 cores)
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    results = doc["outputs"]
    assert len(results) == 3
    # ``--prompt`` comes first, then the file; the tokenizer has a chat template, so every
    # prompt went through it (<user> ... <bot>), and the outputs keep the formatted text
    assert results[0]["prompt_token_ids"] == [2, 40, 41, 42, 3]
    assert results[0]["prompt"] == "<user> w40 w41 w42 <bot> "
    assert results[1]["prompt_token_ids"] == [2, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 3]
    assert results[2]["prompt_token_ids"] == [2, 9, 10, 9, 10, 3]
    for result in results:
        sample = result["outputs"][0]
        assert sample["token_ids"] == _hf_greedy(tiny_model_dir, result["prompt_token_ids"], 12)
        assert sample["finish_reason"] == "length"
        assert sample["text"] in printed
    assert doc["config"]["engine"]["speculative_config"]["num_speculative_tokens"] == 3
    metrics = doc["metrics"]
    assert metrics["num_generated"] == 36 and metrics["num_drafted"] > 0
    steps = sum(r["metrics"]["num_steps"] for r in results)
    assert doc["mean_accepted_length"] == pytest.approx(36 / steps)
    for result in results:  # wall-clock seconds since the epoch, in order
        times = [result["metrics"][key] for key in ("arrival_time", "first_token_time",
                                                    "finished_time")]
        assert started - 1 <= times[0] <= times[1] <= times[2] <= time.time() + 1
    assert "acceptance rate" in printed and "tokens/s" in printed


def test_cli_stream_and_no_speculation(tiny_model_dir, tmp_path, capsys):
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--prompt", "w5 w6 w7 w5 w6 w7",
            "--max-tokens", "8", "--ignore-eos"]
    assert main(argv + ["--method", "none", "--json", "-"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout holds only the JSON document
    expected = doc["outputs"][0]["outputs"][0]
    assert "(no speculation)" in captured.err and doc["metrics"]["num_drafted"] == 0
    assert doc["mean_accepted_length"] == doc["outputs"][0]["mean_accepted_length"] == 1.0
    out = tmp_path / "stream.json"
    assert main(argv + ["--stream", "--json", str(out)]) == 0
    streamed = capsys.readouterr().out
    assert streamed.startswith(expected["text"] + "\n[8 tokens, finish_reason=length]\n")
    (sample,) = json.loads(out.read_text())["streamed"]
    assert sample["text"] == expected["text"]
    assert sample["token_ids"] == expected["token_ids"]
    assert sample["finish_reason"] == "length"


@pytest.mark.slow
def test_default_command_runs_the_embedded_model(capsys):
    """The main job as shipped: default model, n-gram speculation, built-in demo prompt, with
    the baseline that proves it (the same text without speculation, and the speedup)."""
    assert main(["--max-tokens", "24"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "finish_reason=" in printed
    assert "acceptance rate" in printed and "mean accepted length" in printed
    assert "identical: the text with speculation is token for token" in printed
    assert re.search(r"without speculation: 24 tokens in .* s: \d+\.\d tokens/s", printed)
    assert re.search(r"speedup: \d+\.\d\dx", printed)
    assert "specdec: loading the model (smollm2-135m)" in captured.err


def test_baseline_decodes_the_same_text_without_speculation(tiny_model_dir, capsys):
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--prompt", "w5 w6 w7 w5 w6 w7",
            "--max-tokens", "8", "--ignore-eos", "--no-chat", "--baseline"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "without speculation: 8 tokens in" in captured.out
    assert "identical: the text with speculation is token for token" in captured.out
    phases = [line for line in captured.err.splitlines() if line.startswith("specdec: ")]
    expected = ["specdec: loading the model", "specdec: loaded in", "specdec: warming up",
                "specdec: decoding without speculation", "specdec: decoding with speculation"]
    assert len(phases) == len(expected)
    assert all(p.startswith(e) for p, e in zip(phases, expected, strict=True)), phases
    assert main(argv + ["--no-progress"]) == 0
    assert capsys.readouterr().err == ""  # (--no-progress: no phase lines either)


def test_baseline_is_refused_with_stream_and_sampled_texts_are_not_compared(tiny_model_dir,
                                                                           capsys):
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--prompt", "w5 w6 w7 w5 w6 w7",
            "--max-tokens", "6", "--no-chat", "--baseline", "--no-progress"]
    assert main(argv + ["--stream"]) == 2
    assert "drop --stream or --baseline" in capsys.readouterr().err
    assert main(argv + ["--temperature", "0.9"]) == 0
    assert "texts not compared: sampled without a seed" in capsys.readouterr().out


def test_a_failed_request_is_one_error_line_on_stderr(tiny_model_dir):
    """Found by the misuse run: the failure went to stdout only (exit code 1, nothing on
    stderr) after the 'Loading weights' bar. stderr now holds the error line and nothing else."""
    long_prompt = " ".join(f"w{4 + i % 100}" for i in range(40))
    proc = subprocess.run(
        [sys.executable, "-m", "engine.generate", "--model", str(tiny_model_dir), "--device",
         "cpu", "--max-model-len", "32", "--prompt", "w5 w6 w7", "--prompt", long_prompt,
         "--max-tokens", "4", "--no-progress", "--no-chat"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: request 1: the prompt has 40 tokens")
    assert "[4 tokens, finish_reason=length]" in proc.stdout  # the good request ran


def test_no_chat_sends_the_raw_prompt(tiny_model_dir, tmp_path):
    out = tmp_path / "raw.json"
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--prompt", "w40 w41 w42",
            "--max-tokens", "3", "--ignore-eos", "--no-chat", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())["outputs"][0]
    assert result["prompt_token_ids"] == [40, 41, 42] and result["prompt"] == "w40 w41 w42"


def test_streamed_samples_print_as_blocks(tiny_model_dir, capsys):
    """Found by the porting run: --stream --n 2 interleaved the samples one token per line."""
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--prompt", "w5 w6 w7 w5 w6",
            "--max-tokens", "6", "--ignore-eos", "--stream", "--n", "2", "--temperature", "0.8",
            "--request-seed", "3", "--no-chat"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("--- request 0, sample")]
    assert len(heads) == 2
    for i in heads:  # each block: its label, its text on one line, its finish line
        assert len(lines[i + 1].split()) == 6 and lines[i + 2] == "[6 tokens, finish_reason=length]"


def test_help_shows_what_a_run_gets(capsys):
    with pytest.raises(SystemExit):
        main(["--config", "typical", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "typical acceptance (lossy) (default: 'typical_acceptance_sampler', from " \
           "typical.yaml)" in text
    assert "sample from the k likeliest tokens (0 or -1: all) (default: 0)" in text
    assert "--logprobs-mode {raw_logprobs,processed_logprobs,raw_logits,processed_logits}" in text


def test_every_flag_says_what_it_does():
    parser, specs = build_parser()
    assert {(s.section, s.field) for s in specs} == set(FLAG_HELP)
    for action in parser._actions:
        assert action.help and not action.help.startswith(
            ("EngineConfig.", "SpeculativeConfig.", "SamplingParams.")), action.option_strings


@pytest.mark.parametrize("module, usage", [("engine.generate", "usage: specdec "),
                                           ("engine.serve", "usage: specdec serve ")])
def test_help_imports_neither_torch_nor_transformers(module, usage):
    """--help took 4.6-6 s when it loaded transformers, and about 1.5 s more for torch: the
    entry point, run as ``python -m``, prints its help with neither imported."""
    code = ("import runpy, sys\n"
            f"sys.argv = [{module!r}, '--help']\n"
            "try:\n"
            f"    runpy.run_module({module!r}, run_name='__main__')\n"
            "except SystemExit as exit:\n"
            "    assert exit.code in (0, None), exit.code\n"
            "print('imported:', sorted({'torch', 'transformers'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(usage) and "--max-num-seqs" in proc.stdout
    assert proc.stdout.rstrip().endswith("imported: []")


def test_a_run_with_no_drafts_says_so():
    from engine.cli.main import summary_line
    from engine.outputs import EngineMetrics

    line = summary_line(EngineMetrics(num_generated=5, elapsed_s=1.0, tokens_per_s=5.0), True)
    assert "no drafts were verified" in line and "0.00" not in line


def test_structured_outputs_flag_holds_the_output_to_a_regex(tmp_path):
    from tests.engine.structured_helpers import save_char_model

    model_dir = save_char_model(tmp_path / "char")
    out = tmp_path / "structured.json"
    argv = ["--model", str(model_dir), "--device", "cpu", "--prompt", "abc", "--no-chat",
            "--max-tokens", "30", "--temperature", "0.9", "--n", "3", "--request-seed", "1",
            "--structured-outputs", '{"regex": "[ab]{3}-(x|yz)"}', "--method", "ngram",
            "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    samples = json.loads(out.read_text())["outputs"][0]["outputs"]
    assert len(samples) == 3
    assert all(re.fullmatch(r"[ab]{3}-(x|yz)", s["text"]) for s in samples)


def test_a_structured_outputs_flag_that_does_not_compile_is_one_error_line(tmp_path, capsys):
    from tests.engine.structured_helpers import save_char_model

    model_dir = save_char_model(tmp_path / "char")
    argv = ["--model", str(model_dir), "--device", "cpu", "--prompt", "abc", "--no-chat",
            "--structured-outputs", '{"regex": "[ab"}', "--no-progress"]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "StructuredOutputsParams.regex='[ab' does not compile" in err
