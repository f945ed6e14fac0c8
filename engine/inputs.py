"""What the API accepts as prompts and conversations, checked before any work.

Prompts: a string, a list of token ids, or vLLM's dicts ``{"prompt": text}`` /
``{"prompt_token_ids": ids}``; one of them or a list of them. Conversations: a list of
``{"role": str, "content": str}`` messages, or a list of such lists. Anything else is a
``TypeError`` or ``ValueError`` that names what was wrong and where.
"""

from __future__ import annotations

from collections import abc
from typing import Any

Prompt = str | abc.Sequence[int] | dict[str, Any]  # text, token ids, or vLLM's dict forms
Messages = list[dict[str, str]]
PROMPT_FORMS = ("a string, a list of token ids, or a dict with 'prompt' (a string) or "
                "'prompt_token_ids' (token ids)")


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def normalize_prompts(prompts: Prompt | abc.Sequence[Prompt],
                      tokenizer: Any) -> list[tuple[str | None, list[int]]]:
    """``(text or None, token ids)`` for each prompt, in order."""
    if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple)) and prompts and all(map(_is_token_id, prompts))):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be one prompt or a list of prompts ({PROMPT_FORMS}), "
                        f"got {type(prompts).__name__}")
    return [one_prompt(prompt, tokenizer, i) for i, prompt in enumerate(prompts)]


def one_prompt(prompt: Prompt, tokenizer: Any, index: int = 0) -> tuple[str | None, list[int]]:
    """``(text or None, token ids)`` of one prompt (``index``: its place, for errors)."""
    where = f"prompt {index}"
    if isinstance(prompt, dict):
        return _prompt_dict(prompt, tokenizer, where)
    if isinstance(prompt, str):
        ids = tokenizer(prompt)["input_ids"] if prompt else []
        return prompt, list(ids)
    if isinstance(prompt, (list, tuple)):
        bad = next((i for i, t in enumerate(prompt) if not _is_token_id(t)), None)
        if bad is None:
            return None, list(prompt)
        raise TypeError(f"{where}: a token id list must hold integers only; element {bad} is "
                        f"{type(prompt[bad]).__name__} {prompt[bad]!r}")
    raise TypeError(f"{where} must be {PROMPT_FORMS}, got {type(prompt).__name__}")


# vLLM's TextPrompt / TokensPrompt keys: what each means here.
PROMPT_KEYS = ("prompt", "prompt_token_ids", "cache_salt")
UNSERVED_PROMPT_KEYS = {"multi_modal_data": "this engine serves text-only models",
                        "mm_processor_kwargs": "this engine serves text-only models",
                        "token_type_ids": "decoder-only models take no token type ids"}


def _prompt_dict(prompt: dict[str, Any], tokenizer: Any,
                 where: str) -> tuple[str | None, list[int]]:
    """vLLM's dict prompts: ``{"prompt": text}``, ``{"prompt_token_ids": ids}`` (with an
    optional ``"prompt"``: the text those ids stand for, reported as the output's prompt);
    ``cache_salt`` is accepted and has no effect (there is no prefix cache to salt)."""
    for key in prompt:
        if key in UNSERVED_PROMPT_KEYS:
            raise ValueError(f"{where}: {key!r} is not served: {UNSERVED_PROMPT_KEYS[key]}")
        if key not in PROMPT_KEYS:
            raise ValueError(f"{where}: unknown prompt dict key {key!r}; allowed: "
                             f"{', '.join(PROMPT_KEYS)}")
    text = prompt.get("prompt")
    if text is not None and not isinstance(text, str):
        raise TypeError(f"{where}: 'prompt' must be a string, got {type(text).__name__}")
    if "prompt_token_ids" not in prompt:
        if text is None:
            raise ValueError(f"{where}: a prompt dict needs 'prompt' (a string) or "
                             "'prompt_token_ids' (token ids)")
        return one_prompt(text, tokenizer)
    ids = prompt["prompt_token_ids"]
    if not isinstance(ids, (list, tuple)):
        raise TypeError(f"{where}: prompt_token_ids must be a list of token ids, got "
                        f"{type(ids).__name__}")
    return text, one_prompt(list(ids), tokenizer)[1]


def normalize_conversations(messages: Messages | abc.Sequence[Messages]) -> list[Messages]:
    """One conversation or a list of them, each checked: a non-empty list of dicts with a string
    ``role`` and a string ``content``."""
    if isinstance(messages, (list, tuple)) and messages and isinstance(messages[0], dict):
        messages = [messages]
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError("messages must be a conversation (a list of {'role': ..., 'content': ...} "
                        "dicts) or a list of conversations, got "
                        f"{type(messages).__name__} {_preview(messages)}")
    return [_check_conversation(c, i) for i, c in enumerate(messages)]


def _check_conversation(conversation: Any, index: int) -> Messages:
    where = f"conversation {index}"
    if not isinstance(conversation, (list, tuple)) or not conversation:
        raise TypeError(f"{where} must be a non-empty list of message dicts, got "
                        f"{type(conversation).__name__} {_preview(conversation)}")
    for j, message in enumerate(conversation):
        if not isinstance(message, dict):
            raise TypeError(f"{where}, message {j} must be a dict with 'role' and 'content', "
                            f"got {type(message).__name__} {_preview(message)}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"{where}, message {j} has no {key!r}: {_preview(message)}")
            if not isinstance(message[key], str):
                raise TypeError(f"{where}, message {j}: {key} must be a string, got "
                                f"{type(message[key]).__name__} {_preview(message[key])}")
    return [dict(m) for m in conversation]


def _preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
