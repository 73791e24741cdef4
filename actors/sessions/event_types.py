"""A session's events, typed: one Struct per event type, tagged by ``type``.

Every event a session stores and offers to its clients is a ``SessionEvent``. The session
feature defines the events it emits itself (a turn's stream, its tool calls, its closure…);
every other feature defines the events it publishes in its own package (``events.py``:
``JobUpdate``, ``WatcherUpdate``, ``Notification``, ``ApprovalRequired``…), subclassing
``SessionEvent``, and sends them with ``Publish``.

The store keeps events as ``(type, payload)`` and the gateway sends them as
``{"type", ...payload, "session_id", "seq", "ts"}`` (``docs/protocol.md``). A Struct becomes
that pair once, when the session emits it (:meth:`SessionEvent.stored`), so stored rows and
frames are exactly what they were before these Structs existed: existing databases and clients
keep working. That fixes two things about every Struct here:

* **Field order is key order.** ``msgspec.to_builtins`` writes fields in declaration order, so
  each Struct declares its fields in the order the event's keys were always written.
* **Absent keys are ``UNSET``.** A key that only some events of a type carry (``call_id``,
  ``error``, ``usage``…) defaults to ``msgspec.UNSET`` and is left out when unset; every other
  field is always written, ``None`` included (``omit_defaults`` stays off, so a field whose
  value happens to equal its default is still written, as it was).

Stored events are read back as dicts (history, replay), never decoded into these Structs.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "SessionEvent",
    "TurnQueued",
    "StreamStart",
    "ThinkingDelta",
    "StreamDelta",
    "ToolStarted",
    "ToolCalled",
    "InjectedMessage",
    "TokenUsage",
    "StreamEnd",
    "SessionSync",
    "HeartbeatSuppressed",
    "HeartbeatDisabled",
    "event_types",
]


class SessionEvent(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """Base of every session event. Subclasses set their ``type`` with ``tag=...`` and pass
    ``kw_only=True`` (msgspec applies it per class); see the module docstring for the rules
    their fields follow."""

    def stored(self) -> tuple[str, dict[str, Any]]:
        """The event as the store keeps it: ``(type, payload)``, the payload without ``type``."""
        payload = msgspec.to_builtins(self)
        return payload.pop("type"), payload


def event_types() -> dict[str, type[SessionEvent]]:
    """Every ``SessionEvent`` subclass defined so far, by its ``type`` tag.

    Only the modules imported so far count: import a feature's ``events`` module to see its
    events.
    """
    found: dict[str, type[SessionEvent]] = {}
    todo = list(SessionEvent.__subclasses__())
    while todo:
        cls = todo.pop()
        tag = cls.__struct_config__.tag
        # msgspec allows int tags too; an event's tag is its ``type``, a string on the wire
        if not isinstance(tag, str):
            raise TypeError(f"{cls.__name__} must be tagged with a str, not {tag!r}")
        found[tag] = cls
        todo.extend(cls.__subclasses__())
    return found


class TurnQueued(SessionEvent, tag="turn_queued", kw_only=True, frozen=True):
    """An input was stored in the session's inbox.

    Attributes:
        input_id: the inbox row.
        source: where it came from (``user``, ``cron``, ``recall``, ``notification``…).
        ahead: how many inputs run before it (the running turn included).
    """

    input_id: int
    source: str
    ahead: int


class StreamStart(SessionEvent, tag="stream_start", kw_only=True, frozen=True):
    """A turn started.

    Attributes:
        input_id: the inbox row the turn runs.
        source: the input's source.
        content: the text the turn starts from (for a recall, its trigger line).
        job_id: (scheduled inputs) the job that delivered it.
        run_id: (scheduled inputs) the job's run record.
        label: (scheduled inputs) the job's label, when it has one.
        kind: (scheduled inputs) the job's kind, when the input names it.
        prompt_ref: (cron prompts) the prompt's versioned reference (``name``, ``version``,
            ``sha256``, ``template``).
        reference: (scheduled checks) the PR, ticket or URL the check is about.
        is_recall: (recalls) always true.
        instruction: (recalls) the self-instruction the agent gets as a system message.
        rerun: (a turn run again after a crash cut it off, ``[limits] max_turn_reruns``)
            which time it runs again: 1, 2…
        notice: (scheduled notifications and tool results) the input is the runtime telling
            the agent something, given to a model as a system message (``TurnInput.notice``).
    """

    input_id: int
    source: str
    content: str
    job_id: str | UnsetType = UNSET
    run_id: int | UnsetType = UNSET
    label: str | UnsetType = UNSET
    kind: str | UnsetType = UNSET
    prompt_ref: dict[str, Any] | UnsetType = UNSET
    reference: str | UnsetType = UNSET
    is_recall: bool | UnsetType = UNSET
    instruction: str | UnsetType = UNSET
    rerun: int | UnsetType = UNSET
    notice: bool | UnsetType = UNSET


class ThinkingDelta(SessionEvent, tag="thinking_delta", kw_only=True, frozen=True):
    """A piece of the agent's reasoning (emitted per token: keep it small)."""

    input_id: int
    text: str


class StreamDelta(SessionEvent, tag="stream_delta", kw_only=True, frozen=True):
    """A piece of the agent's answer (emitted per token: keep it small)."""

    input_id: int
    text: str


