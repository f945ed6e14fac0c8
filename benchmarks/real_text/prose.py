"""How the data files write long texts: prose wrapped in the source, code as it is laid out."""

from __future__ import annotations

import textwrap


def prose(text: str) -> str:
    """``text`` with each paragraph (blank-line separated) joined onto one line, so that prose
    can be wrapped at the source's line length without the line breaks reaching the prompt."""
    paragraphs = textwrap.dedent(text).strip().split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def code(text: str) -> str:
    """``text`` dedented, without its first and last blank lines, ending in one newline."""
    return textwrap.dedent(text).strip("\n") + "\n"
