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

A turn grows while it runs: each round of tool calls adds the calls and their results, and
one result can be far larger than the whole budget (a fetched page). So before each model
call an agent fits the call as a whole (``fit_messages``, over chat-format messages: its own
system prompt and the features' system messages counted too) into the budget, less the
answer's ``max_tokens`` when the turn sets one (servers count prompt and completion against
one window), in this order, stopping as soon as it fits:

4. long tool results of earlier turns are cut, oldest first, as in rule 2;
5. whole earlier turns are dropped, oldest first, as in rule 3;
6. this turn's own tool results are cut, oldest first, each to what still fits (never below
   ``keep_tool_chars``), so the newest result keeps as much as the budget leaves.

What is left then (the system prompts, the input, the turn's calls) is sent as it is; a server
that refuses it says so, and the turn fails with that message.

Tokens are estimated, not counted: about four characters a token, plus a few per message for
the chat format's framing. That is close enough for English and JSON with the common tokenizers,
and needs no tokenizer for every model server.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from turnstile.actors.sessions.agents.base import HistoryEntry

__all__ = [
    "CHARS_PER_TOKEN",
    "KEEP_TOOL_CHARS",
    "estimate_tokens",
    "entry_tokens",
    "fit_history",
    "fit_messages",
    "message_tokens",
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


_POINTER = re.compile(r"… \[truncated; (\d+) chars — see history\]\Z")


def truncate_tool_result(content: str, keep: int = KEEP_TOOL_CHARS) -> str:
    """``content`` cut to ``keep`` characters plus a pointer to the full result, or as it is
    when it is no longer than ``keep``. A result cut before is cut again from what was kept,
    and its pointer still gives the full result's length."""
    full = len(content)
    if (pointer := _POINTER.search(content)) is not None:
        content, full = content[: pointer.start()], int(pointer.group(1))
    if len(content) <= keep:
        return (
            content
            if full == len(content)
            else f"{content}… [truncated; {full} chars — see history]"
        )
    return f"{content[:keep]}… [truncated; {full} chars — see history]"


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


def message_tokens(message: dict[str, Any]) -> int:
    """About how many tokens a chat-format message takes: its text, and for an assistant
    message its tool calls' names and arguments."""
    chars = len(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        chars += len(function.get("name") or "") + len(function.get("arguments") or "")
    return math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS


def fit_messages(
    messages: list[dict[str, Any]],
    budget_tokens: int,
    *,
    history: tuple[int, int],
    fixed_tokens: int = 0,
    keep_tool_chars: int = KEEP_TOOL_CHARS,
) -> int:
    """Fit one model call's chat-format ``messages`` into ``budget_tokens``, in place, by rules
    4 to 6 of the module docstring.

    Args:
        messages: the call's messages: system messages, then the earlier turns
            (``messages[history[0]:history[1]]``, each starting at a ``user`` message), then
            this turn's input and everything the turn added since.
        budget_tokens: what the whole call may take.
        history: where the earlier turns start and end in ``messages``.
        fixed_tokens: what the call takes besides its messages (the tool schemas).
        keep_tool_chars: how much of a long tool result survives a cut.

    Returns:
        how many messages were dropped (all from the earlier turns, so the turn's own messages
        moved that much towards the start).
    """
    sizes = [message_tokens(m) for m in messages]
    total = fixed_tokens + sum(sizes)
    if total <= budget_tokens:
        return 0
    start, end = history

    def cut(i: int, keep: int) -> None:
        nonlocal total
        messages[i] = {**messages[i], "content": truncate_tool_result(messages[i]["content"], keep)}
        size = message_tokens(messages[i])
        total += size - sizes[i]
        sizes[i] = size

    for i in range(start, end):  # 4. earlier turns' long tool results
        if total <= budget_tokens:
            break
        if messages[i].get("role") == "tool" and len(messages[i]["content"]) > keep_tool_chars:
            cut(i, keep_tool_chars)
    drop = start  # 5. whole earlier turns, oldest first
    while total > budget_tokens and drop < end:
        following = drop + 1
        while following < end and messages[following].get("role") != "user":
            following += 1
        total -= sum(sizes[drop:following])
        drop = following
    for i in range(end, len(messages)):  # 6. this turn's tool results, each to what fits
        if total <= budget_tokens:
            break
        content = messages[i].get("content") or ""
        if messages[i].get("role") == "tool" and len(content) > keep_tool_chars:
            over = (total - budget_tokens) * CHARS_PER_TOKEN
            # the pointer the cut adds takes some 40 characters of its own
            cut(i, max(keep_tool_chars, len(content) - over - 64))
    del messages[start:drop]
    return drop - start