class ToolStarted(SessionEvent, tag="tool_started", kw_only=True, frozen=True):
    """The agent called a tool.

    Attributes:
        input_id: the turn's input.
        tool: the tool's name.
        call_id: the model's id for the call, when it gave one.
        arguments: the call's arguments, as the agent sent them.
    """

    input_id: int
    tool: str
    call_id: str | UnsetType = UNSET
    arguments: dict[str, Any]


class ToolCalled(SessionEvent, tag="tool_call", kw_only=True, frozen=True):
    """A tool call the agent made finished (``tool_call``).

    Attributes:
        input_id, tool, call_id, arguments: as in its ``tool_started``.
        ok: whether it succeeded.
        result: (``ok``) what the tool returned; may be null.
        error: (not ``ok``) ``{code, message, …}``.
    """

    input_id: int
    tool: str
    call_id: str | UnsetType = UNSET
    arguments: dict[str, Any]
    ok: bool
    result: Any = UNSET
    error: dict[str, Any] | None | UnsetType = UNSET


class InjectedMessage(SessionEvent, tag="user_message", kw_only=True, frozen=True):
    """An input folded into the running turn (policy ``inject``, a notification, a watcher
    escalation, background results) instead of queued (``user_message``).

    The input's own payload keys follow ``injected_into`` at the top level, as they always did:
    the known ones are fields, and ``extra`` carries any other key a caller of ``Submit`` or
    ``Inject`` put in its payload (flattened, never nested).

    Attributes:
        source: the input's source (``user``, ``notification``…).
        content: its text.
        injected_into: the inbox row of the turn it was folded into.
        notification_id: (notify tool) the notification it tells of.
        watcher_id: (watcher escalation) the first watcher of the batch.
        watcher_ids: (watcher escalation) every watcher of the batch.
        background_tasks: (background results) the finished tasks it reports.
        extra: any other payload key, written after these.
    """

    source: str
    content: str
    injected_into: int
    notification_id: str | UnsetType = UNSET
    watcher_id: str | None | UnsetType = UNSET
    watcher_ids: list[str | None] | UnsetType = UNSET
    background_tasks: list[str] | UnsetType = UNSET
    extra: dict[str, Any] | UnsetType = UNSET

    @classmethod
    def of(
        cls, source: str, content: str, injected_into: int, payload: dict[str, Any]
    ) -> InjectedMessage:
        """The event for an input with ``payload``: its known keys as fields, the rest
        ``extra``. A payload whose keys come in another order than the fields' is written in
        the fields' order, then ``extra``'s."""
        known = {k: v for k, v in payload.items() if k in _INJECTED_KNOWN}
        rest = {k: v for k, v in payload.items() if k not in _INJECTED_KNOWN}
        return cls(
            source=source,
            content=content,
            injected_into=injected_into,
            extra=rest if rest else UNSET,
            **known,
        )

    def stored(self) -> tuple[str, dict[str, Any]]:
        type_, payload = SessionEvent.stored(self)
        extra = payload.pop("extra", None)
        if extra:
            payload.update(extra)  # as ``{..., **payload}`` always did
        return type_, payload


_INJECTED_KNOWN = frozenset({"notification_id", "watcher_id", "watcher_ids", "background_tasks"})


class TokenUsage(msgspec.Struct, kw_only=True, frozen=True):
    """The tokens a turn's model calls used, summed (``stream_end.usage``)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class StreamEnd(SessionEvent, tag="stream_end", kw_only=True, frozen=True):
    """A turn closed; every turn that starts ends with exactly one.

    Attributes:
        input_id: the turn's input.
        status: ``completed``, ``empty``, ``failed``, ``stopped`` or ``interrupted``.
        text: the agent's answer (may be empty).
        error: (``failed``) a short message; the traceback stays in the run record.
        usage: the tokens used, when the agent's server reported them.
        source: the source of the input the turn answered, when it is not ``user`` (so the
            answer renders as a cron job's or a recall's).
        job_id: (scheduled inputs but recalls) the job whose firing the turn answered.
        label: with ``job_id``, the job's label (a ``cron`` job's name), when it has one.
    """

    input_id: int
    status: str
    text: str
    error: str | UnsetType = UNSET
    usage: TokenUsage | UnsetType = UNSET
    source: str | UnsetType = UNSET
    job_id: str | UnsetType = UNSET
    label: str | UnsetType = UNSET


class SessionSync(SessionEvent, tag="session_sync", kw_only=True, frozen=True):
    """A turn that started with no client attached ended: re-read history and state.

    The attach-time ``session_sync`` frame (not stored, no ``input_id``) is the gateway's.

    Attributes:
        busy: whether a turn runs now (always false: the turn just ended).
        policy: the session's policy.
        queued: inputs waiting.
        input_id: the turn that just ended.
        status: its ``stream_end`` status.
    """

    busy: bool
    policy: str
    queued: int
    input_id: int
    status: str


class HeartbeatSuppressed(SessionEvent, tag="heartbeat_suppressed", kw_only=True, frozen=True):
    """A quiet heartbeat ran and was not forwarded.

    Attributes:
        input_id: the heartbeat's input.
        chars: the length of its (unforwarded) answer.
    """

    input_id: int
    chars: int


class HeartbeatDisabled(SessionEvent, tag="heartbeat_disabled", kw_only=True, frozen=True):
    """A failing heartbeat with ``on_error: disable`` was turned off.

    Attributes:
        job_id: the heartbeat's job.
        error: why its turn failed.
    """

    job_id: str
    error: str
