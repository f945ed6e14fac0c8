"""One rank of a tensor-parallel engine, for tests/engine/runner/test_tensor_parallel.py (the
two-GPU session, ``python -m benchmarks parallel session``, runs that test on GPUs;
``python -m benchmarks parallel run`` runs the same engine at scale).

``python -m torch.distributed.run --nproc-per-node 2 tests/engine/runner/tp_script.py MODEL_DIR
OUT_JSON DEVICE [KV_CACHE_TOKENS [buckets|plain [SPEC_JSON]]]``: every rank builds the same
``LLM``; a rank > 0 never returns from ``LLM(...)`` (it replays rank 0's steps, then its process
exits); rank 0 runs the calls below and writes what they returned to OUT_JSON. KV_CACHE_TOKENS 0:
the default. ``buckets`` (CPU): every rank's runner decides and "captures" CUDA graph buckets as
on a GPU, with fake captures (:func:`fake_graphs`: a "graph" runs its bucket's padded layout
eagerly when replayed) and each rank its own capture and replay times, so that ranks left to
their own decisions would capture different buckets at different steps; the followers run what
rank 0 sends, and each rank writes the buckets it captured, in order, to OUT_JSON.rankN (at
exit). SPEC_JSON: the speculative config (default: n-gram, k = 3).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from engine import LLM, SamplingParams
from engine.runner.cuda_graphs import CudaGraphs, _Graph
from engine.runner.model_runner import ModelRunner

PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 12], [20, 21, 20, 21, 20], [40, 41, 42]]


class _EagerGraph:
    """A fake CUDA graph: its replay runs the bucket's body on the graph's static inputs."""

    def __init__(self, graphs: CudaGraphs, key: tuple[int, int, int]) -> None:
        self.graphs, self.key, self.owner = graphs, key, None
        self.live = True

    def replay(self) -> None:
        assert self.live, "a released graph was replayed"
        self.owner.output = self.graphs._body(self.owner.inputs, *self.key)

    def reset(self) -> None:
        self.live = False


def fake_graphs(out_path: str) -> None:
    """Every rank: runners decide CUDA graph buckets with fake captures and this rank's own
    times (rank 1: captures three times cheaper, wide replays dearer); at exit ``OUT_JSON.rankN``
    gets the buckets this rank's target runner captured, in order, and how many of its graphs
    were still live when the process group was destroyed (a real graph holding NCCL's
    communicator hangs ``destroy_process_group``)."""
    rank = int(os.environ["RANK"])
    captured: list[list[int]] = []
    fakes: list[_EagerGraph] = []
    live_at_destroy: list[int] = []
    targets: list[CudaGraphs] = []

    def capture(self, batch_size: int, num_new: int, kv_len: int) -> _Graph:
        if self is targets[0]:  # (the target's runner is the first built)
            captured.append([batch_size, num_new, kv_len])
        fake = _EagerGraph(self, (batch_size, num_new, kv_len))
        fakes.append(fake)
        inputs = torch.tensor(self._scratch_inputs(batch_size, num_new), dtype=torch.long)
        fake.owner = graph = _Graph(fake, inputs, None)
        return graph

    def replay_s(self, graph: _Graph) -> float:
        b, n, _ = graph.graph.key
        return 1e-4 * b * n if rank == 0 else 3e-4 * b * n * n

    CudaGraphs._capture = capture
    CudaGraphs._time_replays = replay_s
    CudaGraphs.capture_cost = lambda self, prefill=False: (0.003 if rank == 0 else 0.015) * bool(
        captured)
    plain_init = ModelRunner.__init__

    def with_graphs(self, *args, **kwargs) -> None:
        plain_init(self, *args, **kwargs)
        self.use_graph_buckets(4)
        targets.append(self.graphs)

    ModelRunner.__init__ = with_graphs
    destroy = dist.destroy_process_group

    def counted_destroy(*args, **kwargs) -> None:
        live_at_destroy.append(sum(f.live for f in fakes))
        destroy(*args, **kwargs)

    dist.destroy_process_group = counted_destroy
    atexit.register(lambda: Path(f"{out_path}.rank{rank}").write_text(json.dumps(
        {"captured": captured, "live_at_destroy": live_at_destroy})))


def main() -> None:
    model_dir, out_path, device = sys.argv[1:4]
    kv_tokens = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "0" else None
    buckets = len(sys.argv) > 5 and sys.argv[5] == "buckets"
    if buckets:  # (on every rank, before the engine builds its runner)
        fake_graphs(out_path)
    spec = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    llm = LLM(model_dir, device=device, tensor_parallel_size=2, speculative_config=spec,
              max_num_seqs=4, kv_cache_tokens=kv_tokens, enforce_eager=device == "cpu",
              enable_prefix_caching=os.environ.get("TP_PREFIX_CACHE") == "1")
    assert dist.get_rank() == 0, "a follower rank returned from LLM(...)"
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    runner = llm.llm_engine.runner
    free_at_start = runner.num_free_tokens
    first = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy)
    stream = llm.generate_stream([{"prompt_token_ids": PROMPTS[0]}], greedy)
    for i, _ in enumerate(stream):  # a client that goes away mid-stream
        if i == 2:
            break
    stream.close()
    free_after_abort = runner.num_free_tokens
    again = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy)
    stats = llm.llm_engine.metrics
    result = {
        "first": [o.outputs[0].token_ids for o in first],
        "again": [o.outputs[0].token_ids for o in again],
        "free_at_start": free_at_start, "free_after_abort": free_after_abort,
        "free_at_end": runner.num_free_tokens,
        "accepted": stats.num_accepted, "drafted": stats.num_drafted,
        "preemptions": stats.num_preemptions, "prefix_cache_hits": stats.prefix_cache_hits,
        "bucketed_steps": 0 if runner.graphs is None else runner.graphs.num_replays,
        "graphs": 0 if runner.graphs is None else runner.graphs.num_graphs,
        "world_size": dist.get_world_size(), "backend": dist.get_backend(),
        "gathered_head": runner.gathered_head,
        "pool_kv_heads": next(iter(runner.cache.pools.values())).shape[2],
        "local_q_rows": llm.llm_engine.model.model.layers[0].self_attn.q_proj.weight.to_local()
        .shape[0],
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
