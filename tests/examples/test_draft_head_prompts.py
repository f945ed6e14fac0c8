
"""The draft head's offline prompt set (``examples/draft_head_prompts.py``): its families and
split, copy tasks and multi-turn chats, and that nothing in it comes from a benchmark."""

import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from benchmarks import workloads
from benchmarks.real_text import KINDS
from examples import draft_head_prompts as head_data
from examples import draft_head_topics as topics
from examples import prompt_sets
from examples.draft_head_prompts import (
    COPY_CHARS,
    FAMILIES,
    FOLLOW_UPS,
    PROSE_KINDS,
    copy_prompts,
    draft_head_prompts,
    multi_turn_prompts,
)

ROOT = Path(__file__).resolve().parents[2]
NUM_PROMPTS = 4000  # the GPU run's --num-prompts (the card's command)


def benchmark_prompts() -> list[str]:
    """Every benchmark prompt's text: each turn of the real-text workload (both splits), the
    workloads' own prompts and the examples' prompt sets."""
    real = [turn for prompts in KINDS.values() for p in prompts for turn in p.turns]
    return [*real, *workloads.COPY_HEAVY, *workloads.COPY_SHORT, *workloads.OPEN_ENDED,
            *workloads.TASKS.values(), *prompt_sets.COPY_PROMPTS.values(),
            *prompt_sets.OPEN_PROMPTS.values()]


def normal(text: str) -> str:
    return " ".join(text.lower().split())


def every_head_text() -> list[str]:
    """Every text the trainer's prompts are made of: the training and held-out prompts of the
    GPU run, and the fixed words of its copy tasks and multi-turn follow-ups (their other
    text is the target's answers or these prompts)."""
    train, held = draft_head_prompts(NUM_PROMPTS)
    chats = [p.chat for p in train + held]
    fixed = [re.sub(r"\{\w+\}", "\n", t) for t in head_data.COPY_TASKS + FOLLOW_UPS]
    return chats + fixed


def test_the_gpu_runs_set_has_each_familys_share_and_most_of_it_prose():
    train, held = draft_head_prompts(NUM_PROMPTS)
    assert len(train) == 3600 and 0.95 * 400 <= len(held) <= 400
    counts = Counter(p.kind for p in train)
    assert set(counts) == {f.kind for f in FAMILIES}
    for family in FAMILIES:  # (every family has the combinations for its share)
        assert counts[family.kind] == round(family.share * 3600), family.kind
    assert sum(counts[k] for k in PROSE_KINDS) >= 0.7 * len(train)
    assert len({p.chat for p in train}) == len(train)
    small_train, small_held = draft_head_prompts(200, held_out_fraction=0.1)
    assert len(small_train) == 180 and len(small_held) == 20
    assert draft_head_prompts(200) == (small_train, small_held)  # (the same on every machine)


def test_held_out_prompts_take_no_subject_that_a_training_prompt_takes():
    train, held = draft_head_prompts(NUM_PROMPTS)
    train_subjects = {s for p in train for s in p.subjects}
    held_subjects = {s for p in held for s in p.subjects}
    assert held_subjects and not held_subjects & train_subjects
    assert all(p.subjects for p in train + held)
    styles = {s for name in topics.STYLE_POOLS for s in head_data.POOLS[name]}
    assert not styles & (train_subjects | held_subjects)


def test_held_out_prompts_take_no_topic_the_first_head_was_trained_on():
    """The shipped head was fine-tuned (``--init``) from one trained on the first prompt set:
    its topics, wherever a word list of this set has them ("camping" is also an activity),
    never make a held-out prompt. The first set's split is rebuilt from its own rule here."""
    shuffled = list(topics.TOPICS)
    random.Random(0).shuffle(shuffled)
    first_training = set(shuffled[10:])  # (102 topics: a tenth, 10, held out)
    assert "camping" in first_training and "camping" in topics.ACTIVITIES
    _, held = draft_head_prompts(NUM_PROMPTS)
    assert not {s for p in held for s in p.subjects} & first_training


def test_no_head_prompt_equals_or_contains_a_benchmark_prompt():
    bench = [normal(b) for b in benchmark_prompts()]
    assert len(bench) > 7 * 16
    for text in every_head_text():
        text = normal(text)
        assert not any(b in text for b in bench), text


def test_no_subject_is_a_benchmark_prompts_topic():
    """No entry of a word list the new families read is said in any benchmark prompt (as
    words, without its article); the first set's topics keep the older rule: not in a held-out
    real-text prompt (``tests/benchmarks/test_real_text.py``)."""
    text = normal("\n".join(benchmark_prompts()))
    for name, pool in head_data.POOLS.items():
        if name in topics.STYLE_POOLS or name == "t":
            continue
        for entry in pool:
            words = re.sub(r"^(the|a|an) ", "", entry.lower())
            assert not re.search(rf"\b{re.escape(words)}\b", text), (name, entry)


def test_the_trainer_reads_no_benchmark():
    """Importing the trainer loads no ``benchmarks`` module, and its prompt modules import
    none."""
    code = ("import sys; import examples.train_draft_head; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"
    for name in ("train_draft_head.py", "draft_head_prompts.py", "draft_head_topics.py"):
        source = (ROOT / "examples" / name).read_text()
        assert not re.search(r"^\s*(from|import)\s+benchmarks", source, re.M), name
        assert "real_text" not in re.sub(r'"""(.*?)"""', "", source, flags=re.S), name


def test_copy_prompts_carry_their_text_and_skip_short_ones():
    text = ("Kites fly when the wind lifts them. Children hold the string and run across the "
            "field. Some kites have long tails that keep them steady in gusty weather.")
    prompts = copy_prompts([text, "too short: skipped", text], seed=1)
    assert len(prompts) == 2
    words = text.split()
    for p in prompts:
        # the text itself, or with a few misspelt words: most of its words are in the prompt
        assert sum(w in p for w in words) >= 0.8 * len(words), p
    long = "A sentence about kites. " * 60
    assert all(len(p) < COPY_CHARS + 200 for p in copy_prompts([long] * 8))


def test_multi_turn_chats_are_prompt_answer_and_a_last_user_turn():
    answer = ("Owls hunt at night. Their soft feathers make their flight almost silent, and "
              "their ears are set at different heights so that they can find a mouse by sound.")
    others = ["Write a poem about a quiet street.", "What is a light year?"]
    chats = multi_turn_prompts([("Tell me about owls.", answer), ("Hi", "ok")] * 20, others,
                               seed=2)
    assert len(chats) == 20  # (the answer too short to follow up on: skipped)
    for chat in chats:
        assert [m["role"] for m in chat] == ["user", "assistant", "user"]
        assert chat[0]["content"] == "Tell me about owls." and chat[1]["content"] == answer
        assert "{" not in chat[2]["content"]
    moved_on = [c for c in chats if any(o in c[2]["content"] for o in others)]
    assert 0 < len(moved_on) < len(chats)  # both kinds of follow-up
