"""The server's engine loop when the engine itself fails: no client waits forever."""

from __future__ import annotations

import asyncio
import threading

from conftest import tiny_model

from engine import LLM, SamplingParams
from engine.serving.async_engine import AsyncEngine
from tests.engine.llm_helpers import tiny_tokenizer


def test_every_client_hears_when_the_engine_loop_stops():
    """Found in review: a request queued while a step crashed was never answered."""
    engine = LLM(tiny_model("llama", vocab_size=32), tokenizer=tiny_tokenizer(32)).engine
    stepping = threading.Event()

    def failing_step():
        stepping.set()
        threading.Event().wait(0.3)  # a slow step, then a crash
        raise RuntimeError("CUDA error: an illegal memory access")

    engine.step = failing_step
    params = SamplingParams(temperature=0, max_tokens=4)

    async def scenario() -> list[list[object]]:
        loop_engine = AsyncEngine(engine, max_pending=8)
        loop_engine.start(asyncio.get_running_loop())
        first = loop_engine.add(None, [5, 6, 7], params)
        await asyncio.get_running_loop().run_in_executor(None, stepping.wait)
        second = loop_engine.add(None, [8, 9], params)  # queued during the failing step
        results = []
        for run in (first, second):
            items = [item async for item in loop_engine.results(*run)]
            results.append(items)
        late = loop_engine.add(None, [5], params) if loop_engine.error is None else None
        assert loop_engine.error is not None and late is None
        loop_engine.stop()
        return results

    results = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert results == [[], []]  # each run ended (no output), none hangs
