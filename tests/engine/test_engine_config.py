"""SpeculativeConfig / EngineConfig validation: bad values and unknown keys name the field."""

import pytest

from engine.config import EngineConfig, SpeculativeConfig
from samplers import RejectionSampler, TypicalAcceptanceSampler, build_sampler


def test_defaults_and_from_dict():
    spec = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert (spec.method, spec.num_speculative_tokens) == ("ngram", 3)
    assert type(build_sampler(spec.acceptance_method, spec)) is RejectionSampler
    typical = SpeculativeConfig(acceptance_method="typical_acceptance_sampler",
                                posterior_threshold=0.2)
    sampler = build_sampler(typical.acceptance_method, typical)
    assert type(sampler) is TypicalAcceptanceSampler and sampler.posterior_threshold == 0.2
    config = EngineConfig(speculative_config={"method": "early_exit"})
    assert isinstance(config.speculative_config, SpeculativeConfig)


@pytest.mark.parametrize("kwargs, field", [
    ({"method": "medusa"}, "method"),
    ({"method": "draft_model"}, "model"),
    ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 2.0}, "num_speculative_tokens"),
    ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
    ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max"),
    ({"num_early_exit_layers": 0}, "num_early_exit_layers"),
    ({"acceptance_method": "strict"}, "acceptance_method"),
    ({"posterior_threshold": 0}, "posterior_threshold"),
    ({"posterior_alpha": 1.5}, "posterior_alpha"),
    ({"draft_sample_method": "beam"}, "draft_sample_method"),
    ({"adaptive_k": 1}, "adaptive_k"),
    ({"verify_cost_per_token": -0.1}, "verify_cost_per_token"),
    ({"draft_cost_ratio": float("nan")}, "draft_cost_ratio"),
    ({"adaptive_probe_interval": 0}, "adaptive_probe_interval"),
])
def test_speculative_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=rf"SpeculativeConfig\.{field}="):
        SpeculativeConfig(**kwargs)


def test_unknown_keys_are_an_error():
    with pytest.raises(ValueError, match="unknown key 'k'.*num_speculative_tokens"):
        SpeculativeConfig.from_dict({"k": 4})
    with pytest.raises(ValueError, match="unknown key"):
        EngineConfig(speculative_config={"num_spec_tokens": 4})


@pytest.mark.parametrize("kwargs, field", [
    ({"model": ""}, "model"),
    ({"dtype": "int8"}, "dtype"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_model_len": 1}, "max_model_len"),
    ({"kv_cache_tokens": 1.5}, "kv_cache_tokens"),
    ({"seed": -1}, "seed"),
    ({"speculative_config": "ngram"}, "speculative_config"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"tensor_parallel_size": 2, "model": object()}, "model"),
    ({"tensor_parallel_size": 2, "speculative_config": {"method": "early_exit"}},
     r"speculative_config\.method"),
    ({"max_memory": {0: "1GiB"}, "device": "cpu"}, "max_memory"),
    ({"max_memory": {"gpu0": "1GiB"}, "device": "auto"}, "max_memory"),
    ({"max_memory": {0: 0}, "device": "auto"}, "max_memory"),
    ({"max_memory": {}, "device": "auto"}, "max_memory"),
])
def test_engine_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=rf"EngineConfig\.{field}="):
        EngineConfig(**kwargs)


def test_max_memory_keys_from_json_are_gpu_indices():
    config = EngineConfig(device="auto", max_memory={"0": "10GiB", "cpu": 2**30})
    assert config.max_memory == {0: "10GiB", "cpu": 2**30}
