"""The real-text workload: chat prompts of seven kinds written for this repository, with a
fixed held-out split.

Kinds (16 prompts each, one data file per family): ``story``, ``explain``, ``factual``,
``code_write`` (``open_kinds.py``: little in the answer to copy from the prompt), ``code_edit``
(``code_edit.py``: a 10-25 line snippet to change and return whole), ``quote``
(``quote.py``: a passage of 80-200 words to repeat, correct, rewrite or summarise) and
``multi_turn`` (``multi_turn.py``: written-out conversations ending with a user turn). Groups:
``open`` = story + explain + factual + code_write, ``copy`` = code_edit + quote; every kind is
also a group of its own. A group's prompts take turns by kind (the first four of ``open`` are a
story, an explanation, a question and a code task), so its first few span its kinds.

The split: every prompt's name ends in its number (``story-07``); the even-numbered half of
every kind is held out (``heldout``), the odd-numbered half is ``tune``. No draft head is trained
or tuned on held-out prompts, and the benchmarks report on them; tuning (thresholds, controller
constants, head data) may use the tune half. None of them shares text with the prompts the draft
head trainer reads (``examples/draft_head_prompts.py``): ``tests/benchmarks/test_real_text.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.real_text.code_edit import CODE_EDIT
from benchmarks.real_text.multi_turn import MULTI_TURN
from benchmarks.real_text.open_kinds import CODE_WRITE, EXPLAIN, FACTUAL, STORY
from benchmarks.real_text.quote import QUOTE

ROLES = ("user", "assistant")  # the roles of a prompt's turns, alternating from the first
SPLITS = ("heldout", "tune")


@dataclass(frozen=True)
class RealPrompt:
    """One chat prompt: ``turns`` alternate user, assistant, ..., ending with the user's."""

    name: str
    kind: str
    turns: tuple[str, ...]

    @property
    def split(self) -> str:
        """``heldout`` for an even number (``story-02``), ``tune`` for an odd one."""
        return SPLITS[int(self.name.rsplit("-", 1)[1]) % 2]

    def messages(self) -> list[dict[str, str]]:
        """The turns as chat messages (role and content)."""
        return [{"role": ROLES[i % 2], "content": text} for i, text in enumerate(self.turns)]

    def chat(self) -> str | list[dict[str, str]]:
        """What the chat template takes: the text of a single user turn, else the messages."""
        return self.turns[0] if len(self.turns) == 1 else self.messages()


def _of(kind: str, texts: dict[str, str | tuple[str, ...]]) -> list[RealPrompt]:
    return [RealPrompt(name, kind, (text,) if isinstance(text, str) else text)
            for name, text in texts.items()]


KINDS: dict[str, list[RealPrompt]] = {
    "story": _of("story", STORY),
    "explain": _of("explain", EXPLAIN),
    "factual": _of("factual", FACTUAL),
    "code_write": _of("code_write", CODE_WRITE),
    "code_edit": _of("code_edit", CODE_EDIT),
    "quote": _of("quote", QUOTE),
    "multi_turn": _of("multi_turn", MULTI_TURN),
}
GROUPS: dict[str, tuple[str, ...]] = {
    "open": ("story", "explain", "factual", "code_write"),
    "copy": ("code_edit", "quote"),
    **{kind: (kind,) for kind in KINDS},
}


def real_prompts(group: str, split: str = "heldout") -> list[RealPrompt]:
    """The prompts of ``group`` (a kind or a group of kinds) in ``split``, taking turns by kind."""
    if group not in GROUPS:
        raise ValueError(f"real-text kind {group!r} is invalid: allowed {sorted(GROUPS)}")
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is invalid: allowed {SPLITS}")
    per_kind = [[p for p in KINDS[kind] if p.split == split] for kind in GROUPS[group]]
    return [p for row in zip(*per_kind, strict=True) for p in row]


def heldout_prompts(group: str) -> list[RealPrompt]:
    """The held-out prompts of ``group``: what the benchmarks report on."""
    return real_prompts(group, "heldout")


def tune_prompts(group: str) -> list[RealPrompt]:
    """The tune prompts of ``group``: the only ones a head or a setting may be fitted to."""
    return real_prompts(group, "tune")
