"""Tensor parallelism on CPU: two real processes (``torch.distributed.run``, gloo), transformers'
own tensor-parallel plan, rank 0 deciding every step and rank 1 replaying it.

The ranks run ``tp_script.py``; its greedy output (n-gram speculation with rejections, a stream
aborted mid-way, preemption when the KV budget is small) must be token for token the output of
Hugging Face ``generate`` on the unsplit model and of the one-process engine.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engine import LLM, SamplingParams
from tests.engine.cli.cli_helpers import save_tiny_model
from tests.engine.llm_helpers import hf_greedy
from tests.proposers.test_draft_head import save_repeating_head

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("tp_script.py")
sys.path.insert(0, str(SCRIPT.parent))
from tp_script import PROMPTS  # noqa: E402

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tp") / "tiny-llama")


# transformers' plan binds each rank to the machine's accelerator when there is one
ON_CPU = pytest.mark.skipif(torch.cuda.is_available(),
                            reason="CPU ranks are served only on a machine without CUDA")
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def run_ranks(model_dir: Path, out: Path, device: str, kv_tokens: int | None = None,
              buckets: bool = False, spec: dict | None = None, cache: bool = False) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPT), str(model_dir), str(out), device, str(kv_tokens or 0),
           "buckets" if buckets else "plain"] + ([json.dumps(spec)] if spec else [])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "TP_PREFIX_CACHE": "1" if cache else "0"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def expected(model_dir) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return [hf_greedy(model, p, MAX_TOKENS) for p in PROMPTS]


@pytest.mark.parametrize("device,buckets", [
    pytest.param("cpu", False, marks=ON_CPU, id="cpu"),
    # (CUDA graph buckets decided and "captured" as on a GPU, fakes replaying them eagerly,
    # each rank with its own times: the followers must capture what rank 0 tells them)
    pytest.param("cpu", True, marks=ON_CPU, id="cpu-buckets"),
    pytest.param("cuda", False, marks=TWO_GPUS, id="cuda-graphs")])
@pytest.mark.parametrize("kv_tokens", [None, 48], ids=["roomy", "preempting"])
def test_two_ranks_equal_hf_and_one_process(model_dir, expected, tmp_path, kv_tokens, device,
                                            buckets):
    result = run_ranks(model_dir, tmp_path / "out.json", device, kv_tokens, buckets)
    if device == "cuda" or buckets:  # (decode and verification steps ran in buckets)
        assert result["bucketed_steps"] >= MAX_TOKENS // 2
    if buckets:
        # Rank 1 left to itself would capture the first bucket that a graph covers (a batch
        # shrinking as sequences finish): its fake replays make the padding cost more than its
        # captures at once (tp_script.fake_graphs), where rank 0 captures later or never (how
        # many it captures depends on the controller's widths, which follow real step times).
        ranks = [json.loads((tmp_path / f"out.json.rank{r}").read_text()) for r in (0, 1)]
        captured = [r["captured"] for r in ranks]
        assert len(captured[0]) >= 2 and captured[1] == captured[0]
        # every rank freed its graphs before destroying the process group (once), as a live
        # graph's NCCL collectives hang the destroy on GPUs
        assert [r["live_at_destroy"] for r in ranks] == [[0], [0]]
    if device == "cuda":  # (the ranks captured graphs: every rank the same, or they hang)
        assert result["graphs"] > 0
    assert result["world_size"] == 2
    # the logits gathered from the local rows, not through DTensor (engine/runner/tp_head.py)
    assert result["gathered_head"] is True
    assert result["backend"] == {"cpu": "gloo", "cuda": "nccl"}[device]
    # each rank holds half the heads: 4 query heads and 2 key/value heads over 2 ranks
    assert result["local_q_rows"] == 2 * 16 and result["pool_kv_heads"] == 1
    assert result["first"] == expected
    assert result["again"] == expected  # after an aborted stream, the next call is correct
    assert 0 < result["accepted"] < result["drafted"]  # drafts accepted and rejected
    assert (result["preemptions"] > 0) == (kv_tokens is not None)  # the follower preempts too
    assert result["free_after_abort"] == result["free_at_start"] == result["free_at_end"]
    one = LLM(str(model_dir), device=device, max_num_seqs=4, kv_cache_tokens=kv_tokens,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                  "prompt_lookup_min": 1})
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = one.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert [o.outputs[0].token_ids for o in outs] == result["first"]


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=ON_CPU),
                                    pytest.param("cuda", marks=TWO_GPUS)])
def test_two_ranks_share_one_prefix_cache(model_dir, expected, tmp_path, device):
    """With the prefix cache, in a pool that preempts: every rank replays the leader's
    attaches and frees, so the second call reads cached prefixes on both ranks alike."""
    result = run_ranks(model_dir, tmp_path / "out.json", device, 48, cache=True)
    assert result["first"] == expected and result["again"] == expected
    assert result["prefix_cache_hits"] > 0 and result["preemptions"] > 0
    assert result["free_after_abort"] == result["free_at_start"] == result["free_at_end"]


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=ON_CPU),
                                    pytest.param("cuda", marks=TWO_GPUS)])
@pytest.mark.parametrize("method,tree", [("eagle", None), ("ngram_eagle", [2, 2])])
def test_a_draft_head_drafts_on_rank_0(model_dir, expected, tmp_path, tmp_path_factory, device,
                                       method, tree):
    """A draft head reads out through whole copies of the target's split embedding and output
    head (rank 0's, gathered from every rank before the others follow): it drafts, and the
    greedy text is Hugging Face's (before the copies, two ranks hung at the first proposal)."""
    head = tmp_path_factory.mktemp("head")
    save_repeating_head(AutoConfig.from_pretrained(model_dir), head)
    spec = {"method": method, "model": str(head), "num_speculative_tokens": 3,
            "prompt_lookup_min": 1, "draft_tree": tree}
    result = run_ranks(model_dir, tmp_path / "out.json", device, spec=spec)
    assert result["first"] == expected and result["again"] == expected
    assert result["drafted"] > 0


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=ON_CPU),
                                    pytest.param("cuda", marks=TWO_GPUS)])
