"""A tiny random LLaMA saved to disk with an offline word-level tokenizer, for CLI and
benchmark tests that load a model by path."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m.role }}> {{ m.content }} {% endfor %}"
                 "{% if add_generation_prompt %}<bot> {% endif %}")


def save_tiny_model(path: Path) -> Path:
    """Write a tiny random LLaMA (vocab 128) and a tokenizer over ``w4 .. w127`` to ``path``.

    Token ids: ``<unk>`` 0, ``<eos>`` 1, ``<user>`` 2, ``<bot>`` 3, ``wN`` N; the chat template
    renders ``<user> text <bot>``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.conftest import tiny_model

    vocab = {"<unk>": 0, "<eos>": 1, "<user>": 2, "<bot>": 3}
    vocab.update({f"w{i}": i for i in range(4, 128)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>",
                                        eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tiny_model("llama", vocab_size=128, eos_token_id=1, bos_token_id=None,
               pad_token_id=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
