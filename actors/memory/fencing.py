"""Text that reaches a model as data: fenced blocks it cannot close, lines it cannot break.

Memory puts text that others wrote in front of a model twice: the summary (and the facts it is
rendered from) at the start of every turn, and a session's transcript (tool output, webhook
bodies, notifications) in the extraction prompt. Neither may become structure of the prompt it
sits in: a fact whose value holds ``\\n\\n## SYSTEM OVERRIDE`` must not start a heading, a tool
result must not close its block and go on as ``User: …``. Two tools make that hold by
construction, whatever the text holds:

- ``fence(text, info)``: a Markdown fenced block whose fence is a backtick run longer than any
  in ``text`` (three at least). A fence is closed only by a run at least as long, so nothing
  inside can close it: every line of ``text``, a ``#`` heading, a ```` ``` ````, a run of a
  thousand backticks, stays inside.
- ``one_line(text)``: ``text`` with every character that can end a line (control characters,
  NEL, the Unicode line and paragraph separators) written as an escape (``\\n``, ``\\u2028``),
  so a value is one line of whatever it is put in.
"""

from __future__ import annotations

import re

__all__ = ["fence", "longest_backtick_run", "one_line"]

_BACKTICKS = re.compile(r"`+")
# C0 and C1 controls (newlines, tabs, NEL among them) and the Unicode line/paragraph separators
_BREAKING = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def longest_backtick_run(text: str) -> int:
    """The length of the longest run of backticks in ``text`` (0 when it has none)."""
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)


def fence(text: str, info: str = "") -> str:
    """``text`` as a fenced block that nothing in it can close.

    Args:
        text: the content, kept exactly (its own lines are the block's lines).
        info: the info string after the opening fence (a word such as ``memory``; no
            backticks, no line breaks).

    Returns:
        the opening fence (and ``info``), a newline, ``text``, a newline and the closing fence;
        the fence is one backtick longer than the longest run in ``text``, three at least.

    Raises:
        ValueError: ``info`` holds a backtick or a line break.
    """
    if "`" in info or one_line(info) != info:
        raise ValueError("info must hold no backtick and no line break")
    bar = "`" * max(3, longest_backtick_run(text) + 1)
    return f"{bar}{info}\n{text}\n{bar}"


def one_line(text: str) -> str:
    """``text`` with every character that could end a line written as an escape: ``\\n``,
    ``\\r``, ``\\t``, else ``\\uXXXX``; nothing else changes."""
    return _BREAKING.sub(lambda m: _NAMED.get(m.group(), f"\\u{ord(m.group()):04x}"), text)
