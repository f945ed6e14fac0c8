"""The CLI: ``specdec`` (console script), ``python -m engine.cli`` or ``python -m engine.generate``.

argparse -> preset (``configs/default.yaml`` unless ``--config``) with the flags on top ->
``EngineConfig`` / ``SamplingParams`` -> ``LLM.generate`` -> text and a summary (tokens/s,
acceptance rate, mean accepted length). With no arguments it runs the embedded default model with
n-gram speculation on a built-in, copy-heavy demo prompt, which it also decodes without
speculation (``--baseline``) to print the speedup and that the two texts are identical. Phase
lines (``specdec: loading the model ...``) go to stderr. Errors are one ``error: ...`` line on
stderr and a non-zero exit code (set ``SPECDEC_DEBUG=1`` for the traceback).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any, TextIO

from engine.cli.args import EXIT_FAILED, CliError, merge_overrides, one_line_errors, parse_args
from engine.cli.baseline import compare, print_comparison
from engine.cli.prompts import DEMO_PROMPT, PromptItem, read_prompts, render_prompts
from engine.outputs import EngineMetrics, RequestMetrics, RequestOutput
from engine.presets import DEFAULT_PRESET, build_configs, load_config_file


def _print_outputs(outputs: list[RequestOutput], items: list[PromptItem], out: TextIO) -> None:
    for i, (request, item) in enumerate(zip(outputs, items, strict=True)):
        if len(outputs) > 1:
            print(f"=== prompt {i}: {item.preview()}", file=out)
        if request.error is not None:
            print(f"[request failed: {request.error}]", file=out)
        for sample in request.outputs:
            if len(request.outputs) > 1:
                print(f"--- sample {sample.index}", file=out)
            print(sample.text, file=out)
            print(f"[{len(sample.token_ids)} tokens, finish_reason={sample.finish_reason}]",
                  file=out)


def _stream(llm: Any, prompts: list[Any], params: Any, out: TextIO) -> list[dict[str, Any]]:
    """Print the text as it comes; return every sample's text, tokens and finish reason,
    assembled from the deltas. One sample streams live; several (more prompts, ``n > 1``) are
    printed each as a block, labelled, when it finishes, so they do not interleave token by
    token."""
    live = len(prompts) == 1 and params.n == 1
    samples: dict[tuple[str, int], dict[str, Any]] = {}
    for delta in llm.generate_stream(prompts, params):
        key = (delta.request_id, delta.index)
        sample = samples.setdefault(key, {"request_id": delta.request_id, "index": delta.index,
                                          "text": "", "token_ids": []})
        sample["text"] += delta.text
        sample["token_ids"] += delta.token_ids
        if live:
            print(delta.text, end="", file=out, flush=True)
        if delta.finished:
            sample.update(finish_reason=delta.finish_reason, stop_reason=delta.stop_reason,
                          error=delta.error)
            if not live:
                print(f"--- request {delta.request_id}, sample {delta.index}", file=out)
                print(sample["text"], file=out)
            else:
                print(file=out)
            print(f"[{len(sample['token_ids'])} tokens, finish_reason={delta.finish_reason}]",
                  file=out, flush=True)
    return list(samples.values())


def summary_line(metrics: EngineMetrics, speculating: bool) -> str:
    """One line: throughput and, when speculating, acceptance."""
    line = (f"{metrics.num_generated} tokens in {metrics.elapsed_s:.2f} s: "
            f"{metrics.tokens_per_s:.1f} tokens/s")
    if not speculating:
        return line + " (no speculation)"
    if metrics.num_drafted == 0:
        return line + " | no drafts were verified (nothing worth drafting was found)"
    return (line + f" | acceptance rate {metrics.acceptance_rate:.2f} "
            f"({metrics.num_accepted}/{metrics.num_drafted} drafts)"
            f" | mean accepted length {metrics.mean_accepted_length:.2f} tokens/step")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


TIMESTAMPS = ("arrival_time", "first_token_time", "finished_time")  # RequestMetrics', perf_counter


def _output_json(output: RequestOutput, item: PromptItem) -> dict[str, Any]:
    """One output, its timestamps as wall-clock seconds since the epoch (the engine's are
    ``time.perf_counter`` readings, meaningless outside the process)."""
    doc = {**asdict(output), "input": item.source,
           "acceptance_rate": output.metrics.acceptance_rate,
           "mean_accepted_length": output.metrics.mean_accepted_length}
    offset = time.time() - time.perf_counter()
    for key in TIMESTAMPS:
        if doc["metrics"][key] is not None:
            doc["metrics"][key] += offset
    return doc


def _overall(outputs: list[RequestOutput] | None) -> dict[str, float | None]:
    """Acceptance rate and mean accepted length over every output, with the per-output
    definitions (tokens per step, drafting or not); None after ``--stream``."""
    if outputs is None:
        return {"acceptance_rate": None, "mean_accepted_length": None}
    total = RequestMetrics()
    for output in outputs:
        total.add(output.metrics)
    return {"acceptance_rate": total.acceptance_rate,
            "mean_accepted_length": total.mean_accepted_length}


def write_json(path: str, preset_dict: dict, items: list[PromptItem],
               outputs: list[RequestOutput] | None, streamed: list[dict[str, Any]] | None,
               metrics: EngineMetrics) -> None:
    """Outputs (or, after ``--stream``, the streamed samples), metrics and the effective
    configuration as one JSON document. The top-level ``acceptance_rate`` and
    ``mean_accepted_length`` sum the outputs' counters; ``metrics`` holds the engine's, whose
    ``mean_accepted_length`` counts only the steps that verified drafts (0 when none did)."""
    doc = {
        "config": preset_dict,
        **_overall(outputs),
        "streamed": streamed,
        "outputs": None if outputs is None else [
            _output_json(o, item) for o, item in zip(outputs, items, strict=True)],
        "metrics": asdict(metrics),
    }
    text = json.dumps(_jsonable(doc), indent=2)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as f:
            f.write(text + "\n")


def run(argv: list[str] | None = None) -> int:
    """The whole job; raises on errors (``main`` turns them into one line)."""
    args, overrides = parse_args(argv)
    preset = merge_overrides(load_config_file(getattr(args, "config", DEFAULT_PRESET)), overrides)
    engine_config, sampling = build_configs(preset)  # validate before loading any weights
    items = read_prompts(getattr(args, "prompt", None), getattr(args, "prompts_file", None))
    demo = not items
    if demo:
        items = [DEMO_PROMPT]
    json_path = getattr(args, "json", None)
    out = sys.stderr if json_path == "-" else sys.stdout
    stream = getattr(args, "stream", False)
    speculating = engine_config.speculative_config is not None
    baseline = getattr(args, "baseline", demo and not stream) and speculating
    if baseline and stream:
        raise CliError("--baseline compares whole outputs: drop --stream or --baseline")
    quiet = getattr(args, "no_progress", False)

    from transformers.utils import logging as hf_logging

    from engine.llm import LLM  # heavy import (torch, transformers) after the cheap checks

    hf_logging.disable_progress_bar()  # stderr is for errors (and our own progress) only
    # (a request that fails alone is an "error: request ..." line below, not the API's log line)
    logging.getLogger("specdec").addHandler(logging.NullHandler())
    phase = _phases(quiet)
    model = engine_config.model if isinstance(engine_config.model, str) else "the model"
    phase(f"loading the model ({model}) and building the engine")
    started = time.perf_counter()
    llm = LLM(**{f.name: getattr(engine_config, f.name) for f in fields(engine_config)})
    phase(f"loaded in {time.perf_counter() - started:.1f} s")
    prompts = render_prompts(items, llm, chat=getattr(args, "chat", None))
    outputs = streamed = comparison = None
    use_tqdm = len(prompts) > 1 and not quiet
    if stream:
        streamed = _stream(llm, prompts, sampling, out)
    elif baseline:
        comparison = compare(llm, prompts, sampling, use_tqdm, phase)
        outputs = comparison.outputs
        _print_outputs(outputs, items, out)
    else:
        phase("decoding")
        outputs = llm.generate(prompts, sampling, use_tqdm=use_tqdm)
        _print_outputs(outputs, items, out)
    metrics = comparison.speculative if comparison else llm.get_metrics()
    print(summary_line(metrics, speculating), file=out)
    identical = print_comparison(comparison, out) if comparison else True
    if json_path is not None:
        write_json(json_path, {"engine": preset.engine, "sampling": asdict(sampling)}, items,
                   outputs, streamed, metrics)
    failed = _report_failures(outputs, streamed)
    return EXIT_FAILED if failed or not identical else 0


def _phases(quiet: bool) -> Callable[[str], None]:
    """``phase(text)``: one ``specdec: text`` line on stderr (none with ``--no-progress``), so
    that a run says what it is doing while the model loads and the prompts decode."""
    def phase(text: str) -> None:
        if not quiet:
            print(f"specdec: {text}", file=sys.stderr, flush=True)
    return phase


def _report_failures(outputs: list[RequestOutput] | None,
                     streamed: list[dict[str, Any]] | None) -> int:
    """One ``error:`` line on stderr per request that failed; returns how many did."""
    errors = ([(o.request_id, o.error) for o in outputs if o.error is not None] if outputs
              else [(s["request_id"], s.get("error")) for s in streamed or []
                    if s.get("finish_reason") == "error"])
    for request_id, error in errors:
        print(f"error: request {request_id}: {' '.join(str(error).split())}", file=sys.stderr)
    return len(errors)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: one ``error:`` line and a non-zero exit code instead of a traceback.
    ``specdec serve ...`` runs the server (:mod:`engine.cli.serve`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from engine.cli.serve import main as serve

        return serve(argv[1:])
    return one_line_errors(run, argv)


if __name__ == "__main__":
    sys.exit(main())
