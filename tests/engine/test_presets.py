"""YAML presets: key checks, validation of every shipped preset, name resolution."""

from pathlib import Path

import pytest

from engine.config import EngineConfig, SpeculativeConfig
from engine.presets import PRESETS_DIR, build_configs, load_config_file, resolve_config_path
from samplers.sampling_params import SamplingParams

PRESETS = sorted(PRESETS_DIR.glob("*.yaml"))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "preset.yaml"
    path.write_text(text)
    return path


def test_the_expected_presets_ship():
    names = {p.stem for p in PRESETS}
    assert {"default", "early_exit", "greedy", "typical", "draft_model", "eagle",
            "eagle_tree"} <= names


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_preset_loads_and_validates(path):
    preset = load_config_file(path)
    engine, sampling = build_configs(preset)
    assert isinstance(engine, EngineConfig) and isinstance(sampling, SamplingParams)
    assert isinstance(engine.speculative_config, SpeculativeConfig)
    # What the file says is what the dataclasses hold (no key silently dropped).
    spec = preset.engine["speculative_config"]
    for key, value in spec.items():
        assert getattr(engine.speculative_config, key) == value, key
    for key, value in preset.sampling.items():
        assert getattr(sampling, key) == value, key


def test_default_preset_is_ngram_on_the_embedded_model():
    engine, sampling = build_configs(load_config_file("default"))
    assert engine.model == "smollm2-135m"
    assert engine.speculative_config.method == "ngram"
    assert sampling.greedy


@pytest.mark.parametrize("text, key, allowed", [
    ("modle: x\n", "modle", "max_num_seqs"),
    ("speculative_config:\n  method: ngram\n  k: 3\n", "k", "num_speculative_tokens"),
    ("sampling:\n  temprature: 0.5\n", "temprature", "temperature"),
])
def test_unknown_key_is_an_error_naming_it_and_the_allowed_ones(tmp_path, text, key, allowed):
    with pytest.raises(ValueError, match=f"unknown key '{key}'") as info:
        load_config_file(_write(tmp_path, text))
    assert allowed in str(info.value)


def test_bad_value_names_the_field(tmp_path):
    preset = load_config_file(_write(tmp_path, "sampling:\n  top_p: 2.0\n"))
    with pytest.raises(ValueError, match=r"SamplingParams\.top_p=2\.0 is invalid"):
        build_configs(preset)
    preset = load_config_file(_write(tmp_path, "speculative_config:\n  method: medusa\n"))
    with pytest.raises(ValueError, match=r"SpeculativeConfig\.method='medusa'"):
        build_configs(preset)


def test_null_speculative_config_means_plain_decoding(tmp_path):
    engine, _ = build_configs(load_config_file(_write(tmp_path, "speculative_config: null\n")))
    assert engine.speculative_config is None


def test_empty_file_gives_the_dataclass_defaults(tmp_path):
    engine, sampling = build_configs(load_config_file(_write(tmp_path, "")))
    assert engine == EngineConfig()
    assert sampling == SamplingParams()


@pytest.mark.parametrize("text, message", [
    ("- a\n- b\n", "must be a mapping"),
    ("sampling: 3\n", "must be a mapping"),
    ("model: [unclosed\n", "not valid YAML"),
])
def test_malformed_files_are_clear_errors(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_config_file(_write(tmp_path, text))


def test_preset_names_resolve_to_shipped_files():
    assert resolve_config_path("early_exit") == PRESETS_DIR / "early_exit.yaml"
    with pytest.raises(ValueError, match="not found .*shipped presets: .*default"):
        resolve_config_path("no_such_preset")


def test_shipped_presets_resolve_from_any_directory(tmp_path, monkeypatch):
    """Found by the porting run: LLM.from_config_file('configs/early_exit.yaml'), the README's
    example, only worked from the repository root."""
    monkeypatch.chdir(tmp_path)
    for name in ("configs/early_exit.yaml", "early_exit"):
        assert resolve_config_path(name) == PRESETS_DIR / "early_exit.yaml"
    with pytest.raises(ValueError, match="not found"):
        resolve_config_path("elsewhere/early_exit.yaml")
