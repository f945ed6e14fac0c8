"""Smoke test of ``benchmarks/head_acceptance.py`` on a tiny model and a random head."""

import json

from benchmarks.head_acceptance import main
from proposers.head_model import head_for
from tests.engine.cli.cli_helpers import save_tiny_model


def test_head_acceptance_reports_each_set_by_position(tmp_path, capsys):
    from transformers import AutoConfig

    model_dir = save_tiny_model(tmp_path / "tiny")
    head_for(AutoConfig.from_pretrained(model_dir)).save(tmp_path / "head")
    out = tmp_path / "acc.json"
    main(["--model", str(model_dir), "--head", str(tmp_path / "head"), "--sets",
          "held_out,bench_open", "--num-prompts", "2", "--max-tokens", "12", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"held_out", "bench_open"}
    for name, count in (("held_out", 2), ("bench_open", 8)):
        r = doc["results"][name]
        assert len(r["per_position"]) == 4 and all(0.0 <= x <= 1.0 for x in r["per_position"])
        assert r["first_draft"] == r["per_position"][0]
        assert 0.0 <= r["mean_accepted"] <= 4.0
        assert len(r["per_prompt_mean_accepted"]) == count
    assert "conditional per position" in capsys.readouterr().out


def test_head_acceptance_names_an_unknown_set(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--sets", "held_out,poetry"])
    assert "poetry" in capsys.readouterr().err
