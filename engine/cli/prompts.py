"""CLI prompts: ``--prompt``, ``--prompts-file`` (text or JSONL), the demo, chat templates."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The demo copies most of its answer from the prompt, so n-gram speculation visibly pays, and the
# default model (135M parameters) gets it right: every mistake fixed, every sentence kept (other
# copy tasks tried, such as correcting a paragraph, repeating it or adding a docstring, came back
# with typos kept or sentences dropped).
DEMO_TEXT = (
    "Correct the grammar of this email and return the full corrected email.\n\n"
    "Hi Anna,\n\n"
    "Thank you for you message. I will send the report tomorow morning, after the meeting with "
    "the team. Please let me know if you needs anything else.\n\n"
    "Best regards,\nTom"
)


@dataclass
class PromptItem:
    """One prompt: plain text, or chat ``messages`` (``[{"role": ..., "content": ...}]``)."""

    text: str | None = None
    messages: list[dict[str, str]] | None = None

    @property
    def source(self) -> str | list[dict[str, str]]:
        """What the user gave, for the JSON output."""
        return self.text if self.messages is None else self.messages

    def preview(self, width: int = 60) -> str:
        text = self.text if self.messages is None else self.messages[-1]["content"]
        text = " ".join(text.split())
        return text if len(text) <= width else text[: width - 3] + "..."


DEMO_PROMPT = PromptItem(messages=[{"role": "user", "content": DEMO_TEXT}])


def _check_messages(where: str, messages: Any) -> list[dict[str, str]]:
    ok = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in messages)
    if not ok:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of "
                         '{"role": str, "content": str} objects')
    return messages


def _parse_jsonl_line(where: str, line: str) -> PromptItem:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(record, dict) or len(record.keys() & {"prompt", "messages"}) != 1:
        raise ValueError(f'{where}: expected an object with "prompt" or "messages", got {line!r}')
    unknown = sorted(record.keys() - {"prompt", "messages"})
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: prompt, messages")
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        return PromptItem(text=record["prompt"])
    return PromptItem(messages=_check_messages(where, record["messages"]))


def read_prompts_file(path: str | Path) -> list[PromptItem]:
    """One prompt per non-empty line, or, for ``.jsonl``, one JSON object per line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--prompts-file {str(path)!r} not found")
    lines = path.read_text().splitlines()
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            items.append(_parse_jsonl_line(f"{path}:{number}", line))
        else:
            items.append(PromptItem(text=line))
    if not items:
        raise ValueError(f"--prompts-file {str(path)!r} holds no prompt")
    return items


def read_prompts(prompts: list[str] | None, prompts_file: str | None) -> list[PromptItem]:
    """``--prompt`` values, then the file's prompts; empty when neither is given."""
    items = [PromptItem(text=p) for p in prompts or []]
    if any(not item.text for item in items):
        raise ValueError("--prompt must not be empty")
    if prompts_file is not None:
        items += read_prompts_file(prompts_file)
    return items


def render_prompts(items: list[PromptItem], llm: Any,
                   chat: bool | None) -> list[str | dict[str, Any]]:
    """What ``LLM.generate`` takes: the text of a plain prompt, or vLLM's
    ``{"prompt": formatted text, "prompt_token_ids": ids}`` of a templated one.

    ``chat``: True applies the chat template to plain prompts too (as one user message), False
    never, None (the default) when the tokenizer has a template (an instruct model);
    ``messages`` prompts always get it.
    """
    if chat is None:
        chat = getattr(llm.get_tokenizer(), "chat_template", None) is not None
    rendered: list[str | dict[str, Any]] = []
    for item in items:
        if item.messages is None and not chat:
            rendered.append(item.text)
        else:
            messages = item.messages or [{"role": "user", "content": item.text}]
            ((text, ids),) = llm.chat_inputs([messages])
            rendered.append({"prompt": text, "prompt_token_ids": ids})
    return rendered
