"""A draft model must share the target's vocabulary: checked at load, with a clear error."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from proposers import get_proposer
from tests.conftest import tiny_model


def word_tokenizer(words: list[str], name: str) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "w0")),
        unk_token="w0")
    tok.name_or_path = name
    return tok


WORDS = [f"w{i}" for i in range(64)]


def build(draft_words, draft_vocab_size=64):
    return get_proposer("draft_model", model=tiny_model("llama", vocab_size=draft_vocab_size),
                        tokenizer=word_tokenizer(draft_words, "tiny-draft"),
                        target_tokenizer=word_tokenizer(WORDS, "tiny-target"),
                        max_num_seqs=1, max_model_len=16)


def test_same_vocabulary_is_accepted():
    assert build(WORDS).vocab_size == 64


@pytest.mark.parametrize("draft_words", [WORDS[:63], WORDS[:62] + ["w63", "w62"],
                                         WORDS[:63] + ["other"]])
def test_different_vocabulary_names_both_tokenizers(draft_words):
    with pytest.raises(ValueError, match="tiny-draft.*tiny-target"):
        build(draft_words)


def test_draft_narrower_than_its_tokenizer_is_refused():
    with pytest.raises(ValueError, match="tiny-draft.*48 logits"):
        build(WORDS, draft_vocab_size=48)


def test_loaded_draft_without_tokenizer_is_refused():
    with pytest.raises(ValueError, match="tokenizer"):
        get_proposer("draft_model", model=tiny_model("llama", vocab_size=64),
                     target_tokenizer=word_tokenizer(WORDS, "tiny-target"),
                     max_num_seqs=1, max_model_len=16)
