"""The server's engine in a process of its own (what ``specdec serve`` runs by default).

Why: in one process the engine thread's host work (scheduling, drafting, verification, the
step's bookkeeping) and the event loop's (HTTP, JSON, server-sent events for every delta) take
turns on one GIL, and at batch 32 the server added a third to the time per output token (docs/
performance.md, "Serving"). Here the engine runs in a child process (``spawn``, so CUDA starts
clean there), as vLLM's engine core does, and the two sides talk through two one-way pipes:

- commands, event loop -> engine: ``("add", request_id, prompt, prompt_token_ids, params)``,
  ``("abort", request_id)``, ``("stop",)``;
- events, engine -> a reader thread of the server: one message per step, ``("step", deltas,
  outputs, ended, stats, counters)`` (the step's stream deltas and finished outputs per request
  id, the ids of requests aborted since, the queue and KV gauges, the speculation counters), and
  ``("failed", message)`` if a step raises.

The engine process takes every command waiting before each step, so a request that arrives joins
the running batch at the next step, and it sleeps on the pipe when nothing runs; an abort frees
the request's KV rows at once. The server's side keeps each request's ``asyncio.Queue``, arrival
and first-token times; the reader thread hands a step's items to the event loop in one wake-up.
If the engine process dies, every waiting client gets its end and the server answers 503.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput, StreamDelta
from engine.request_checks import check_sampling_params
from engine.serving.async_engine import (
    EngineFrontend,
    EngineStats,
    _Request,
    engine_stats,
    step_items,
)
from samplers import SamplingParams
from samplers.structured import Grammars

START_TIMEOUT_S = 1800.0  # a first load dequantizes the default model: minutes on 2 cores


@dataclass
class EngineCounters:
    """The engine's speculation counters since start, as the server's metrics read them
    (``engine.metrics``'s fields of the same names)."""

    num_drafted: int = 0
    num_accepted: int = 0
    num_generated: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_spec_request_steps: int = 0  # (request, step) pairs that verified drafts


class EngineView:
    """What the routes read of the engine on the server's side: tokenizer, vocabulary, context
    length, counters, and the same request checks as :meth:`LLMEngine.check_params`."""

    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int, max_k: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.metrics = EngineCounters(drafted_at=[0] * max_k, accepted_at=[0] * max_k)
        # (a constraint that does not compile is a 400 before the request reaches the engine)
        self.grammars = Grammars(tokenizer, vocab_size, ())

    def check_params(self, params: SamplingParams) -> None:
        check_sampling_params(params, self.vocab_size, self.tokenizer, self.grammars)


class ProcessEngine(EngineFrontend):
    """Runs an :class:`LLMEngine` built from ``config`` in a child process; blocks until it is
    ready, raising the engine's own ``ValueError`` / ``TypeError`` when it cannot be built."""

    def __init__(self, config: EngineConfig, max_pending: int = 256,
                 on_step: Any = None, on_finish: Any = None, on_abort: Any = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        super().__init__(max_pending, on_step, on_finish, on_abort)
        ctx = mp.get_context("spawn")
        commands_out, commands_in = ctx.Pipe(duplex=False)
        events_out, events_in = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_engine_main, args=(config, commands_out, events_in),
                                    name="specdec-engine", daemon=True)
        self._process.start()
        commands_out.close()
        events_in.close()
        self._commands, self._events = commands_in, events_out
        if not self._events.poll(start_timeout_s):
            self._process.terminate()
            raise RuntimeError(f"the engine process did not start in {start_timeout_s:.0f} s")
        try:
            ready = self._events.recv()
        except EOFError:
            raise RuntimeError(f"the engine process exited while starting (exit code "
                               f"{self._process.join(5) or self._process.exitcode})") from None
        if ready[0] == "error":
            _, kind, message = ready
            self._process.join(10)
            raise {"ValueError": ValueError, "TypeError": TypeError}.get(kind, RuntimeError)(
                message)
        _, tokenizer, vocab_size, max_model_len, self.max_k, free_tokens = ready
        self.engine = EngineView(tokenizer, vocab_size, max_model_len, self.max_k)
        self.stats.num_free_kv_tokens = free_tokens
        self._requests: dict[str, _Request] = {}
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def start(self, loop: Any) -> None:
        self._loop = loop
        self._reader = threading.Thread(target=self._read, name="specdec-engine-events",
                                        daemon=True)
        self._reader.start()

    def stop(self) -> None:
        self._submit(("stop",))
        self._process.join(30)
        if self._process.is_alive():
            self._process.terminate()
        if self._reader is not None:
            self._reader.join(5)

    def _submit(self, command: tuple) -> None:
        if command[0] == "add":
            request = command[1]
            self._requests[request.request_id] = request
            command = ("add", request.request_id, *command[2:])
        try:
            with self._send_lock:
                self._commands.send(command)
        except (OSError, ValueError):  # the engine process is gone: the reader says so too
            if self.error is None:
                self.error = RuntimeError(f"the engine process exited (exit code "
                                          f"{self._process.exitcode})")

    # ---------------------------------------------------------------- the reader thread
    def _read(self) -> None:
        try:
            while True:
                message = self._events.recv()
                if message[0] == "failed":
                    raise RuntimeError(message[1])
                self._on_step(*message[1:])
        except (EOFError, OSError, RuntimeError) as exc:
            self.error = exc if isinstance(exc, RuntimeError) else RuntimeError(
                f"the engine process exited (exit code {self._process.exitcode})")
            for request in list(self._requests.values()):
                self._post(request, None)

    def _on_step(self, deltas: list[tuple[str, StreamDelta]],
                 outputs: list[tuple[str, RequestOutput]], ended: list[str],
                 stats: EngineStats, counters: EngineCounters) -> None:
        self._deliver_step(self._requests, deltas, outputs, ended)
        self.stats = stats
        self.engine.metrics = counters
        if self.on_step is not None:
            self.on_step()


# ---------------------------------------------------------------- the engine process
def _engine_main(config: EngineConfig, commands: Any, events: Any) -> None:
    try:
        engine = LLMEngine(config)
    except BaseException as exc:  # noqa: BLE001 - the server reports it and exits
        events.send(("error", type(exc).__name__, str(exc)))
        return
    spec = config.speculative_config
    max_k = spec.num_speculative_tokens if spec is not None and engine.proposer else 0
    events.send(("ready", engine.tokenizer, engine.vocab_size, engine.max_model_len, max_k,
                 engine.runner.num_free_tokens))
    held: set[str] = set()
    steps = 0
    try:
        while True:
            ended: list[str] = []
            if not _take_commands(engine, commands, held, ended, block=not engine.has_work()):
                return
            if not engine.has_work() and not ended:
                continue  # (an abort of a request that had finished: nothing to report)
            ran = engine.has_work()
            deltas, outputs = step_items(engine, held) if ran else ([], [])
            held.difference_update(rid for rid, _ in outputs)
            steps += ran
            events.send(("step", deltas, outputs, ended, engine_stats(engine, steps),
                         _counters(engine)))
    except BaseException as exc:  # noqa: BLE001 - every waiting client must hear of it
        events.send(("failed", f"{type(exc).__name__}: {exc}"))


def _take_commands(engine: LLMEngine, commands: Any, held: set[str], ended: list[str],
                   block: bool) -> bool:
    """Apply every command waiting (wait for one when idle); False on stop."""
    if not block and not commands.poll():
        return True
    while True:
        command = commands.recv()
        if command[0] == "stop":
            return False
        if command[0] == "add":
            _, request_id, prompt, prompt_token_ids, params = command
            held.add(request_id)
            engine.add_request(request_id, prompt, prompt_token_ids, params)
        elif command[1] in held:
            held.discard(command[1])
            engine.discard_request(command[1])  # frees its KV rows now
            ended.append(command[1])
        if not commands.poll():
            return True


def _counters(engine: LLMEngine) -> EngineCounters:
    m = engine.metrics
    return EngineCounters(m.num_drafted, m.num_accepted, m.num_generated, list(m.drafted_at),
                          list(m.accepted_at), m.prefix_cache_queries, m.prefix_cache_hits,
                          m.num_spec_request_steps)
