"""``examples/export_speculators.py``: a speculators EAGLE-3 head re-exported for vLLM and
SGLang (verifier name, proposal length, dtype) keeps its weights (rounded to the dtype); a head
of the ``eagle`` method is refused with the reason."""

import json

import pytest
import torch

from examples.export_speculators import export
from proposers.head_model import head_for
from proposers.speculators import load_eagle3
from tests.engine.cli.cli_helpers import save_tiny_model
from tests.proposers.speculators_helpers import write_eagle3_dir


def test_an_eagle3_head_is_exported_with_its_verifier_and_the_same_weights(tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    weights = write_eagle3_dir(tmp_path / "head", config, list(range(4, 128, 3)), aux=[0, 1, 1])
    written = export(tmp_path / "head", tmp_path / "out", str(model_dir), "org/tiny-llama", 5,
                     "bfloat16")
    assert written["speculators_model_type"] == "eagle3"
    assert written["architectures"] == ["Eagle3Speculator"]
    assert written["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert written["torch_dtype"] == "bfloat16"
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == written
    head = load_eagle3(tmp_path / "out", config, 128)
    assert head.fc.weight.dtype == torch.bfloat16
    for name, tensor in weights.items():  # (the hand-written weights, rounded to bfloat16)
        want = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert torch.equal(head.state_dict()[name], want), name


def test_a_head_of_the_eagle_method_is_refused_with_the_reason(tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    from transformers import AutoConfig

    head_for(AutoConfig.from_pretrained(model_dir)).save(tmp_path / "head")
    with pytest.raises(ValueError, match="draft_head.json.*--arch eagle3"):
        export(tmp_path / "head", tmp_path / "out", str(model_dir), None, None, None)
    assert not (tmp_path / "out").exists()
