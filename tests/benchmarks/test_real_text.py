"""The real-text workload: its kinds, its names, and a held-out split that shares no text with
the tune split, with what the draft head trains on, or with the other benchmark prompts."""

import re

import pytest

from benchmarks import workloads
from benchmarks.real_text import (
    GROUPS,
    KINDS,
    SPLITS,
    heldout_prompts,
    real_prompts,
    tune_prompts,
)
from examples import draft_head_prompts as head_data
from examples import prompt_sets
from examples.draft_head_topics import STYLE_POOLS

SHINGLE = 8  # two texts "share text" when they have this many consecutive words in common


def shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def text_of(prompts) -> str:
    return "\n".join(turn for p in prompts for turn in p.turns)


def head_training_texts() -> list[str]:
    """The prompts the draft head trainer builds (training and held-out, at the GPU run's
    4000), each first-set task on each topic, and the fixed words of the copy tasks and
    multi-turn follow-ups (their other text is the target's own answers, made at training
    time, or these prompts)."""
    train, held = head_data.draft_head_prompts(4000)
    tasks = [task.format(t=topic) for task in head_data.TASKS for topic in head_data.POOLS["t"]]
    fixed = [re.sub(r"\{\w+\}", "\n", t) for t in head_data.COPY_TASKS + head_data.FOLLOW_UPS]
    return [p.chat for p in train + held] + tasks + fixed


def test_seven_kinds_of_at_least_16_prompts_with_unique_numbered_names():
    assert set(KINDS) == {"story", "explain", "factual", "code_write", "code_edit", "quote",
                          "multi_turn"}
    names = [p.name for prompts in KINDS.values() for p in prompts]
    assert len(names) == len(set(names)) >= 7 * 16
    for kind, prompts in KINDS.items():
        assert len(prompts) >= 16, kind
        # names <kind>-01, -02, ... in order, so the split (by number) is half and half
        assert [p.name for p in prompts] == [f"{kind}-{i:02d}" for i in range(1, len(prompts) + 1)]
        assert all(p.kind == kind for p in prompts)
        texts = [p.turns for p in prompts]
        assert len(texts) == len(set(texts)), kind


def test_the_split_is_the_even_numbered_half_of_every_kind():
    for kind, prompts in KINDS.items():
        held, tune = heldout_prompts(kind), tune_prompts(kind)
        assert [p.name for p in held] == [p.name for p in prompts[1::2]]
        assert [p.name for p in tune] == [p.name for p in prompts[0::2]]
        assert {p.split for p in held} == {"heldout"} and {p.split for p in tune} == {"tune"}


def test_groups_take_turns_by_kind_and_cover_their_kinds():
    assert GROUPS["open"] == ("story", "explain", "factual", "code_write")
    assert GROUPS["copy"] == ("code_edit", "quote")
    opened = heldout_prompts("open")
    assert [p.kind for p in opened[:4]] == list(GROUPS["open"])
    for group, kinds in GROUPS.items():
        for split in SPLITS:
            got = real_prompts(group, split)
            want = {p.name for kind in kinds for p in real_prompts(kind, split)}
            assert len(got) == len(want) and {p.name for p in got} == want, group
    with pytest.raises(ValueError, match="copy_short"):
        heldout_prompts("copy_short")
    with pytest.raises(ValueError, match="train"):
        real_prompts("open", "train")


def test_heldout_shares_no_text_with_the_tune_split_the_head_data_or_the_other_prompts():
    held = set().union(*(shingles(text_of([p])) for kind in KINDS for p in heldout_prompts(kind)))
    assert len(held) > 2000  # (every held-out prompt is in: the checks below are not empty)
    tune = set().union(*(shingles(text_of([p])) for kind in KINDS for p in tune_prompts(kind)))
    assert not held & tune
    head = set().union(*map(shingles, head_training_texts()))
    assert not held & head
    others = [*workloads.COPY_HEAVY, *workloads.COPY_SHORT, *workloads.OPEN_ENDED,
              *workloads.TASKS.values(), *prompt_sets.COPY_PROMPTS.values(),
              *prompt_sets.OPEN_PROMPTS.values()]
    assert not held & set().union(*map(shingles, others))


def test_heldout_prompts_mention_no_topic_the_head_trains_or_is_scored_on():
    text = text_of(p for kind in KINDS for p in heldout_prompts(kind)).lower()
    subjects = [e for name, pool in head_data.POOLS.items() if name not in STYLE_POOLS
                for e in pool]
    for topic in subjects:
        word = re.sub(r"^(the|a|an) ", "", topic.lower())
        assert not re.search(rf"\b{re.escape(word)}\b", text), topic


def test_code_edits_give_10_to_25_lines_and_passages_80_to_200_words():
    for p in KINDS["code_edit"]:
        snippet = re.search(r"```\w+\n(.*?)```", p.turns[0], re.S)
        assert snippet is not None, p.name
        assert 10 <= snippet.group(1).count("\n") <= 25, p.name
    for p in KINDS["quote"]:
        instruction, passage = p.turns[0].split("\n\n", 1)
        assert 80 <= len(passage.split()) <= 200, p.name


def test_multi_turn_prompts_alternate_roles_and_end_with_the_user():
    for p in KINDS["multi_turn"]:
        assert len(p.turns) in (3, 5), p.name
        roles = [m["role"] for m in p.chat()]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"], p.name
        assert [m["content"] for m in p.chat()] == list(p.turns)
    single = KINDS["story"][0]
    assert single.chat() == single.turns[0] and single.messages()[0]["role"] == "user"
