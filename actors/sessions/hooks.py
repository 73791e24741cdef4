"""The hook points of the sessions feature: how other features plug into sessions.

Sessions are the hub every other feature builds on, yet sessions import none of them: a feature
fills these hooks when it starts (``turnstile.actors.feature``), and the session actors and the
directory call whatever is there. An empty hook means the feature is not on this node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from turnstile.actors.sessions.agents.base import HistoryEntry
from turnstile.actors.sessions.kinds import InputKinds, session_kinds

__all__ = ["SessionHooks"]


@dataclass
class SessionHooks:
    """What features add to sessions.

    Attributes:
        on_session_end: ``async (key)``, each called when a session is deleted, to end what the
            feature keeps for it (jobs' settings, watchers, tasks, approvals, buffers).
        on_attach: ``async (key)``, each called after a client attached (deliver what was held).
        on_session_created: ``(owner, key)``, each called after a user created a session (a
            derived one is not counted): it must not block, and one that raises is logged and
            the session is created all the same (memory wakes its extraction of the owner's
            stale sessions, as the reference does on ``POST /sessions``).
        automations: ``async (key) -> list[dict]``: scheduled work bound to a session, which
            blocks deleting it unless confirmed.
        cancel_automations: ``async (key)``: cancels that work (a confirmed delete).
        pending_recall: ``async (key) -> dict | None``: the session's pending recall (listings
            show it and can filter on it).
        resolve_approval: ``async (user, approval_id, approved) -> dict``: the WebSocket
            ``approve``/``deny`` frames.
        approval_heard: ``(approval_id)``: another node says it recorded an answer to an
            approval (several nodes): the node whose call waits for it reads it.
        tool_profiles: tool profiles by name that a turn input may ask for (None allows all).
        shaper: chooses each turn's tools, default prompt and history budget.
        input_kinds: the node's turn input kinds by source (``kinds.InputKinds``): each
            feature registers the kinds of input it writes when it starts (scheduling: cron,
            once, recall, heartbeat, check; webhooks: webhook); sessions' own are there from
            the start.
        turn_history: ``async (owner, session_key, input_id) -> [HistoryEntry]``: the history
            a turn sees instead of its session's own (the ``unified_session`` mode:
            ``history.unified_history``); None for the session's own. One that raises is
            logged and the turn gets its session's own history.
        turn_context: ``async (owner, session_key) -> str | None``, each called as a turn
            starts: a system message for the turn (``TurnInput.system_messages``, in this
            order), or None for nothing. Called on every turn start, so each must be cheap
            when nothing changed (cache); one that raises is logged and left out of the turn.
        scheduled_turns: the node's scheduled-turn slots (``[limits]
            max_concurrent_scheduled_turns``), set by the sessions feature when it is ready;
            background model work (memory extraction) takes one too, so it never competes
            with user turns, which take none.
    """

    on_session_end: list[Callable[[str], Awaitable[Any]]] = field(default_factory=list)
    on_attach: list[Callable[[str], Awaitable[Any]]] = field(default_factory=list)
    on_session_created: list[Callable[[str, str], None]] = field(default_factory=list)
    automations: Callable[[str], Awaitable[list[dict[str, Any]]]] | None = None
    cancel_automations: Callable[[str], Awaitable[Any]] | None = None
    pending_recall: Callable[[str], Awaitable[dict[str, Any] | None]] | None = None
    resolve_approval: Callable[[str, str, bool], Awaitable[dict[str, Any]]] | None = None
    approval_heard: Callable[[str], None] | None = None
    tool_profiles: dict[str, frozenset[str] | None] = field(default_factory=lambda: {"full": None})
    shaper: Any = None
    input_kinds: InputKinds = field(default_factory=session_kinds)
    turn_context: list[Callable[[str, str], Awaitable[str | None]]] = field(default_factory=list)
    turn_history: Callable[[str, str, int], Awaitable[list[HistoryEntry]]] | None = None
    scheduled_turns: Any = None
