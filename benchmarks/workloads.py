"""The suites' prompts: chat texts of a few kinds for real models, token ids for random ones.

Kinds: ``copy`` (edit or quote a text given in the prompt: the answer repeats it, so n-gram
drafts pay), ``open`` (stories, explanations: nothing to copy), ``copy_short`` (the first,
shorter copy set). Models with random weights (``benchmarks/models.py``) get token-id prompts
instead: their output does not depend on the prompt's meaning, so n-gram acceptance there comes
only from the random model's own repetition loops. ``TASKS``: four short tasks on one paragraph
(copy, edit, code, open) for per-proposer acceptance. ``text_prompts(kind, "examples")``: the
prompt sets of ``examples/prompt_sets.py`` (the serving suite's default). ``text_prompts(kind,
"real")``: the held-out split of the real-text workload (``benchmarks/real_text/``: kinds
``open``, ``copy``, ``multi_turn`` and each single kind), whose multi-turn prompts are message
lists.
"""

from __future__ import annotations

import random
from typing import Any

from benchmarks.models import RANDOM_LLAMAS
from benchmarks.real_text import GROUPS, heldout_prompts

# Copy-heavy prompts: eight edit or quote tasks whose source text is long enough (100-170
# prompt tokens) that the embedded model's 64-token answer is the edited or quoted text.
COPY_HEAVY = [
    "Copy the following paragraph, correcting the spelling mistakes. Keep everything else the "
    "same.\n\nSpeculative decoding lets a small draft model propose several tokens at once. The "
    "large model then checks all of them in a singel forward pass and keeps the longest prefix "
    "it agrees with, so the output is unchanged while fewer expensive steps are neded. Because "
    "the large model reads its weights from memory once per step, checking five tokens costs "
    "little more than generating one, and every acepted draft saves a whole step. The method "
    "works best when the text is predictable, for example when an answer repeats words from the "
    "question.",
    "Rename the variable `total` to `running_sum` in this Python function and return the whole "
    "function:\n\ndef summarize(values, threshold):\n    total = 0\n    count = 0\n"
    "    largest = None\n    for value in values:\n        if value < threshold:\n"
    "            continue\n        total = total + value\n        count = count + 1\n"
    "        if largest is None or value > largest:\n            largest = value\n"
    "    if count == 0:\n        return {\"mean\": 0.0, \"largest\": None, \"count\": 0}\n"
    "    return {\"mean\": total / count, \"largest\": largest, \"count\": count}\n",
    "Repeat the following passage exactly, inside quotation marks:\n\nThe river was low that "
    "summer, and the children walked along the dry stones where the water used to run. They "
    "found shells, a rusted key, and a small glass bottle with a folded note inside. Nobody "
    "could read the handwriting, so they carried the bottle to the old librarian, who held it "
    "up to the window for a long time before she smiled and said that the note was a recipe "
    "for plum cake, written by her grandmother seventy years ago.",
    "Turn this comma-separated list into a numbered list, one item per line: apples, bananas, "
    "cherries, dates, elderberries, figs, grapes, honeydew melons, kiwis, lemons, mangoes, "
    "nectarines, oranges, papayas, quinces, raspberries, strawberries, tangerines, watermelons, "
    "apricots, blueberries, coconuts, cranberries, guavas, limes.",
    "Here is a JSON object:\n{\"name\": \"Ada Lovelace\", \"born\": 1815, \"died\": 1852, "
    "\"field\": \"mathematics\", \"known_for\": \"the first published computer program\", "
    "\"country\": \"England\", \"city\": \"London\", \"father\": \"Lord Byron\", \"mother\": "
    "\"Anne Isabella Milbanke\", \"collaborator\": \"Charles Babbage\", \"machine\": "
    "\"Analytical Engine\", \"notes_published\": 1843}\nReturn the same JSON object with the "
    "field \"born\" changed to 1816.",
    "Fix the grammar in this email and return the corrected email:\n\nHello team, I wanted to "
    "let you know that the meeting are moved to thursday. Please bring you notes from last week "
    "and be ready to discuss the budget, which have changed a lot since we last talk. Maria "
    "and John is going to present the new sales numbers, and I will shares the plan for the "
    "next quarter. If you cannot attending, please send me a message before wednesday so we "
    "can finding another time. Thank you for you help, and see you all on thursday.",
    "Add a docstring to this function and return the complete function:\n\ndef "
    "schedule_tasks(tasks, workers, deadline):\n    assignments = {worker: [] for worker in "
    "workers}\n    loads = {worker: 0 for worker in workers}\n    for task in sorted(tasks, "
    "key=lambda t: t.duration, reverse=True):\n        worker = min(workers, key=lambda w: "
    "loads[w])\n        if loads[worker] + task.duration > deadline:\n            raise "
    "ValueError(f\"task {task.name} does not fit before the deadline\")\n        "
    "assignments[worker].append(task)\n        loads[worker] += task.duration\n    return "
    "assignments\n",
    "Convert these lines to Markdown bullet points, keeping the text of each line:\nBuy milk and "
    "eggs\nCall the plumber about the kitchen sink\nSend the quarterly report to Maria\nBook "
    "train tickets to Lyon\nWater the plants on the balcony\nPick up the dry cleaning on "
    "Friday\nRenew the library books before Monday\nAsk Tom about the weekend hiking trip\n"
    "Clean the bicycle chain and pump the tyres\nPay the electricity bill\nBuy a birthday "
    "present for Anna\nBack up the laptop to the external drive",
]

