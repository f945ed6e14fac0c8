"""Command-line flags of the CLI, generated from the config dataclasses.

Every field of ``EngineConfig``, ``SpeculativeConfig`` and ``SamplingParams`` gets a flag named
after it (``max_tokens`` -> ``--max-tokens``), so a new field cannot be forgotten. Flags default to
"not given": only the flags on the command line override the preset (``--config``). The choices
of ``--method`` and ``--acceptance-method`` are the registered proposers and samplers, those a
user script registered before calling :func:`engine.cli.main.main` included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, NoReturn

from engine.cli.flag_help import FLAG_HELP
from engine.config import (
    ATTENTION_BACKENDS,
    DRAFT_SAMPLE_METHODS,
    DTYPES,
    METHODS_WITHOUT_MODEL,
    EngineConfig,
    SpeculativeConfig,
)
from engine.logprobs import LOGPROBS_MODES
from engine.presets import SPECULATIVE_KEY, Preset
from proposers import available_proposers
from samplers import SamplingParams, available_samplers

# Fields whose flag is not simply ``--field-name``.
SPEC_RENAMES = {"model": "draft-model", "tokenizer": "draft-tokenizer"}
ENGINE_RENAMES = {"num_threads": "threads"}
SAMPLING_RENAMES = {"seed": "request-seed",  # ``--seed`` is the engine seed
                    "num_speculative_tokens": "request-num-speculative-tokens"}  # -k: engine
ENGINE_SKIP = {"speculative_config"}
SAMPLING_SKIP = {"guided_decoding"}  # (structured_outputs' older name: one flag is enough)
NO_SPECULATION = "none"
# (section, field): flag
SHORT_FLAGS = {("spec", "num_speculative_tokens"): "-k", ("sampling", "n"): "-n"}


def _choices() -> dict[str, tuple[str, ...]]:
    """The allowed values of the fields that take a name (read when the parser is built)."""
    return {"method": (*available_proposers(), NO_SPECULATION),
            "acceptance_method": tuple(available_samplers()),
            "draft_sample_method": DRAFT_SAMPLE_METHODS, "dtype": DTYPES,
            "logprobs_mode": LOGPROBS_MODES, "attention_backend": ATTENTION_BACKENDS}


class CliError(Exception):
    """A bad command line: printed as one ``error: ...`` line, exit code 2."""


EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def one_line_errors(run: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """``run(argv)`` with the command line's promise: bad input is one ``error:`` line and exit
    code 2, any other failure one ``error: Type: message`` line and exit code 1, never a
    traceback (``SPECDEC_DEBUG=1`` shows it)."""
    try:
        return run(argv)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except (CliError, ValueError, TypeError, FileNotFoundError) as exc:
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the CLI's promise: one line, no traceback
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        print(f"error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_FAILED


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise ``CliError`` instead of printing the usage."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message)


@dataclass(frozen=True)
class FlagSpec:
    """One generated flag: which dataclass field it sets (``section`` = engine/spec/sampling)."""

    section: str
    field: str
    dest: str


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``int | None`` -> (int, True); ``str | list[str] | None`` -> (itself, True)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else tp), True
    return tp, False


def _is_list(tp: Any) -> Any | None:
    """The item type when ``tp`` is ``list[X]`` or ``str | list[str]``, else None."""
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0]
    for arg in typing.get_args(tp) if typing.get_origin(tp) in (typing.Union,
                                                                 types.UnionType) else ():
        if typing.get_origin(arg) is list:
            return typing.get_args(arg)[0]
    return None


def _scalar(kind: type, optional: bool, flag: str):
    """An argparse ``type=`` that parses one value; ``none`` gives None for optional fields."""

    def parse(text: str) -> Any:
        if optional and text.lower() in ("none", "null"):
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} expects {kind.__name__}{' or none' if optional else ''}, "
                f"got {text!r}") from None

    parse.__name__ = kind.__name__
    return parse


def _int_list(flag: str):
    def parse(text: str) -> list[int]:
        try:
            return [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} expects integers (repeat the flag or use a comma list), got {text!r}"
            ) from None

    return parse


def _json_dict(flag: str):
    def parse(text: str) -> dict:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{flag} expects JSON, got {text!r}: {exc}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} expects a JSON object, got {text!r}")
        return value

    return parse


def _add_field_flag(group: argparse._ArgumentGroup, section: str, cls: type, name: str,
                    tp: Any, default: Any, flag_name: str, preset: dict[str, Any] | None,
                    preset_name: str) -> FlagSpec:
    flag = f"--{flag_name}"
    choices = _choices()
    dest = f"{section}__{name}"
    short = SHORT_FLAGS.get((section, name))
    names = [flag] + ([short] if short else [])
    base, optional = _unwrap_optional(tp)
    if preset is not None and name in preset:  # what a run gets: the preset's value
        shown = f"{preset[name]!r}, from {preset_name}"
    else:
        shown = "none" if default is MISSING else f"{default!r}"
    what = FLAG_HELP.get((section, name), f"{cls.__name__}.{name}")
    kwargs: dict[str, Any] = {"dest": dest, "help": f"{what} (default: {shown})"}
    item = _is_list(base)
    if base is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif name in choices:
        kwargs["choices"] = choices[name]
    elif item is int:
        kwargs.update(action="extend", type=_int_list(flag), metavar="ID[,ID...]")
    elif item is str:
        kwargs.update(action="append", metavar="TEXT")
        kwargs["help"] += " (repeat the flag for several)"
    elif typing.get_origin(base) is dict or is_dataclass(base):
        kwargs.update(type=_json_dict(flag), metavar="JSON")  # (a dataclass: its fields)
    elif base is Any:
        kwargs.update(metavar="NAME")
    elif base in (int, float, str):
        kwargs.update(type=_scalar(base, optional, flag), metavar=base.__name__.upper())
    else:
        raise TypeError(f"no command-line flag rule for {section}.{name}: {tp!r}")
    group.add_argument(*names, **kwargs)
    return FlagSpec(section, name, dest)


def _add_dataclass_flags(group: argparse._ArgumentGroup, section: str, cls: type,
                         renames: dict[str, str], skip: set[str],
                         preset: dict[str, Any] | None, preset_name: str) -> list[FlagSpec]:
    hints = typing.get_type_hints(cls)
    specs = []
    for f in fields(cls):
        if not f.init or f.name in skip:
            continue
        flag_name = renames.get(f.name, f.name.replace("_", "-"))
        specs.append(_add_field_flag(group, section, cls, f.name, hints[f.name], f.default,
                                     flag_name, preset, preset_name))
    return specs


def build_parser(preset: Preset | None = None) -> tuple[OneLineParser, list[FlagSpec]]:
    """The parser and the list of generated dataclass flags; ``--help`` shows each flag's
    value in ``preset`` (what a run gets without the flag), else the dataclass default."""
    name = _preset_label(preset)
    sampling = None if preset is None else preset.sampling
    parser = OneLineParser(
        prog="specdec",
        description="Generate text with speculative decoding. With no arguments: the embedded "
                    "default model (smollm2-135m), n-gram speculation, on a built-in demo prompt.",
        argument_default=argparse.SUPPRESS)
    io = parser.add_argument_group("input and output")
    io.add_argument("--config", help="a YAML preset: a path or a name from configs/ "
                    "(default: configs/default.yaml); flags override it")
    io.add_argument("--prompt", action="append", help="a prompt (repeat for a batch)")
    io.add_argument("--prompts-file", help="one prompt per line, or .jsonl with "
                    '{"prompt": ...} or {"messages": [...]} per line; run as one batch')
    io.add_argument("--chat", action=argparse.BooleanOptionalAction,
                    help="apply the chat template to --prompt / plain-text prompts (default: "
                    "when the tokenizer has one, as instruct models do; --no-chat: raw "
                    "completion)")
    io.add_argument("--stream", action="store_true", help="print text as tokens are accepted")
    io.add_argument("--json", metavar="PATH", help="write outputs and metrics as JSON ('-': "
                    "stdout, the text and summary then go to stderr)")
    io.add_argument("--no-progress", action="store_true", help="no tqdm progress bar and no "
                    "phase lines ('specdec: loading the model ...') on stderr")
    io.add_argument("--baseline", action=argparse.BooleanOptionalAction,
                    help="also decode the prompts without speculation, in the same engine after "
                    "a warm-up, and print the speedup and whether the texts are identical "
                    "(default: on for the built-in demo prompt, off otherwise)")
    specs = add_engine_flags(parser, preset)
    specs += _add_dataclass_flags(parser.add_argument_group("sampling (SamplingParams)"),
                                  "sampling", SamplingParams, SAMPLING_RENAMES, SAMPLING_SKIP,
                                  sampling, name)
    return parser, specs


def _preset_label(preset: Preset | None) -> str:
    """How ``--help`` names where a default comes from."""
    if preset is None:
        return "no preset"
    return preset.path.name if preset.path is not None else "the preset"


def add_engine_flags(parser: argparse.ArgumentParser,
                     preset: Preset | None = None) -> list[FlagSpec]:
    """The ``EngineConfig`` and ``SpeculativeConfig`` flags (the server takes these too)."""
    name = _preset_label(preset)
    engine = None if preset is None else preset.engine
    spec = None if preset is None else (preset.engine.get(SPECULATIVE_KEY) or {})
    specs = _add_dataclass_flags(parser.add_argument_group("engine (EngineConfig)"), "engine",
                                 EngineConfig, ENGINE_RENAMES, ENGINE_SKIP, engine, name)
    spec_group = parser.add_argument_group(
        "speculation (SpeculativeConfig); --method none turns it off")
    specs += _add_dataclass_flags(spec_group, "spec", SpeculativeConfig, SPEC_RENAMES, set(),
                                  spec, name)
    return specs


def split_overrides(args: argparse.Namespace,
                    specs: list[FlagSpec]) -> dict[str, dict[str, Any]]:
    """The dataclass values given on the command line, per section (taken out of ``args``)."""
    overrides: dict[str, dict[str, Any]] = {"engine": {}, "spec": {}, "sampling": {}}
    for spec in specs:
        if hasattr(args, spec.dest):
            overrides[spec.section][spec.field] = getattr(args, spec.dest)
            delattr(args, spec.dest)
    return overrides


def preset_for_help(argv: list[str]) -> Preset | None:
    """The preset ``argv`` names (``--config``, else the default one), read only so that
    ``--help`` can show what a run gets; None when it cannot be read (the run will say why)."""
    from engine.presets import DEFAULT_PRESET, load_config_file

    name = DEFAULT_PRESET
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--config="):
            name = arg.split("=", 1)[1]
    try:
        return load_config_file(name)
    except (ValueError, OSError):
        return None


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict[str, dict]]:
    """Parse ``argv``; returns the namespace and the given dataclass overrides per section."""
    argv = sys.argv[1:] if argv is None else argv
    parser, specs = build_parser(preset_for_help(argv) if "-h" in argv or "--help" in argv
                                 else None)
    args = parser.parse_args(argv)
    return args, split_overrides(args, specs)


# Speculation keys that only make sense for one method: dropped when ``--method`` changes it.
METHOD_ONLY_KEYS = {
    "ngram": ("prompt_lookup_min", "prompt_lookup_max"),
    "draft_model": ("model", "tokenizer"),
    "early_exit": ("num_early_exit_layers",),
}


def merge_overrides(preset: Preset, overrides: dict[str, dict[str, Any]]) -> Preset:
    """The preset with the command-line values on top (a new ``Preset``; inputs untouched)."""
    engine = {**preset.engine, **overrides["engine"]}
    sampling = {**preset.sampling, **overrides["sampling"]}
    spec_flags = dict(overrides["spec"])
    method = spec_flags.get("method")
    if method == NO_SPECULATION:
        spec_flags.pop("method")
        if spec_flags:
            flags = ", ".join(f"--{SPEC_RENAMES.get(k, k.replace('_', '-'))}" for k in spec_flags)
            raise CliError(f"--method none turns speculation off; drop {flags}")
        engine[SPECULATIVE_KEY] = None
    elif spec_flags:
        spec = dict(preset.engine.get(SPECULATIVE_KEY) or {})
        preset_method = spec.get("method")
        if method is None and "model" in spec_flags and preset_method in METHODS_WITHOUT_MODEL:
            for key in ("method", *METHOD_ONLY_KEYS.get(preset_method, ())):
                spec.pop(key, None)  # (the method is inferred from the model, as in vLLM)
        if method is not None and method != spec.get("method"):
            for other, keys in METHOD_ONLY_KEYS.items():
                if other != method:
                    for key in keys:
                        spec.pop(key, None)
        engine[SPECULATIVE_KEY] = {**spec, **spec_flags}
    return Preset(engine=engine, sampling=sampling, path=preset.path)
