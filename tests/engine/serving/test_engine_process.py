"""The server's engine in a process of its own (``ProcessEngine``), driven as the routes drive it:
outputs equal ``LLM.generate``'s, an abort frees the KV rows, a bad model fails at start with the
engine's own error, and when the engine process dies every waiting client hears of it."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.outputs import RequestOutput
from engine.serving.engine_process import ProcessEngine
from tests.engine.cli.cli_helpers import save_tiny_model

PROMPTS = [[5, 6, 7, 5, 6, 7], [9, 10, 11], [20, 21, 20, 21], [40, 41]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("engine_process"))


def config(model_dir) -> EngineConfig:
    return EngineConfig(model=str(model_dir), device="cpu", max_num_seqs=4, kv_cache_tokens=256,
                        speculative_config={"method": "ngram", "num_speculative_tokens": 3})


async def final_output(engine: ProcessEngine, run) -> RequestOutput | None:
    final = None
    async for item in engine.results(*run):
        if isinstance(item, RequestOutput):
            final = item
    return final


def test_outputs_equal_generate_and_an_abort_frees_the_kv(model_dir):
    engine = ProcessEngine(config(model_dir), max_pending=8)
    assert engine._process.pid != os.getpid()
    free_at_start = engine.stats.num_free_kv_tokens

    async def scenario():
        engine.start(asyncio.get_running_loop())
        runs = [engine.add(None, p, GREEDY) for p in PROMPTS]
        outputs = await asyncio.gather(*(final_output(engine, r) for r in runs))
        long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        run = engine.add(None, PROMPTS[0], long)
        async for _ in engine.results(*run):  # leave after the first delta: a disconnect
            break
        for _ in range(200):
            if engine.num_pending == 0:
                break
            await asyncio.sleep(0.05)
        return outputs

    try:
        outputs = asyncio.run(asyncio.wait_for(scenario(), timeout=120))
        assert engine.num_pending == 0
        assert engine.stats.num_free_kv_tokens == free_at_start
    finally:
        engine.stop()
    reference = LLM(str(model_dir), device="cpu", max_num_seqs=4, kv_cache_tokens=256,
                    speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    expected = reference.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == [e.outputs[0].token_ids
                                                         for e in expected]
    assert engine.engine.metrics.num_drafted > 0  # the engine's counters reached the server


def test_a_model_that_cannot_load_fails_at_start_with_its_error(tmp_path):
    with pytest.raises(ValueError, match="no such local directory"):
        ProcessEngine(EngineConfig(model=str(tmp_path / "missing"), device="cpu"))


def test_a_dead_engine_process_ends_every_waiting_request(model_dir):
    engine = ProcessEngine(config(model_dir), max_pending=8)

    async def scenario():
        engine.start(asyncio.get_running_loop())
        long = SamplingParams(temperature=0, max_tokens=240, ignore_eos=True)
        runs = [engine.add(None, p, long) for p in PROMPTS]
        first = await anext(engine.results(*runs[0]).__aiter__())
        os.kill(engine._process.pid, signal.SIGKILL)
        return first, await asyncio.gather(*(final_output(engine, r) for r in runs[1:]))

    try:
        first, rest = asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    finally:
        engine.stop()
    assert first.token_ids  # it was running
    assert rest == [None, None, None]  # each ended without an output, none hangs
    assert engine.error is not None
    with pytest.raises(RuntimeError, match="the engine stopped"):
        engine.add(None, PROMPTS[0], GREEDY)
    engine.abort("req-0")  # (a client leaving after the end: the pipe is gone, nothing raises)
