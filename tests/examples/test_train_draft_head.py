"""``examples/train_draft_head.py`` on a tiny model: it trains, saves a head the ``eagle``
proposer loads, and the engine's greedy output with that head is Hugging Face's."""

import json

import pytest
import torch

from examples.draft_head_prompts import COPY_CHARS, TASKS, TOPICS, copy_prompts, draft_head_prompts
from examples.train_draft_head import main, top_tokens
from proposers.draft_head import DraftHead
from tests.engine.cli.cli_helpers import save_tiny_model


def test_held_out_prompts_are_about_topics_no_training_prompt_has():
    train, held = draft_head_prompts(200, held_out_fraction=0.1)
    assert len(train) == 180 and len(held) == 20
    held_topics = {t for t in TOPICS if any(task.format(t=t) in held for task in TASKS)}
    assert held_topics and not any(task.format(t=t) in train
                                   for t in held_topics for task in TASKS)


def test_training_saves_a_head_that_the_engine_drafts_with(tmp_path):
    from engine import LLM, SamplingParams
    from tests.engine.llm_helpers import hf_greedy

    model_dir = save_tiny_model(tmp_path / "tiny")
    card = main(["--model", str(model_dir), "--num-prompts", "12", "--max-tokens", "16",
                 "--epochs", "2", "--batch-tokens", "256", "--out", str(tmp_path / "head")])
    assert [h["epoch"] for h in card["history"]] == [1, 2]
    assert all(0.0 <= h["first_draft"] <= 1.0 and h["positions"] > 0 for h in card["history"])
    head = DraftHead.load(tmp_path / "head")
    llm = LLM(model=str(model_dir), speculative_config={
        "method": "eagle", "model": str(tmp_path / "head"), "num_speculative_tokens": 3,
        "adaptive_k": False})
    assert llm.engine.proposer.head.hidden_size == head.hidden_size
    prompt = [3, 9, 27, 5]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(llm.engine.model, prompt, 12)
    assert llm.get_metrics().num_drafted > 0


def test_copy_prompts_carry_their_text_and_skip_short_ones():
    text = ("Kites fly when the wind lifts them. Children hold the string and run across the "
            "field. Some kites have long tails that keep them steady in gusty weather.")
    prompts = copy_prompts([text, "too short: skipped", text], seed=1)
    assert len(prompts) == 2
    words = text.split()
    for p in prompts:
        # the text itself, or with a few misspelt words: most of its words are in the prompt
        assert sum(w in p for w in words) >= 0.8 * len(words), p
    long = "A sentence about kites. " * 60
    assert all(len(p) < COPY_CHARS + 200 for p in copy_prompts([long] * 8))


def test_training_stops_at_its_time_limit_and_resumes_from_its_checkpoint(tmp_path, capsys):
    model_dir = save_tiny_model(tmp_path / "tiny")
    args = ["--model", str(model_dir), "--num-prompts", "12", "--max-tokens", "16",
            "--batch-tokens", "256", "--data-cache", str(tmp_path / "data.pt"), "--epochs", "2",
            "--checkpoint", str(tmp_path / "state.pt"), "--copy-prompts", "4",
            "--out", str(tmp_path / "head")]
    first = main(args + ["--time-limit", "0"])
    assert [h["epoch"] for h in first["history"]] == [1]  # stopped after one epoch
    assert "copy" in first["history"][0]  # held-out copy tasks were built and measured
    assert not (tmp_path / "head").exists()  # no head before the last epoch
    capsys.readouterr()
    second = main(args)
    printed = capsys.readouterr().out
    assert "resumed from" in printed and "epoch 1:" not in printed  # epoch 2 alone trained
    assert [h["epoch"] for h in second["history"]] == [1, 2]
    assert second["history"][0] == first["history"][0]
    assert DraftHead.load(tmp_path / "head").hidden_size > 0
    with pytest.raises(ValueError, match="--epochs 2, not 3"):  # another schedule: refused
        main(args[:args.index("--epochs")] + ["--epochs", "3"] + args[args.index("--epochs") + 2:])


def test_vocab_into_asks_for_data_only_and_a_size():
    for extra in (["--epochs", "1", "--draft-vocab", "8"], ["--epochs", "0"]):
        with pytest.raises(SystemExit):
            main(["--vocab-into", "somewhere", *extra])


def test_top_tokens_are_the_most_frequent_ties_by_id():
    assert top_tokens([[5, 3, 3, 9], [9, 3, 7]], 3) == [3, 9, 5]


def test_a_draft_vocabulary_from_the_data_goes_into_a_saved_head(tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    common = ["--model", str(model_dir), "--num-prompts", "12", "--max-tokens", "16",
              "--batch-tokens", "256", "--data-cache", str(tmp_path / "data.pt")]
    main(common + ["--epochs", "1", "--out", str(tmp_path / "head")])
    assert DraftHead.load(tmp_path / "head").vocab is None
    card = main(common + ["--epochs", "0", "--draft-vocab", "20",
                          "--vocab-into", str(tmp_path / "head")])
    assert 0.0 < card["vocab_coverage"] <= 1.0
    data = torch.load(tmp_path / "data.pt")
    head = DraftHead.load(tmp_path / "head")
    assert head.vocab.tolist() == top_tokens(data["train"], 20)
    saved = json.loads((tmp_path / "head" / "draft_head.json").read_text())
    assert saved["draft_vocab"]["size"] == 20 and len(saved["history"]) == 1  # card kept
