"""YAML presets (``configs/*.yaml``): engine settings, speculation and sampling in one file.

A preset is a mapping with three kinds of keys, all optional::

    model: smollm2-135m            # any EngineConfig field at the top level
    max_num_seqs: 32
    speculative_config:            # SpeculativeConfig fields, or null for no speculation
      method: ngram
      num_speculative_tokens: 4
    sampling:                      # SamplingParams fields
      temperature: 0.0
      max_tokens: 128

Unknown keys are an error that names the key, the section and the keys allowed there, never
silently dropped. ``load_config_file`` only reads and checks the key names; ``build_configs``
turns a preset into the validated dataclasses (``EngineConfig``, ``SamplingParams``), which check
the values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine.config import EngineConfig, SpeculativeConfig, check_keys, field_names
from samplers.sampling_params import SamplingParams


def _presets_dir() -> Path:
    """Where the shipped presets live (``--config early_exit`` finds ``early_exit.yaml``):
    ``engine/configs/`` in an installed wheel (package data), the repository's ``configs/`` in a
    source checkout."""
    package = Path(__file__).resolve().parent  # engine/
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


PRESETS_DIR = _presets_dir()
DEFAULT_PRESET = "default"
SPECULATIVE_KEY = "speculative_config"
SAMPLING_KEY = "sampling"


@dataclass
class Preset:
    """A preset read from YAML: keyword arguments for the config dataclasses, not yet validated."""

    # EngineConfig keyword arguments; ``speculative_config`` is a dict, or None for plain decoding.
    engine: dict[str, Any] = field(default_factory=dict)
    # SamplingParams keyword arguments.
    sampling: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A path to a YAML file, or a shipped preset by its name (``early_exit``) or by its path
    in the repository (``configs/early_exit.yaml``), the same from any working directory."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = {"": f"{path}.yaml", ".yaml": path.name if path.parent.name == "configs" else ""}
    name = shipped.get(path.suffix, "")
    if name and "/" not in name.removesuffix(".yaml") and (PRESETS_DIR / name).is_file():
        return PRESETS_DIR / name
    names = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
    raise ValueError(f"config file {str(name_or_path)!r} not found (shipped presets: {names})")


def _as_mapping(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping of keys to values, got {type(value).__name__}")
    return dict(value)


def parse_preset(data: Any, where: str = "config") -> Preset:
    """Check the key names of an already-parsed YAML document and split it into sections."""
    data = {} if data is None else _as_mapping(where, data)
    engine_keys = field_names(EngineConfig)
    check_keys(where, data, engine_keys + [SAMPLING_KEY])
    sampling = _as_mapping(f"{where} [{SAMPLING_KEY}]", data.pop(SAMPLING_KEY, None) or {})
    check_keys(f"{where} [{SAMPLING_KEY}]", sampling, field_names(SamplingParams))
    spec = data.get(SPECULATIVE_KEY)
    if spec is not None:
        spec = _as_mapping(f"{where} [{SPECULATIVE_KEY}]", spec)
        check_keys(f"{where} [{SPECULATIVE_KEY}]", spec, field_names(SpeculativeConfig))
        data[SPECULATIVE_KEY] = spec
    return Preset(engine=data, sampling=sampling)


def load_config_file(name_or_path: str | Path) -> Preset:
    """Read a preset (path or shipped name) and check its key names."""
    path = resolve_config_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ValueError(f"config file {str(path)!r} is not valid YAML: {detail}") from None
    preset = parse_preset(data, where=f"config file {str(path)!r}")
    preset.path = path
    return preset


def build_configs(preset: Preset) -> tuple[EngineConfig, SamplingParams]:
    """Validate a preset's values by building the config dataclasses."""
    engine = dict(preset.engine)
    spec = engine.pop(SPECULATIVE_KEY, None)
    spec_config = None if spec is None else SpeculativeConfig.from_dict(spec)
    return (EngineConfig(**engine, speculative_config=spec_config),
            SamplingParams(**preset.sampling))
