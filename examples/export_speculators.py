"""Export a draft head for vLLM and SGLang: a speculators-format directory, checked against its
target, with the target's name those servers load it by.

    python examples/export_speculators.py HEAD_DIR OUT_DIR --target smollm2-135m \\
        --verifier HuggingFaceTB/SmolLM2-135M-Instruct --speculative-tokens 3
    vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --speculative-config '{"model": "OUT_DIR"}'

``HEAD_DIR`` is an EAGLE-3 head (``train_draft_head.py --arch eagle3`` or the speculators
library): it is loaded against ``--target`` (its hidden size, layers and vocabulary), then
written with ``--verifier`` as ``speculators_config.verifier.name_or_path``, ``--speculative-
tokens`` as its proposal's ``speculative_tokens`` and ``--dtype``. Its weights keep their
names and values (rounded to ``--dtype``); written and loaded again at one dtype, a head drafts
what it drafted before (``tests/proposers/test_eagle3.py``).

A head of this engine's ``eagle`` method (``draft_head.json``) is refused: no speculators type
that vLLM or SGLang load computes it (docs/design.md, "EAGLE-3 heads and the speculators
format", says why); train an EAGLE-3 head for them instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.runner.loader import load_model  # noqa: E402
from proposers.head_model import CONFIG_NAME as EAGLE_CONFIG  # noqa: E402
from proposers.speculators import load_eagle3, read_config, rope_fields, save_eagle3  # noqa: E402

OLD_FORMAT = ("{path} is a head of method 'eagle' (draft_head.json): it normalises the target's "
              "final hidden state before its fusion layer and reads its prediction out through "
              "the target's output head with no norm, which no speculators type that vLLM or "
              "SGLang load computes (speculators' 'eagle' type normalises only the token "
              "embedding, and vLLM's speculators loader takes eagle3); train an EAGLE-3 head "
              "with examples/train_draft_head.py --arch eagle3")


def export(source: Path, out: Path, target: str, verifier: str | None, tokens: int | None,
           dtype: str | None) -> dict:
    """Write ``source``'s head to ``out``; returns the written config."""
    if (source / EAGLE_CONFIG).is_file():
        raise ValueError(OLD_FORMAT.format(path=source))
    config = read_config(source)
    model, _ = load_model(target, dtype="float32", device="cpu")
    vocab = model.get_output_embeddings().weight.shape[0]
    head = load_eagle3(source, model.config, vocab)
    if dtype is not None:
        head = head.to(getattr(torch, dtype))
    spec = config.get("speculators_config") or {}
    old_verifier = spec.get("verifier") or {}
    methods = spec.get("proposal_methods") or [{}]
    layer = {k: v for k, v in config["transformer_layer_config"].items()
             if k in ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")}
    save_eagle3(head, out, layer or rope_fields(model.config),
                verifier or old_verifier.get("name_or_path") or target,
                old_verifier.get("architectures")
                or list(getattr(model.config, "architectures", None) or [type(model).__name__]),
                tokens or methods[0].get("speculative_tokens") or 3, config.get("specdec"))
    load_eagle3(out, model.config, vocab)  # (what the engine, and the test, load)
    return json.loads((out / "config.json").read_text())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="the head's directory")
    p.add_argument("out", type=Path, help="where the speculators directory goes")
    p.add_argument("--target", default="smollm2-135m",
                   help="the target it drafts for, as this engine loads it (alias, path, id)")
    p.add_argument("--verifier", default=None,
                   help="the target's name for vLLM / SGLang (default: the head's own, else "
                        "--target)")
    p.add_argument("--speculative-tokens", type=int, default=None,
                   help="drafts per step vLLM defaults to (default: the head's own, else 3)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="the weights' dtype (default: as stored)")
    args = p.parse_args(argv)
    config = export(args.source, args.out, args.target, args.verifier, args.speculative_tokens,
                    args.dtype)
    print(f"wrote {args.out}: speculators_model_type {config['speculators_model_type']}, "
          f"verifier {config['speculators_config']['verifier']['name_or_path']}")


if __name__ == "__main__":
    main()