def test_an_eagle3_head_drafts_from_rank_0s_layer_states(model_dir, expected, tmp_path, device):
    """An EAGLE-3 head (speculators layout) on rank 0 reads the layer states that rank 0's
    forwards return (the followers keep none): it drafts, and the greedy text is Hugging
    Face's."""
    from tests.proposers.speculators_helpers import write_eagle3_dir

    write_eagle3_dir(tmp_path / "head", AutoConfig.from_pretrained(model_dir),
                     list(range(4, 128, 2)), aux=[0, 1, 1])
    spec = {"method": "eagle3", "model": str(tmp_path / "head"), "num_speculative_tokens": 3}
    result = run_ranks(model_dir, tmp_path / "out.json", device, spec=spec)
    assert result["first"] == expected and result["again"] == expected
    assert result["drafted"] > 0


def test_launch_errors_name_the_setting(model_dir, monkeypatch):
    with pytest.raises(ValueError, match="speculative_config.method"):  # (split layers)
        LLM(str(model_dir), device="cpu", tensor_parallel_size=2,
            speculative_config={"method": "early_exit"})
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
        LLM(str(model_dir), device="cpu", tensor_parallel_size=2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="WORLD_SIZE=4"):
        LLM(str(model_dir), device="cpu", tensor_parallel_size=2)


