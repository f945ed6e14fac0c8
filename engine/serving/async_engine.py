"""The engine loop for a server: requests arrive while others run.

One thread owns the :class:`~engine.llm_engine.LLMEngine` and is the only one that touches it.
The event loop hands it commands (add, abort) through a thread-safe queue; the thread takes all
that are waiting before each step, so a request that arrives joins the running batch at the next
step, and it sleeps on the queue when nothing runs. After each step it turns every updated
sample into a :class:`~engine.outputs.StreamDelta` and posts it to that request's
``asyncio.Queue`` on the event loop; when a request's last sample finishes it posts the request's
final :class:`~engine.outputs.RequestOutput` and forgets it. An abort (a client that
disconnected) takes the request out at the next step and frees its KV rows at once.

The number of requests held (waiting or running) is bounded: :meth:`AsyncEngine.add` raises
:class:`QueueFull` beyond ``max_pending``, which the server answers with 429 and ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Container, Iterable
from dataclasses import dataclass, field

from engine.llm import build_output
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput, StreamDelta
from samplers import SamplingParams


class QueueFull(Exception):
    """The engine holds ``max_pending`` requests already."""


@dataclass
class _Request:
    request_id: str
    out: asyncio.Queue  # StreamDelta, then the final RequestOutput, then None
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None


@dataclass
class EngineStats:
    """What the server's /metrics reads (updated by the engine thread)."""

    num_waiting: int = 0
    num_running: int = 0
    num_free_kv_tokens: int = 0
    steps: int = 0


class EngineFrontend:
    """What the server's routes call, whichever side runs the engine: ``add`` / ``abort`` /
    ``results`` from the event loop, ``stats`` and ``error`` to read. A subclass runs the engine
    (:class:`AsyncEngine`: a thread of this process; :class:`~engine.serving.engine_process.
    ProcessEngine`: a process of its own) and takes the commands :meth:`_submit` hands it."""

    def __init__(self, max_pending: int = 256,
                 on_step: Callable[[], None] | None = None,
                 on_finish: Callable[[RequestOutput, float, float | None, float], None]
                 | None = None,
                 on_abort: Callable[[float, float | None, float], None] | None = None) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending} is invalid: allowed an integer >= 1")
        self.max_pending = max_pending
        self.on_step = on_step  # called after every engine step (metrics)
        # on_finish(output, arrival, first token time or None, finish time)
        self.on_finish = on_finish
        # on_abort(arrival, first token time or None, abort time): its client went away
        self.on_abort = on_abort
        self.stats = EngineStats()
        self._num_pending = 0  # added and not yet finished
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None  # what stopped the engine, if anything

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _submit(self, command: tuple) -> None:
        """Hand ``("add", request, prompt, prompt_token_ids, params)`` or ``("abort", id)`` to
        the engine's side."""
        raise NotImplementedError

    @property
    def num_pending(self) -> int:
        return self._num_pending

    def add(self, prompt: str | None, prompt_token_ids: list[int],
            params: SamplingParams) -> tuple[str, asyncio.Queue]:
        """Queue one request; returns its id and the queue its deltas and output arrive on.
        Raises :class:`QueueFull` when ``max_pending`` requests are held already."""
        if self.error is not None:
            raise RuntimeError(f"the engine stopped: {self.error}")
        with self._lock:
            if self._num_pending >= self.max_pending:
                raise QueueFull(f"{self._num_pending} requests are queued or running "
                                f"(max_pending={self.max_pending})")
            self._num_pending += 1
        request_id = f"req-{next(self._ids)}"
        out: asyncio.Queue = asyncio.Queue()
        self._submit(("add", _Request(request_id, out), prompt, prompt_token_ids, params))
        if self.error is not None:  # (the engine stopped meanwhile: it will not read it)
            out.put_nowait(None)
        return request_id, out

    def abort(self, request_id: str) -> None:
        """Take the request out at the next step (a client that went away)."""
        self._submit(("abort", request_id))

    async def results(self, request_id: str,
                      out: asyncio.Queue) -> AsyncIterator[StreamDelta | RequestOutput]:
        """The request's deltas, then its final output. Leaving early (a disconnect: the task is
        cancelled) aborts the request."""
        finished = False
        try:
            while True:
                item = await out.get()
                if item is None:
                    finished = True
                    return
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def _deliver_step(self, requests: dict[str, _Request],
                      deltas: list[tuple[str, StreamDelta]],
                      outputs: list[tuple[str, RequestOutput]], ended: Iterable[str] = ()) -> None:
        """A step's deltas, final outputs and aborted requests (``ended``) to their queues, in
        one wake-up of the event loop (not one per delta: each is a write to the loop's
        self-pipe and a turn of the loop); finished requests leave ``requests``."""
        now = time.perf_counter()
        posts: list[tuple[asyncio.Queue, StreamDelta | RequestOutput | None]] = []
        for request_id, delta in deltas:
            request = requests[request_id]
            if request.first_token is None and delta.token_ids:
                request.first_token = now
            posts.append((request.out, delta))
        for request_id, output in outputs:
            request = requests.pop(request_id)
            self._finished(request)
            if self.on_finish is not None:
                self.on_finish(output, request.arrival, request.first_token, now)
            posts += [(request.out, output), (request.out, None)]
        for request_id in ended:  # aborted: its client is gone or going
            request = requests.pop(request_id)
            self._aborted(request, now)
            posts.append((request.out, None))
        if posts and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_deliver, posts)

    def _finished(self, request: _Request) -> None:
        with self._lock:
            self._num_pending -= 1

    def _aborted(self, request: _Request, now: float) -> None:
        self._finished(request)
        if self.on_abort is not None:
            self.on_abort(request.arrival, request.first_token, now)

    def _post(self, request: _Request, item: StreamDelta | RequestOutput | None) -> None:
        if not self._loop.is_closed():  # (a server shutting down: nobody reads any more)
            self._loop.call_soon_threadsafe(request.out.put_nowait, item)


