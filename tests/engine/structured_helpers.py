"""A character-level tokenizer for grammar tests: every printable ASCII character is a token,
plus a few multi-character JSON pieces, so that a tiny random model can write any JSON, regex
match or choice (several tokenizations of one text exist, as with BPE vocabularies)."""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_ID = 1
PIECES = ['{"', '": ', '", "', '"}', "name", "true", "false", "null", ", ", '": "']


def char_vocab() -> dict[str, int]:
    """``<unk>`` 0, ``<eos>`` 1, the printable ASCII characters (no tab or form feeds), then
    ``PIECES``."""
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {"<unk>": 0, "<eos>": 1}
    for text in chars + PIECES:
        vocab.setdefault(text, len(vocab))
    return vocab


def char_tokenizer() -> PreTrainedTokenizerFast:
    """Encodes a text character by character (the pieces are only ever generated); decodes by
    joining the tokens' texts."""
    backend = Tokenizer(models.WordLevel(char_vocab(), unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>",
                                   eos_token="<eos>")


CHAT_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}bot: {% endif %}")


def save_char_model(path: Path) -> Path:
    """Write a tiny random LLaMA (vocab 128, EOS 1) with :func:`char_tokenizer` and a chat
    template to ``path`` (for the CLI and the server)."""
    from tests.conftest import tiny_model

    tokenizer = char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tiny_model("llama", vocab_size=128, eos_token_id=EOS_ID, bos_token_id=None,
               pad_token_id=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
