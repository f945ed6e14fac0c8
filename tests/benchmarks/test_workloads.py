"""The benchmarks' prompts as token ids: the real-text set through a chat template and without
one, every earlier turn of a conversation inside its prompt; random models' token prompts."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from benchmarks.models import RANDOM_LLAMAS
from benchmarks.real_text import GROUPS, KINDS, heldout_prompts
from benchmarks.workloads import build_prompts, chat_ids, text_prompts
from tests.engine.cli.cli_helpers import CHAT_TEMPLATE  # renders <role> content ... <bot>

SPECIALS = ["<unk>", "<user>", "<assistant>", "<bot>", "User:", "Assistant:"]


@pytest.fixture(scope="module")
def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer that knows every word of the real-text prompts, so that a prompt's
    ids spell its words back (no chat template: set one per test)."""
    words = {w for prompts in KINDS.values() for p in prompts for t in p.turns for w in t.split()}
    vocab = {w: i for i, w in enumerate([*SPECIALS, *sorted(words - set(SPECIALS))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def words_of(tokenizer, ids: list[int]) -> list[str]:
    return tokenizer.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, None])
def test_real_prompts_hold_every_turn_in_order(word_tokenizer, template):
    word_tokenizer.chat_template = template
    conversations = heldout_prompts("multi_turn")
    prompts = build_prompts("multi_turn", len(conversations), "tiny", word_tokenizer, 0, "real")
    for conversation, ids in zip(conversations, prompts, strict=True):
        words = words_of(word_tokenizer, ids)
        assert "<unk>" not in words
        # each turn behind its role's marker, the turns in order, then the generation prompt
        marks = {"user": "<user>", "assistant": "<assistant>"} if template else {
            "user": "User:", "assistant": "Assistant:"}
        want = [w for m in conversation.messages()
                for w in [marks[m["role"]], *m["content"].split()]]
        want.append("<bot>" if template else "Assistant:")
        assert words == want, conversation.name


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, None])
def test_single_turn_prompts_are_the_text_in_one_user_message(word_tokenizer, template):
    word_tokenizer.chat_template = template
    texts = text_prompts("copy", "real")
    prompts = build_prompts("copy", len(texts) + 2, "tiny", word_tokenizer, 0, "real")
    assert len(prompts) == len(texts) + 2 and prompts[len(texts)] == prompts[0]  # they cycle
    for text, ids in zip(texts, prompts[:len(texts)], strict=True):
        wrapped = ["<user>", *text.split(), "<bot>"] if template else text.split()
        assert words_of(word_tokenizer, ids) == wrapped


def test_real_set_is_the_heldout_split_by_group(word_tokenizer):
    word_tokenizer.chat_template = CHAT_TEMPLATE
    for group in ("open", "copy", "multi_turn", "quote"):
        assert text_prompts(group, "real") == [p.chat() for p in heldout_prompts(group)]
    assert chat_ids(word_tokenizer, "w") == chat_ids(word_tokenizer,
                                                     [{"role": "user", "content": "w"}])
    with pytest.raises(ValueError, match="copy_short"):
        build_prompts("copy_short", 1, "tiny", word_tokenizer, 0, "real")
    with pytest.raises(ValueError, match="multi_turn"):
        build_prompts("multi_turn", 1, "tiny", word_tokenizer, 0)  # (not a bench kind)


def test_random_models_get_copy_token_prompts_for_the_copy_kinds():
    model = next(iter(RANDOM_LLAMAS))
    for kind in ("copy", *GROUPS["copy"], "open", "multi_turn", "story"):
        prompt = build_prompts(kind, 2, model, None, 1000, "real")[1]
        copies = kind in ("copy", *GROUPS["copy"])
        assert (prompt[:48] == prompt[48:96]) == copies, kind  # (a passage twice, then its start)
