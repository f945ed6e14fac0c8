"""Prompt sets for the speedup comparisons: ones whose answer copies from the prompt, and open ones.

Speculation by prompt lookup (n-gram) pays when the answer repeats spans of the prompt: editing
code, quoting a passage, reformatting a list. On open-ended prompts there is little to copy, and
only a draft model (or the target's own first layers) can guess ahead. Each prompt is a chat
message for the instruction-tuned default model; :func:`chat_token_ids` applies the chat template
so that the engine and Hugging Face ``generate`` see the same token ids.
"""

from __future__ import annotations

from typing import Any

CODE = '''def mean(values):
    total = 0
    for value in values:
        total = total + value
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for value in values:
        total = total + (value - m) ** 2
    return total / len(values)
'''

PASSAGE = (
    "The lighthouse stood at the end of the northern pier. Every evening at dusk the keeper "
    "climbed the one hundred and twelve steps, trimmed the wick and wound the clockwork that "
    "turned the lens. Ships passing the cape could see its beam from twenty miles away, and on "
    "foggy nights the keeper rang the bell every thirty seconds until dawn."
)

FRUITS = "apples, bananas, cherries, dates, elderberries, figs, grapes, honeydew melons, kiwis"

COPY_PROMPTS: dict[str, str] = {
    "edit code": "Rename the variable `total` to `acc` in this Python code. Reply with the whole "
                 f"code only.\n\n```python\n{CODE}```",
    "quote": f"Here is a paragraph:\n\n{PASSAGE}\n\nRepeat the paragraph word for word.",
    "reformat list": f"Turn this comma-separated list into a Markdown bulleted list, one item "
                     f"per line, in the same order:\n\n{FRUITS}",
}

OPEN_PROMPTS: dict[str, str] = {
    "story": "Write a short story about a cat who learns to sail.",
    "explain": "Explain to a child why the sky is blue.",
    "advice": "Give some advice to someone who wants to start running.",
}

PROMPT_KINDS: dict[str, dict[str, str]] = {"copy": COPY_PROMPTS, "open": OPEN_PROMPTS}


def chat_token_ids(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of one user message after the tokenizer's chat template (with the assistant's
    generation prompt), or the plain tokenization when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None) is None:
        return list(tokenizer(prompt)["input_ids"])
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_set(tokenizer: Any, kind: str, num_prompts: int | None = None) -> list[list[int]]:
    """The first ``num_prompts`` prompts (all by default) of one kind, ``copy`` or ``open``, as
    token ids."""
    if kind not in PROMPT_KINDS:
        raise ValueError(f"kind={kind!r} is invalid: allowed {' | '.join(PROMPT_KINDS)}")
    if num_prompts is not None and (not isinstance(num_prompts, int) or num_prompts < 1):
        raise ValueError(f"num_prompts={num_prompts!r} is invalid: allowed None or an integer "
                         ">= 1")
    return [chat_token_ids(tokenizer, p) for p in list(PROMPT_KINDS[kind].values())[:num_prompts]]


def prompt_batch(tokenizer: Any, kind: str, batch_size: int,
                 num_prompts: int | None = None) -> list[list[int]]:
    """``batch_size`` prompts of one kind: :func:`prompt_set` repeated in turn to fill the
    batch."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: allowed an integer >= 1")
    ids = prompt_set(tokenizer, kind, num_prompts)
    return [ids[i % len(ids)] for i in range(batch_size)]
