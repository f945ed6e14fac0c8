"""Workloads of the ``reuse`` suite: prompts that share prefixes (a system prompt, a chat's
history) and agent-like streams that repeat earlier requests' text, as token ids.

Token ids keep one builder for every model: a random-weight model gets random tokens, a real
one its tokenizer's ids of real texts (:mod:`benchmarks.workloads`). What matters here is which
tokens repeat, not what they say.
"""

from __future__ import annotations

import random
from typing import Any

from benchmarks.models import RANDOM_LLAMAS
from benchmarks.workloads import COPY_HEAVY, OPEN_ENDED, PARAGRAPH


class TokenSource:
    """Token runs for prompts: random ids for a random model, else slices of real texts."""

    def __init__(self, model_name: str, tokenizer: Any, vocab_size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.vocab_size = vocab_size
        self.text: list[int] | None = None
        if model_name not in RANDOM_LLAMAS:
            texts = [PARAGRAPH, *COPY_HEAVY, *OPEN_ENDED]
            self.text = [t for text in texts for t in tokenizer(text)["input_ids"]]

    def run(self, n: int) -> list[int]:
        """``n`` tokens: random ids, or a random window of the texts (wrapping)."""
        if self.text is None:
            return [self.rng.randrange(2, self.vocab_size) for _ in range(n)]
        start = self.rng.randrange(len(self.text))
        return [self.text[(start + i) % len(self.text)] for i in range(n)]


def shared_prefix_prompts(source: TokenSource, count: int, length: int,
                          shared: float) -> tuple[list[int], list[list[int]]]:
    """A system prompt of ``shared * length`` tokens, and ``count`` prompts of ``length``
    tokens that start with it."""
    head = source.run(int(shared * length))
    return head, [head + source.run(length - len(head)) for _ in range(count)]


def agent_stream(source: TokenSource, count: int, file_tokens: int, tasks: int
                 ) -> list[list[int]]:
    """``count`` requests of an agent at work on one file: each is the file (as edited so far:
    every fourth request changes a few of its tokens) and one of ``tasks`` instructions, and
    every third request pastes back a tool's output seen before (one of two). The same
    instruction on the same file is a request sent again."""
    file = source.run(file_tokens)
    instructions = [source.run(12) for _ in range(tasks)]
    tools = [source.run(file_tokens // 2) for _ in range(2)]
    rng = random.Random(len(file))
    out = []
    for i in range(count):
        if i and i % 4 == 0:  # an edit: a few tokens of the file change
            for _ in range(3):
                file[rng.randrange(len(file))] = source.run(1)[0]
        tool = tools[i % 2] if i % 3 == 2 else []
        out.append(list(file) + tool + instructions[i % tasks])
    return out