def test_a_follower_replays_the_leaders_calls_in_inference_mode(monkeypatch):
    """Rank 0's engine steps run in inference mode, so the runner's buffers are inference
    tensors; a follower writing one outside that mode raises (on CUDA, where the host-to-device
    staging buffer is reused: a tree's ``keep_paths`` on rank 1, first seen on two GPUs)."""
    from engine.runner import tensor_parallel

    messages = iter([[("truncate", (0, 3)), ("keep_paths", ([(0, 3, [1])],))],
                     tensor_parallel.STOP])
    monkeypatch.setattr(tensor_parallel, "broadcast", lambda value=None: next(messages))
    monkeypatch.setattr(tensor_parallel, "control_group", lambda: None)
    monkeypatch.setattr(tensor_parallel.dist, "barrier", lambda group=None: None)
    seen = []

    class Runner:
        graphs = None

        def truncate(self, slot: int, length: int) -> None:
            seen.append(("truncate", torch.is_inference_mode_enabled()))

        def keep_paths(self, paths: list) -> None:
            seen.append(("keep_paths", torch.is_inference_mode_enabled()))

    assert tensor_parallel.follow(Runner()) == 0
    assert seen == [("truncate", True), ("keep_paths", True)]


def test_the_leader_takes_no_fed_tokens(monkeypatch):
    """Overlapped steps feed tokens left on the device, which no follower could replay, so an
    engine overlaps only where its runner takes them (``takes_fed_tokens``, what
    ``LLMEngine`` reads): the leader says no, whatever the runner it wraps says (its other
    attributes are the wrapped runner's). Without this a CUDA engine under tensor parallelism
    overlapped by default and called the leader's forward with ``fed``, which it lacks."""
    import atexit

    from engine.runner.tensor_parallel import LeaderRunner

    monkeypatch.setattr(atexit, "register", lambda fn: fn)  # (no followers to stop at exit)

    class Runner:
        takes_fed_tokens = True
        vocab_size = 48
        before_launch = None

    leader = LeaderRunner(Runner())
    assert getattr(leader, "takes_fed_tokens", False) is False
    assert leader.vocab_size == 48


def _sized(size: int) -> bytes:
    """A message of ``bytes`` that pickles (as ``broadcast`` pickles) to exactly ``size``."""
    n = size
    while len(pickle.dumps(b"x" * n, protocol=pickle.HIGHEST_PROTOCOL)) > size:
        n -= 1
    assert len(pickle.dumps(b"x" * n, protocol=pickle.HIGHEST_PROTOCOL)) == size
    return b"x" * n


def _messages() -> list:
    from engine.runner.tensor_parallel import MESSAGE_BYTES, STOP

    big = [("forward", ([s for s in range(3000)], [[7, s, 9, s, 5] for s in range(3000)],
                        None, None), (None, ()))]  # (distinct rows: no pickle back-references)
    return [[("truncate", (0, 3))], big, _sized(MESSAGE_BYTES - 8), _sized(MESSAGE_BYTES - 7),
            [("free_slot", (1,))], STOP]


def _broadcast_rank(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from engine.runner import tensor_parallel

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    got = [tensor_parallel.broadcast(m if rank == 0 else None) for m in _messages()]
    Path(f"{out}.{rank}").write_bytes(pickle.dumps(got))
    tensor_parallel.take_down()


def test_the_control_broadcast_carries_small_and_large_messages_in_order(tmp_path):
    """A step's message goes in one broadcast of a fixed buffer; one that pickles to more than
    the buffer holds (here 3000 sequences, and one byte over the limit) in a second broadcast
    of its size; the buffer is reused after it."""
    import torch.multiprocessing as mp

    from engine.runner.tensor_parallel import MESSAGE_BYTES

    sent = _messages()
    sizes = [len(pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL)) for m in sent]
    assert sizes[1] > MESSAGE_BYTES - 8 and sizes[2:4] == [MESSAGE_BYTES - 8, MESSAGE_BYTES - 7]
    out = tmp_path / "got"
    mp.spawn(_broadcast_rank, args=(str(tmp_path / "store"), str(out)), nprocs=2)
    for rank in (0, 1):
        assert pickle.loads((tmp_path / f"got.{rank}").read_bytes()) == sent
