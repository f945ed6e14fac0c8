"""``python -m engine.serve`` / ``specdec serve``: the OpenAI-compatible server.

Takes the engine and speculation flags of the CLI (``--model``, ``--method``, ``-k``, ...) on top
of a preset (``--config``, default ``configs/default.yaml``; its sampling section is not used:
each request brings its own), plus ``--host``, ``--port``, ``--served-model-name``,
``--max-pending`` (requests held at once before new ones get 429), ``--api-key`` (the ``/v1``
routes then need ``Authorization: Bearer <key>``) and ``--engine-process`` (the
default: the engine runs in a process of its own, :mod:`engine.serving.engine_process`;
``--no-engine-process`` runs it on a thread of the server's process). With no arguments it serves
the embedded default model with n-gram speculation on 127.0.0.1:8000.
"""

from __future__ import annotations

import argparse
import os
import sys

from engine.cli.args import (
    OneLineParser,
    add_engine_flags,
    merge_overrides,
    one_line_errors,
    preset_for_help,
    split_overrides,
)
from engine.presets import DEFAULT_PRESET, build_configs, load_config_file

API_KEY_ENV = "SPECDEC_API_KEY"


def parse(argv: list[str]) -> tuple[argparse.Namespace, object]:
    parser = OneLineParser(prog="specdec serve", argument_default=argparse.SUPPRESS,
                           description="An OpenAI-compatible server (/v1/completions, "
                                       "/v1/chat/completions, /v1/models, /health, /metrics).")
    server = parser.add_argument_group("server")
    server.add_argument("--config", help="a YAML preset: a path or a shipped name (default: "
                        "default)")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--served-model-name", help="the model id clients use (default: the "
                        "--model value)")
    server.add_argument("--max-pending", type=int, default=256, help="requests queued or "
                        "running at once; more get 429 with Retry-After (default: 256)")
    server.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help="requests to /v1/... must send 'Authorization: Bearer <key>' "
                        "(else 401); /health, /metrics, /version and /tokenize stay open, as in "
                        f"vLLM (default: ${API_KEY_ENV}, or no key)")
    server.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                        help="run the engine in a process of its own, apart from the HTTP "
                        "event loop (default: on)")
    specs = add_engine_flags(parser, preset_for_help(argv) if "-h" in argv or "--help" in argv
                             else None)
    args = parser.parse_args(argv)
    overrides = split_overrides(args, specs)
    preset = merge_overrides(load_config_file(getattr(args, "config", DEFAULT_PRESET)),
                             overrides)
    engine_config, _ = build_configs(preset)
    return args, engine_config


def run(argv: list[str] | None = None) -> int:
    args, engine_config = parse(sys.argv[1:] if argv is None else argv)  # (--help exits here)
    import uvicorn
    from transformers.utils import logging as hf_logging

    from engine.llm_engine import LLMEngine
    from engine.serving.app import build_app
    from engine.serving.async_engine import AsyncEngine
    from engine.serving.engine_process import ProcessEngine
    from engine.serving.metrics import ServerMetrics

    hf_logging.disable_progress_bar()
    metrics_holder: list[ServerMetrics] = []
    hooks = {"on_step": lambda: metrics_holder[0].on_step(),
             "on_finish": lambda *a: metrics_holder[0].on_finish(*a),
             "on_abort": lambda *a: metrics_holder[0].on_abort(*a)}
    if args.engine_process:
        async_engine = ProcessEngine(engine_config, args.max_pending, **hooks)
        max_k = async_engine.max_k
    else:
        engine = LLMEngine(engine_config)
        async_engine = AsyncEngine(engine, args.max_pending, **hooks)
        spec = engine_config.speculative_config
        max_k = spec.num_speculative_tokens if spec is not None and engine.proposer else 0
    name = getattr(args, "served_model_name", None) or (
        engine_config.model if isinstance(engine_config.model, str) else "model")
    metrics_holder.append(ServerMetrics(async_engine, max_k, name))
    app = build_app(async_engine, name, metrics_holder[0], args.api_key or None)
    print(f"specdec: serving {name} on http://{args.host}:{args.port}/v1", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def main(argv: list[str] | None = None) -> int:
    return one_line_errors(run, argv)

