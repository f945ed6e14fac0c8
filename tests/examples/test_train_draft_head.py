"""``examples/train_draft_head.py`` on a tiny model: it trains, saves a head the ``eagle``
proposer loads, and the engine's greedy output with that head is Hugging Face's."""

import json

import pytest
import torch

from examples.train_draft_head import main, top_tokens
from proposers.draft_head import DraftHead
from tests.engine.cli.cli_helpers import save_tiny_model


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


def test_training_stops_at_its_time_limit_and_resumes_from_its_checkpoint(tmp_path, capsys):
    model_dir = save_tiny_model(tmp_path / "tiny")
    args = ["--model", str(model_dir), "--num-prompts", "40", "--max-tokens", "16",
            "--batch-tokens", "256", "--data-cache", str(tmp_path / "data.pt"), "--epochs", "2",
            "--checkpoint", str(tmp_path / "state.pt"), "--copy-prompts", "4",
            "--multi-turn", "4", "--out", str(tmp_path / "head")]
    first = main(args + ["--time-limit", "0"])
    assert [h["epoch"] for h in first["history"]] == [1]  # stopped after one epoch
    # held-out copy tasks and chats were built, and each part of the held-out set measured
    for part in ("copy", "multi_turn", "prose", "other"):
        assert first["history"][0][part]["positions"] > 0, part
    data = torch.load(tmp_path / "data.pt")
    chats = [p for p in data["train_prompts"] if not isinstance(p, str)]
    assert chats and all(c[-1]["role"] == "user" for c in chats)
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