class AsyncEngine(EngineFrontend):
    """Runs ``engine`` on a thread of this process; ``add`` / ``abort`` from the event loop."""

    def __init__(self, engine: LLMEngine, max_pending: int = 256,
                 on_step: Callable[[], None] | None = None,
                 on_finish: Callable[[RequestOutput, float, float | None, float], None]
                 | None = None,
                 on_abort: Callable[[float, float | None, float], None] | None = None) -> None:
        super().__init__(max_pending, on_step, on_finish, on_abort)
        self.engine = engine
        self.stats.num_free_kv_tokens = engine.runner.num_free_tokens
        self._commands: queue.Queue = queue.Queue()
        self._requests: dict[str, _Request] = {}  # engine thread only
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._commands.put(("stop",))
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _submit(self, command: tuple) -> None:
        self._commands.put(command)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                block = not self.engine.has_work()
                if not self._take_commands(block):
                    return
                if self.engine.has_work():
                    self._step()
        except BaseException as exc:  # noqa: BLE001 - every waiting client must hear of it
            self.error = exc
            for request in list(self._requests.values()):
                self._post(request, None)
            while True:  # and the requests still queued for the thread
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if command[0] == "add":
                    self._post(command[1], None)

    def _take_commands(self, block: bool) -> bool:
        """Apply every command waiting (block for the first when idle); False on stop."""
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return True
        while True:
            if command[0] == "stop":
                return False
            if command[0] == "add":
                self._add(*command[1:])
            else:
                self._abort(command[1])
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, request: _Request, prompt: str | None, prompt_token_ids: list[int],
             params: SamplingParams) -> None:
        self._requests[request.request_id] = request
        self.engine.add_request(request.request_id, prompt, prompt_token_ids, params)

    def _abort(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return  # finished meanwhile
        self.engine.discard_request(request_id)  # frees its KV rows now
        self._aborted(request, time.perf_counter())
        self._post(request, None)
        self._update_stats()

    def _step(self) -> None:
        self._deliver_step(self._requests, *step_items(self.engine, self._requests))
        self.stats.steps += 1
        self._update_stats()
        if self.on_step is not None:
            self.on_step()

    def _update_stats(self) -> None:
        self.stats = engine_stats(self.engine, self.stats.steps)



def engine_stats(engine: LLMEngine, steps: int) -> EngineStats:
    """The gauges /metrics reads, as the engine stands now."""
    scheduler = engine.scheduler
    return EngineStats(len(scheduler.waiting), len(scheduler.running),
                       engine.runner.num_free_tokens, steps)


def step_items(engine: LLMEngine, held: Container[str],
               ) -> tuple[list[tuple[str, StreamDelta]], list[tuple[str, RequestOutput]]]:
    """Run one engine step; return its stream deltas and the final outputs of the requests whose
    last sample finished (those are forgotten by the engine), for the requests in ``held`` only
    (a request aborted meanwhile is not reported)."""
    updated = engine.step()
    deltas: list[tuple[str, StreamDelta]] = []
    done: dict[str, None] = {}  # (ordered)
    for seq in updated:
        if seq.request_id not in held:
            continue
        delta = seq.take_delta()
        if delta is not None:
            deltas.append((seq.request_id, delta))
        if all(s.is_finished for s in engine.requests[seq.request_id]):
            done[seq.request_id] = None
    return deltas, [(rid, build_output(engine.pop_request(rid))) for rid in done]


def _deliver(posts: list[tuple[asyncio.Queue, StreamDelta | RequestOutput | None]]) -> None:
    """On the event loop: a step's items, each to its request's queue, in order."""
    for out, item in posts:
        out.put_nowait(item)
