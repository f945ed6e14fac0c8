"""SpeculativeConfig / EngineConfig validation: bad values and unknown keys name the field."""

import pytest

from engine.config import MAX_DEFAULT_THREADS, EngineConfig, SpeculativeConfig, default_num_threads
from samplers import RejectionSampler, TypicalAcceptanceSampler, build_sampler


def test_defaults_and_from_dict():
    spec = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert (spec.method, spec.num_speculative_tokens) == ("ngram", 3)
    assert type(build_sampler(spec.acceptance_method, spec)) is RejectionSampler
    typical = SpeculativeConfig(method="ngram", acceptance_method="typical_acceptance_sampler",
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
        SpeculativeConfig(**{"method": "ngram", **kwargs})


def test_method_is_inferred_from_the_model_as_in_vllm(tmp_path):
    from proposers.head_model import DraftHead

    DraftHead(16, 32, 2, 1).save(tmp_path / "head")  # how an eagle head is saved
    spec = EngineConfig(speculative_config={"model": "some/draft", "num_speculative_tokens": 3})
    assert spec.speculative_config.method == "draft_model"
    assert SpeculativeConfig(model=str(tmp_path / "head")).method == "eagle"
    assert SpeculativeConfig(model=tmp_path / "head").method == "eagle"
    assert SpeculativeConfig(model=str(tmp_path)).method == "draft_model"  # (not a head)
    assert SpeculativeConfig(model=object()).method == "draft_model"  # a loaded model
    assert SpeculativeConfig(method="ngram_eagle", model=str(tmp_path / "head")).method == \
        "ngram_eagle"
    with pytest.raises(ValueError, match=r"SpeculativeConfig\.method=None.*ngram"):
        SpeculativeConfig.from_dict({"num_speculative_tokens": 3})  # vLLM has no default either
    for method in ("ngram", "early_exit"):  # never an n-gram proposer when a model was given
        with pytest.raises(ValueError, match=r"SpeculativeConfig\.model='some/draft'"):
            SpeculativeConfig(method=method, model="some/draft")


def test_dtype_names_are_the_loaders():
    from engine.config import DTYPES
    from engine.runner.loader import DTYPES as LOADER_DTYPES

    assert DTYPES == tuple(LOADER_DTYPES)


def _topology(root, cores):
    """A sysfs CPU tree: ``cores[cpu]`` is the (package, core) CPU ``cpu`` runs on."""
    for cpu, (package, core) in enumerate(cores):
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return root


def test_default_threads_leave_a_core_and_respect_omp_num_threads(tmp_path):
    smt = _topology(tmp_path / "smt", [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0)])
    assert default_num_threads({}, {0, 1, 2, 3, 4, 5}, smt) == 2  # 3 cores (hyperthreads once)
    assert default_num_threads({}, {0, 2}, smt) == 1  # this process may run on 2 cores of 3
    assert default_num_threads({}, {0, 1}, smt) == 1  # one core: at least 1
    assert default_num_threads({"OMP_NUM_THREADS": "5"}, {0, 1}, smt) == 5
    assert default_num_threads({"OMP_NUM_THREADS": "0"}, {0, 2, 4}, smt) == 2  # (not valid)
    no_sysfs = tmp_path / "none"
    assert default_num_threads({}, set(range(4)), no_sysfs) == 3  # each CPU a core
    assert default_num_threads({}, set(range(200)), no_sysfs) == MAX_DEFAULT_THREADS


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
    ({"num_threads": 0}, "num_threads"),
    ({"num_threads": 1.5}, "num_threads"),
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
