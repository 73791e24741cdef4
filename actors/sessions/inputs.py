"""The sessions feature's own turn inputs, and what every input's payload has.

Every turn starts from an inbox row (``InboxItem``): a ``source`` and a JSON ``payload``. The
payload has no tag of its own — the row's ``source`` is the tag — and the feature that writes a
source owns its payload Struct (``kinds``: the registry of input kinds). This module holds what
the session hub itself owns:

================  =======================  =================================================
``source``        Struct                   written by
================  =======================  =================================================
``user``          :class:`UserMessage`     the directory's ``submit`` (HTTP and WebSocket)
``notification``  :class:`Injection`       ``Inject``: the notification buffer, watcher
                                           escalation, background-task results
anything no       :class:`OtherInput`      a ``Submit`` or ``Inject`` with a source of its
feature owns                               own
================  =======================  =================================================

and the base of every payload, :class:`TurnPayload`: ``content`` (the text the turn starts
from) and ``was_injected``. Those two keys are all the hub reads of a payload it does not own.
Scheduling's inputs are in ``turnstile.actors.scheduling.inputs``, the webhooks' in
``turnstile.actors.webhooks.inputs``.

Compatibility: payloads stored before these Structs existed must keep reading. So every field
has a default, unknown keys are ignored (callers may add their own), and the types are strict
(no ``"3"`` for ``3``). Nothing is re-encoded: the store keeps the row as written, and the
agent's ``TurnInput.payload`` is the stored dict (less ``content``), not these Structs. A
payload that does not convert raises :class:`InputPayloadError`; the session closes that turn
as ``failed`` and goes on.
"""

from __future__ import annotations

import msgspec

from turnstile.runtime.errors import InvalidArgument

__all__ = [
    "IN_SESSION",
    "Injection",
    "InputPayloadError",
    "OtherInput",
    "TurnPayload",
    "UserMessage",
]

#: The output channel that means "into the session" (a turn the agent answers).
IN_SESSION = "llm_notification"


class InputPayloadError(InvalidArgument):
    """An input's payload does not decode as the Struct its ``source`` names (a row written by
    hand, by a newer version, or damaged; or a ``Submit`` carrying such a payload).

    Attributes:
        input_id: the inbox row, or None for an input not stored yet (a ``Submit``).
        source: the input's source.
    """

    code = "bad_input_payload"

    def __init__(self, input_id: int | None, source: str, why: str) -> None:
        what = "a submitted input" if input_id is None else f"input {input_id}"
        super().__init__(f"{what} ({source!r}) has an unreadable payload: {why}", "payload")
        self.input_id = input_id
        self.source = source


class TurnPayload(msgspec.Struct, frozen=True, kw_only=True):
    """What every input's payload has: all the session hub reads of one it does not own.

    Attributes:
        content: the text the turn starts from (for a job: the rendered prompt or trigger line).
        was_injected: it was folded into a turn that ended before the agent took it, and was
            queued again as a turn of its own.
    """

    content: str = ""
    was_injected: bool = False


class UserMessage(TurnPayload, frozen=True, kw_only=True):
    """A message the session's owner sent (``source="user"``)."""


class Injection(TurnPayload, frozen=True, kw_only=True):
    """A notice for the session sent with ``Inject`` (``source="notification"``), queued as a
    turn of its own because no turn was running to take it.

    Attributes:
        notification_id: (notify tool) the notification it tells of.
        watcher_id: (watcher escalation) the first watcher of the batch.
        watcher_ids: (watcher escalation) every watcher of the batch.
        background_tasks: (background results) the finished tasks it reports.
    """

    notification_id: str | None = None
    watcher_id: str | None = None
    watcher_ids: list[str | None] = msgspec.field(default_factory=list)
    background_tasks: list[str] = msgspec.field(default_factory=list)


class OtherInput(TurnPayload, frozen=True, kw_only=True):
    """An input whose source no feature registered (a ``Submit`` or ``Inject`` with a source
    of its own): an ordinary turn of its ``content``."""