# The first copy-heavy set (kind "copy_short"). Its source texts are short: on the embedded
# model three answers end (EOS) 25-50 tokens into a 64-token window, so the rest of the window is
# whatever the model writes after EOS (``ignore_eos``), and two answers rewrite or refuse instead
# of editing.
COPY_SHORT = [
    "Copy the following paragraph, correcting the spelling mistakes. Keep everything else the "
    "same.\n\nSpeculative decoding lets a small draft propose several tokens at once. The large "
    "model checks all of them in a singel forward pass and keeps the longest prefix it agrees "
    "with, so the output is unchanged while fewer expensive steps are neded.",
    "Rename the variable `total` to `running_sum` in this Python function and return the whole "
    "function:\n\ndef average(numbers):\n    total = 0\n    count = 0\n    for value in numbers:\n"
    "        total = total + value\n        count = count + 1\n    if count == 0:\n"
    "        return 0.0\n    return total / count\n",
    "Repeat the following quote exactly, inside quotation marks:\n\nThe only way to make sense "
    "out of change is to plunge into it, move with it, and join the dance. Change is the law of "
    "life, and those who look only to the past or present are certain to miss the future.",
    "Turn this comma-separated list into a numbered list, one item per line: apples, bananas, "
    "cherries, dates, elderberries, figs, grapes, honeydew melons, kiwis, lemons, mangoes.",
    "Here is a JSON object:\n{\"name\": \"Ada Lovelace\", \"born\": 1815, \"field\": "
    "\"mathematics\", \"known_for\": \"the first published computer program\", \"country\": "
    "\"England\"}\nReturn the same JSON object with the field \"born\" changed to 1816.",
    "Fix the grammar in this email and return the corrected email:\n\nHello team, I wanted to "
    "let you know that the meeting are moved to thursday. Please bring you notes from last week "
    "and be ready to discuss the budget, which have changed a lot since we last talk.",
    "Add a docstring to this function and return the complete function:\n\ndef clamp(value, "
    "low, high):\n    if value < low:\n        return low\n    if value > high:\n"
    "        return high\n    return value\n",
    "Convert these lines to Markdown bullet points, keeping the text of each line:\nBuy milk and "
    "eggs\nCall the plumber about the kitchen sink\nSend the quarterly report to Maria\nBook "
    "train tickets to Lyon\nWater the plants on the balcony",
]

OPEN_ENDED = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how photosynthesis works to a ten-year-old.",
    "Give me five tips for staying focused while working from home.",
    "Write a poem about the first snow of winter.",
    "What are the main causes of the French Revolution?",
    "Describe a day in the life of a honeybee.",
    "Why is the sky blue? Answer in a few paragraphs.",
    "Invent a new board game and describe its rules.",
]

