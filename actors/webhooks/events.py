"""The event the webhooks feature adds to a session's log (``docs/protocol.md``).

A ``SourceBinding`` tells the session's clients that it was bound to a source (so the CI of
that pull request or branch will wake it) or unbound from one. A ``SessionEvent`` (see
``actors.sessions.event_types`` for how its fields are written).
"""

from __future__ import annotations

from turnstile.actors.sessions.event_types import SessionEvent

__all__ = ["SourceBinding"]


class SourceBinding(SessionEvent, tag="source_binding", kw_only=True, frozen=True):
    """The session was bound to a source key, or unbound from one.

    Attributes:
        action: ``bound`` or ``unbound``.
        source: the key (``github:owner/repo#3``, ``github:owner/repo:branch:fix``).
        via: ``tool`` (``bind_source`` / ``unbind_source``), ``http`` (the bindings routes) or
            ``pull_request`` (the session opened that pull request through the http tool).
    """

    action: str
    source: str
    via: str
