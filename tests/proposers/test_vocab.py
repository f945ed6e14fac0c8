"""A draft model must share the target's vocabulary: checked at load, with a clear error."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_model
from tests.proposers.proposer_helpers import build as build_proposer
from tests.proposers.proposer_helpers import make_context, word_tokenizer

WORDS = [f"w{i}" for i in range(64)]


def target_context():
    return make_context(tiny_model("llama", vocab_size=64), 1, 16,
                   target_tokenizer=word_tokenizer(WORDS, "tiny-target"))


def build(draft_words, draft_vocab_size=64):
    return build_proposer("draft_model", target_context(),
                          model=tiny_model("llama", vocab_size=draft_vocab_size),
                          tokenizer=word_tokenizer(draft_words, "tiny-draft"))


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
    with pytest.raises(ValueError, match="SpeculativeConfig.tokenizer=None"):
        build_proposer("draft_model", target_context(), model=tiny_model("llama", vocab_size=64))
