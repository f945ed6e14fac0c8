"""Incremental detokenization: text grows token by token without decoding the whole output.

A token's text can depend on its neighbours (SentencePiece spaces, byte-level pieces that only form
a character together), so each new token is decoded together with a few tokens before it:
``decode(ids[prefix:])`` minus ``decode(ids[prefix:read])`` is the new text. While the result ends
in U+FFFD (an incomplete UTF-8 sequence) nothing is emitted and the offsets stay, so the
character appears whole once its last byte arrives.

Tokens may also arrive several at a time (:meth:`IncrementalDetokenizer.add_tokens`): the same two
decodes then cover the whole run, so a caller that needs the text only now and then (no stop
strings, no streaming) pays two decodes per read instead of two per token.
"""

from __future__ import annotations

from typing import Any

# Tokens decoded before the new ones, for context (enough for every tokenizer we met).
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """The text of one sample's output tokens, extended one token at a time."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # (slow tokenizers only: fast ones take no such option)
        self._extra = ({} if spaces_between_special_tokens or getattr(tokenizer, "is_fast", True)
                       else {"spaces_between_special_tokens": False})
        # The prompt's tail gives the first output tokens their left context.
        self.ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False, **self._extra)

    def add_token(self, token_id: int) -> str:
        """Append one token; return the text it completes (may be empty)."""
        self.ids.append(int(token_id))
        return self._emit(self._decode(self.ids[self.prefix_offset:]))

    def add_tokens(self, token_ids: list[int]) -> str:
        """Append several tokens; return the text they complete: what :meth:`add_token` returns
        for each in turn, joined (for tokenizers whose text of a token depends only on a few
        neighbours, as with byte-level BPE, SentencePiece and word-level ones)."""
        if not token_ids:
            return ""
        start = len(self.ids)
        self.ids.extend(int(t) for t in token_ids)
        full_text = self._decode(self.ids[self.prefix_offset:])
        if len(token_ids) > 1 and full_text.endswith(_REPLACEMENT):
            # an incomplete character at the end: emit what is complete, token by token
            del self.ids[start:]
            return "".join(self.add_token(t) for t in token_ids)
        return self._emit(full_text)

    def _emit(self, full_text: str) -> str:
        """The text after ``read_offset`` (``full_text``: the decode from ``prefix_offset`` to
        the end), unless it ends in an incomplete character; moves the offsets past it."""
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        delta = full_text[len(prefix_text):]
        self.read_offset = len(self.ids)
        self.prefix_offset = max(self.read_offset - _CONTEXT_TOKENS, 0)
        return delta