def test_init_starts_from_a_saved_head_and_adds_up_its_training_time(tmp_path):
    """With a learning rate of 0 the head saved after --init is the one it started from, its
    draft vocabulary kept; a head of another shape is refused by name."""
    model_dir = save_tiny_model(tmp_path / "tiny")
    common = ["--model", str(model_dir), "--num-prompts", "12", "--max-tokens", "16",
              "--batch-tokens", "256", "--data-cache", str(tmp_path / "data.pt"), "--epochs", "1"]
    first = main(common + ["--draft-vocab", "20", "--out", str(tmp_path / "first")])
    card = main(common + ["--init", str(tmp_path / "first"), "--lr", "0",
                          "--out", str(tmp_path / "again")])
    before, after = DraftHead.load(tmp_path / "first"), DraftHead.load(tmp_path / "again")
    for (name, a), b in zip(before.state_dict().items(), after.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(before.vocab, after.vocab)
    assert card["history"][0]["mean_accepted"] == pytest.approx(
        first["history"][0]["mean_accepted"])
    assert card["init"]["from"] == str(tmp_path / "first")
    assert card["total_seconds"] == pytest.approx(first["seconds"] + card["seconds"], abs=0.11)
    main(common + ["--intermediate-size", "24", "--out", str(tmp_path / "other")])
    with pytest.raises(ValueError, match="--init .*shape"):
        main(common + ["--init", str(tmp_path / "other")])
    with pytest.raises(SystemExit):
        main(["--init", str(tmp_path / "first"), "--arch", "eagle3"])


def test_vocab_into_asks_for_data_only_and_a_size():
    for extra in (["--epochs", "1", "--draft-vocab", "8"], ["--epochs", "0"]):
        with pytest.raises(SystemExit):
            main(["--vocab-into", "somewhere", *extra])


def test_bad_wave_and_batch_are_refused_by_name(capsys):
    for args, name in ((["--wave", "-1"], "--wave -1"), (["--max-num-seqs", "0"],
                                                          "--max-num-seqs 0")):
        with pytest.raises(SystemExit):
            main(args)
        assert name in capsys.readouterr().err


def test_generating_in_waves_answers_every_prompt_in_order(tmp_path):
    """Waves of 2 prompts give the texts that all the prompts at once give (greedy)."""
    from engine import LLM
    from examples.train_draft_head import generate

    llm = LLM(model=str(save_tiny_model(tmp_path / "tiny")), max_num_seqs=4)
    prompts = ["w5 w6", "w7 w8 w9", "w10", "w11 w12", "w13"]
    together = generate(llm, prompts, 6, 0.0, 0)
    assert generate(llm, prompts, 6, 0.0, 0, wave=2) == together
    assert len(together[0]) == 5


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


def _loss_setup(seed: int = 0):
    """A fresh head on a tiny target, features and tokens of two sequences (one padded)."""
    from proposers.head_model import head_for
    from tests.conftest import tiny_model

    model = tiny_model("llama", vocab_size=96, seed=seed)
    torch.manual_seed(seed)
    head = head_for(model.config)
    feats = torch.randn(2, 9, model.config.hidden_size)  # [b, T, hidden]
    tokens = torch.randint(0, 96, (2, 9))  # [b, T]
    lengths = torch.tensor([9, 6])
    return head, model.get_input_embeddings(), model.get_output_embeddings(), feats, tokens, \
        lengths


def test_the_loss_is_the_written_out_one_with_and_without_a_draft_vocabulary():
    """Written out position by position: block u at j (inside its sequence) against f_{j+u+1},
    smooth L1 plus 0.1 x the cross entropy to the target's distribution there; with a draft
    vocabulary the head's distribution is over its tokens (their output-head rows) and the
    target's probabilities are those tokens' of its whole distribution."""
    import torch.nn.functional as F

    from examples.train_draft_head import unrolled_loss

    head, embed, lm_head, feats, tokens, lengths = _loss_setup()
    preds = head.unrolled(feats, tokens, embed, None, 2)
    for vocab in (None, torch.tensor([5, 0, 17, 95, 40, 3])):
        rows = lm_head.weight if vocab is None else lm_head.weight[vocab]
        blocks = []
        for u, pred in enumerate(preds):
            l1, ce = [], []
            for b in range(2):
                for j in range(int(lengths[b]) - 1 - u):
                    target = feats[b, j + u + 1]
                    p = torch.softmax(lm_head(target), -1)
                    p = p if vocab is None else p[vocab]
                    logq = torch.log_softmax(rows @ pred[b, j], -1)
                    l1.append(F.smooth_l1_loss(pred[b, j], target, reduction="sum")
                              / target.numel())
                    ce.append(-(p * logq).sum())
            blocks.append(torch.stack(l1).mean() + 0.1 * torch.stack(ce).mean())
        expected = torch.stack(blocks).mean()
        got = unrolled_loss(head, embed, lm_head, feats, tokens, lengths, 2, 0.1, vocab)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_held_out_drafts_go_through_the_draft_vocabulary():
    """The readout through a whole vocabulary in another order drafts what the full output
    head does (rows map back to token ids); through a vocabulary of one token every draft is
    that token, so the first draft is accepted where the text has it."""
    from examples.train_draft_head import VocabReadout, held_out_acceptance

    head, embed, lm_head, feats, tokens, _ = _loss_setup(seed=3)
    x = torch.randn(20, lm_head.weight.shape[1])
    perm = torch.randperm(96, generator=torch.Generator().manual_seed(1))
    assert torch.equal(VocabReadout(lm_head, perm)(x).argmax(-1), lm_head(x).argmax(-1))
    ids = [4, 9, 7, 7, 2, 7, 8, 7, 7]  # position j's first draft is checked against ids[j + 2]
    head.set_vocab(torch.tensor([7]))
    got = held_out_acceptance(head, embed, lm_head, [feats[0]], [ids], [1])
    hits = [ids[j + 2] == 7 for j in range(0, len(ids) - 1 - 4)]  # j = 0 .. 3
    assert got["first_draft"] == pytest.approx(sum(hits) / len(hits)) == 0.75


def test_acceptance_is_counted_per_sequence_draft_by_draft():
    """Through a vocabulary of one token (7) every draft is 7, so the counts follow from the
    text by hand: from positions j = 0..3 of ``ids``, draft d is checked against ids[j + 2 + d]
    while the earlier ones held; a sequence with no answer position to draft from counts
    nothing. The rates are the summed counts'."""
    from examples.train_draft_head import acceptance_counts, held_out_acceptance

    head, embed, lm_head, feats, _, _ = _loss_setup(seed=3)
    head.set_vocab(torch.tensor([7]))
    ids = [4, 9, 7, 7, 2, 7, 8, 7, 7]
    short = [7, 7, 7]
    features = [feats[0], feats[1, :3]]
    accepted, tried = acceptance_counts(head, embed, lm_head, features, [ids, short], [1, 1])
    # d = 0: j 0,1,3 hit (ids 2..5 = 7 7 2 7); d = 1: only j = 0 (ids[3] = 7); d = 2: none
    assert tried.tolist() == [[4, 3, 1, 0], [0, 0, 0, 0]]
    assert accepted.tolist() == [[3, 1, 0, 0], [0, 0, 0, 0]]
    got = held_out_acceptance(head, embed, lm_head, features, [ids, short], [1, 1])
    assert got["per_position"] == [0.75, pytest.approx(1 / 3), 0.0, 0.0]
    assert got["mean_accepted"] == 1.0 and got["positions"] == 4


def test_features_are_each_sequences_own_final_hidden_states():
    """Batched by length and padded, in the sequences' order: each one's own forward's last
    hidden states."""
    from examples.train_draft_head import features_of
    from tests.conftest import tiny_model

    model = tiny_model("llama", vocab_size=96, seed=2)
    seqs = [[5, 6, 7, 8, 9, 10], [3, 4], [11, 12, 13], [20]]
    feats = features_of(model, seqs, torch.device("cpu"), batch_size=2)
    for seq, f in zip(seqs, feats, strict=True):
        alone = model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states[-1]
        torch.testing.assert_close(f, alone[0], rtol=1e-5, atol=1e-5)


def test_training_an_eagle3_head_saves_a_speculators_head_the_engine_drafts_with(tmp_path):
    """``--arch eagle3``: three blocks of training-time test on the head's own drafts, a
    draft vocabulary, saved in the speculators format; the engine infers method eagle3 from
    the directory and its greedy output is Hugging Face's."""
    from engine import LLM, SamplingParams
    from tests.engine.llm_helpers import hf_greedy

    model_dir = save_tiny_model(tmp_path / "tiny")
    card = main(["--model", str(model_dir), "--arch", "eagle3", "--aux-layers", "0,1,1",
                 "--num-prompts", "12", "--max-tokens", "16", "--epochs", "2", "--unroll", "3",
                 "--draft-vocab", "16", "--batch-tokens", "256", "--lr", "3e-3",
                 "--out", str(tmp_path / "head")])
    history = card["history"]
    assert [h["epoch"] for h in history] == [1, 2] and history[1]["loss"] < history[0]["loss"]
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 16
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(model_dir)
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    llm = LLM(model=str(model_dir), speculative_config={
        "model": str(tmp_path / "head"), "num_speculative_tokens": 3, "adaptive_k": False})
    assert llm.engine.proposer.feature_layers == (0, 1, 1)
    prompt = [3, 9, 27, 5]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(llm.engine.model, prompt, 12)
    assert llm.get_metrics().num_drafted > 0