PROMPT_KINDS = ("copy", "open", "copy_short")
PROMPT_SETS = ("bench", "examples", "real")
# A chat prompt: the text of one user message, or a conversation as chat messages.
Chat = str | list[dict[str, str]]

PARAGRAPH = ("The old lighthouse stood on the northern cliff for more than two hundred years. "
             "Every night its keeper climbed the spiral stairs, trimmed the wick and polished the "
             "great lens, so that ships passing through the narrow strait could find their way "
             "home. When the electric lamp arrived, the keeper stayed on, because the village "
             "said the light looked warmer when he was there.")
TASKS = {
    "copy": f"Repeat the following text exactly, word for word:\n\n{PARAGRAPH}",
    "edit": ("Rewrite the following text, replacing the word 'keeper' with 'guardian' and "
             f"changing nothing else:\n\n{PARAGRAPH}"),
    "code": ("Rename the variable `total` to `acc` in this Python function and print the whole "
             "function:\n\ndef add_all(values):\n    total = 0\n    for v in values:\n"
             "        total = total + v\n    return total\n"),
    "open": "Write a short story about a cat who learns to play the piano.",
}


def text_prompts(kind: str, prompt_set: str = "bench") -> list[Chat]:
    """The chats of ``kind``: this module's (``bench``), ``examples/prompt_sets.py``'s or the
    real-text workload's held-out split (``real``)."""
    if prompt_set == "real":
        return [prompt.chat() for prompt in heldout_prompts(kind)]
    if prompt_set == "examples":
        from examples.prompt_sets import PROMPT_KINDS as EXAMPLES

        sets = {name: list(texts.values()) for name, texts in EXAMPLES.items()}
    elif prompt_set == "bench":
        sets = {"copy": COPY_HEAVY, "copy_short": COPY_SHORT, "open": OPEN_ENDED}
    else:
        raise ValueError(f"prompt set {prompt_set!r} is invalid: allowed {PROMPT_SETS}")
    if kind not in sets:
        raise ValueError(f"prompt kind {kind!r} is invalid for set {prompt_set!r}: allowed "
                         f"{sorted(sets)}")
    return sets[kind]


def chat_ids(tokenizer: Any, chat: Chat) -> list[int]:
    """Token ids of one user message, or of a conversation, after the tokenizer's chat template
    with the generation prompt. Without a template: one message as it is, a conversation as its
    turns joined plainly (``User: ...``, ``Assistant: ...``, ending ``Assistant:``)."""
    messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else chat
    if getattr(tokenizer, "chat_template", None) is None:
        text = chat if isinstance(chat, str) else "\n\n".join(
            [f"{m['role'].capitalize()}: {m['content']}" for m in messages] + ["Assistant:"])
        return list(tokenizer(text)["input_ids"])
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def random_prompt(kind: str, index: int, vocab_size: int) -> list[int]:
    """Copy-heavy: a 48-token passage twice, then its start (a prompt with something to copy);
    open-ended: 104 unrelated tokens."""
    rng = random.Random(f"{kind}-{index}")
    if kind.startswith("copy") or kind in GROUPS["copy"]:
        passage = [rng.randrange(2, vocab_size) for _ in range(48)]
        return passage + passage + passage[:8]
    return [rng.randrange(2, vocab_size) for _ in range(104)]


def build_prompts(kind: str, count: int, model_name: str, tokenizer: Any, vocab_size: int,
                  prompt_set: str = "bench") -> list[list[int]]:
    """``count`` prompts of ``kind`` from ``prompt_set`` as token ids (the chats cycle when
    ``count`` is larger)."""
    chats = text_prompts(kind, prompt_set)  # (checks the kind for random models too)
    if model_name in RANDOM_LLAMAS:
        return [random_prompt(kind, i, vocab_size) for i in range(count)]
    return [chat_ids(tokenizer, chats[i % len(chats)]) for i in range(count)]
