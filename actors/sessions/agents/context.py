"""History within a budget: what of a session's transcript a turn hands its agent.

A model's context is finite, and a long session's transcript is not, so before each turn the
session fits the history into ``max_context_tokens`` (less what the system prompt, the tool
schemas and the new input take). The rules, in the order they are applied:

1. Nothing is touched while the history fits.
2. Tool results longer than ``keep_tool_chars`` are cut, oldest first, to their head plus a
   pointer: ``… [truncated; N chars — see history]`` (the full result stays in the session's
   event log, ``GET /sessions/{id}/history``), until the history fits.
3. Then whole turns are dropped, oldest first, until it fits. A turn is a ``user`` entry and
   everything after it up to the next ``user`` entry (its tool calls and its answer), so a tool
   result never loses the call it answers and a call never loses its result: they go together.
   Entries before the first ``user`` entry (a transcript whose start was cut off) are a partial
   turn and go first.

Tokens are estimated, not counted: about four characters a token, plus a few per message for
the chat format's framing. That is close enough for English and JSON with the common tokenizers,
and needs no tokenizer for every model server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import msgspec

from turnstile.actors.sessions.agents.base import HistoryEntry

__all__ = [
    "CHARS_PER_TOKEN",
    "KEEP_TOOL_CHARS",
    "estimate_tokens",
    "entry_tokens",
    "fit_history",
    "truncate_tool_result",
]

#: The estimate's characters per token.
CHARS_PER_TOKEN = 4
#: Tokens each message costs beyond its text (role and separators in the chat format).
MESSAGE_OVERHEAD_TOKENS = 4
#: How much of a long tool result is kept when it has to be cut.
KEEP_TOOL_CHARS = 1000


def estimate_tokens(text: str) -> int:
    """About how many tokens ``text`` takes (four characters a token, rounded up)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def entry_tokens(entry: HistoryEntry) -> int:
    """About how many tokens ``entry`` takes as chat messages (a tool entry is its call, with
    the tool's name and arguments, and its result)."""
    chars = len(entry.content)
    if entry.role == "tool":
        chars += len(entry.tool or "") + len(msgspec.json.encode(entry.arguments or {}))
        return math.ceil(chars / CHARS_PER_TOKEN) + 2 * MESSAGE_OVERHEAD_TOKENS
    return math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS


def truncate_tool_result(content: str, keep: int = KEEP_TOOL_CHARS) -> str:
    """``content`` cut to ``keep`` characters plus a pointer to the full result, or as it is
    when it is no longer than ``keep``."""
    if len(content) <= keep:
        return content
    return f"{content[:keep]}… [truncated; {len(content)} chars — see history]"


def fit_history(
    entries: Sequence[HistoryEntry], budget_tokens: int, *, keep_tool_chars: int = KEEP_TOOL_CHARS
) -> list[HistoryEntry]:
    """The part of ``entries`` (oldest first) that fits ``budget_tokens``, as the module
    docstring describes.

    Args:
        entries: the transcript, oldest first.
        budget_tokens: what the history may take; 0 or less leaves no history at all.
        keep_tool_chars: how much of a long tool result survives truncation.

    Returns:
        a new list; ``entries`` is not changed.

    Raises:
        ValueError: ``keep_tool_chars`` is negative.
    """
    if keep_tool_chars < 0:
        raise ValueError("keep_tool_chars must be >= 0")
    sizes = [entry_tokens(e) for e in entries]
    total = sum(sizes)
    if total <= budget_tokens:
        return list(entries)
    fitted = list(entries)
    for i, entry in enumerate(fitted):
        if total <= budget_tokens:
            break
        if entry.role != "tool" or len(entry.content) <= keep_tool_chars:
            continue
        cut = msgspec.structs.replace(
            entry, content=truncate_tool_result(entry.content, keep_tool_chars)
        )
        fitted[i] = cut
        size = entry_tokens(cut)
        total += size - sizes[i]
        sizes[i] = size
    groups = list(_turns(range(len(fitted)), fitted))
    while total > budget_tokens and groups:
        for i in groups.pop(0):
            total -= sizes[i]
    return [fitted[i] for group in groups for i in group]


def _turns(indices: Iterable[int], entries: Sequence[HistoryEntry]) -> Iterable[list[int]]:
    """Indices of ``entries`` grouped into turns: each group starts at a ``user`` entry (the
    first group may be a partial turn without one)."""
    group: list[int] = []
    for i in indices:
        if entries[i].role == "user" and group:
            yield group
            group = []
        group.append(i)
    if group:
        yield group
