"""Models placed by accelerate (``device_map``): each KV pool sits where its layer computes, logits
come back to the runner's device, and steps stay exact.

On CPU, accelerate's offload hooks (``cpu_offload``: every weight waits on the ``meta`` device and
is brought in per forward, as for the ``cpu`` entries of a ``device_map`` on a GPU machine) are
the spread case this machine has. The GPU tests split a model between a GPU and CPU offload (one
GPU), and between two GPUs.
"""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate import cpu_offload, dispatch_model

from engine.runner.model_runner import ModelRunner, attention_devices, execution_device
from tests.conftest import tiny_model
from tests.engine.runner.test_model_runner import random_schedule


def test_offloaded_weights_compute_on_the_hooks_device():
    model = tiny_model("llama", vocab_size=96, seed=6)
    offloaded = cpu_offload(copy.deepcopy(model), execution_device="cpu")
    layer = offloaded.model.layers[0]
    assert next(layer.parameters()).device.type == "meta"  # weights wait off the device
    assert execution_device(layer) == torch.device("cpu")
    assert set(attention_devices(offloaded).values()) == {torch.device("cpu")}
    runner = ModelRunner(offloaded, max_num_seqs=4, max_num_tokens=96, max_model_len=40)
    assert runner.device == torch.device("cpu")
    random_schedule(runner, model, seed=16, num_steps=20, vocab_size=96)  # the oracle: unhooked


def _split_map(model, first: str, second: str) -> dict[str, str]:
    return {"model.embed_tokens": first, "model.layers.0": first, "model.layers.1": second,
            "model.norm": second, "model.rotary_emb": first, "lm_head": second}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="splits a model between a GPU and CPU")
@pytest.mark.parametrize("main_device", ["cuda:0", "cpu"], ids=["cpu-offload", "cpu-compute"])
def test_a_model_split_between_gpu_and_cpu_stays_exact(main_device):
    """``cuda:0``: the second half's weights wait in CPU memory and compute on the GPU (a
    ``device_map``'s ``cpu`` entries); ``cpu``: the second half and the head compute on the CPU,
    so embeddings, layers and head are on different devices."""
    model = tiny_model("llama", vocab_size=96, seed=7).cuda()
    split = dispatch_model(copy.deepcopy(model), _split_map(model, "cuda:0", "cpu"),
                           main_device=main_device)
    runner = ModelRunner(split, max_num_seqs=4, max_num_tokens=96, max_model_len=40,
                         cuda_graph_max_new=4)
    assert runner.graphs is None  # hooks move weights or activations per forward: eager
    pools = {i: p.device.type for i, p in runner.cache.pools.items()}
    assert pools == {0: "cuda", 1: "cuda" if main_device == "cuda:0" else "cpu"}
    assert runner.device == torch.device("cuda:0")
    random_schedule(runner, model, seed=17, num_steps=20, vocab_size=96)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="splits a model over two GPUs")
def test_a_model_split_over_two_gpus_keeps_pools_beside_layers():
    model = tiny_model("llama", vocab_size=96, seed=8).cuda()
    split = dispatch_model(copy.deepcopy(model), _split_map(model, "cuda:0", "cuda:1"))
    runner = ModelRunner(split, max_num_seqs=4, max_num_tokens=96, max_model_len=40,
                         cuda_graph_max_new=4)
    assert {i: p.device.index for i, p in runner.cache.pools.items()} == {0: 0, 1: 1}
    assert runner.graphs is None
    random_schedule(runner, model, seed=18, num_steps=20, vocab_size=96)
