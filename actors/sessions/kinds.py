"""Turn input kinds: what an inbox row's ``source`` means, owned by the feature that writes it.

Every turn starts from an inbox row: a ``source`` and a JSON ``payload``. The session hub runs
turns but does not know what a cron run, a recall or a CI failure is; each feature registers the
kinds of input it writes (``SessionHooks.input_kinds``, filled in the feature's ``start``):

=============  ==================================  =============================================
feature        sources                             payload Structs
=============  ==================================  =============================================
sessions       ``user``, ``notification``          ``UserMessage``, ``Injection``
scheduling     ``schedule``, ``once``, ``cron``,   ``ScheduledJob``, ``CronTrigger``,
               ``recall``, ``heartbeat``,          ``RecallFiring``, ``HeartbeatRun``,
               ``check``                           ``ScheduledCheck`` (``scheduling.inputs``)
webhooks       ``webhook``                         ``WebhookEvent`` (``webhooks.inputs``)
=============  ==================================  =============================================

A kind (:class:`InputKind`) names its source, its payload Struct (the writer builds it and
encodes it; the hub decodes the same type), whether its turns are *scheduled* (they take one of
the node's scheduled-turn slots), and, through the :class:`InputTurn` it opens for each turn, how
the input is shaped into a turn, answered, and settled when the turn ends — and, through
``interrupted``, how a turn cut off by a crash is settled at recovery. The hub never reads a key
of a payload it does not own: it reads only ``content`` and ``was_injected``, which every
payload has (:class:`~turnstile.actors.sessions.inputs.TurnPayload`). A source no feature
registered is an ordinary turn of plain text (:data:`~turnstile.actors.sessions.inputs.OtherInput`),
never scheduled and settling nothing.

A kind's turn works on its session through ``turn.TurnHost`` (emit, enqueue, the history mark,
ids), never through the session actor itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

import msgspec

from turnstile.actors.sessions.agents.base import TurnInput
from turnstile.actors.sessions.inputs import (
    Injection,
    InputPayloadError,
    OtherInput,
    TurnPayload,
    UserMessage,
)
from turnstile.actors.sessions.turn import Turn, TurnContext, TurnHost
from turnstile.runtime.store import InboxItem, Step

__all__ = [
    "InputKind",
    "InputKinds",
    "InputTurn",
    "PlainKind",
    "TurnHost",
    "TurnOutcome",
    "session_kinds",
]


class TurnOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a turn ended, as its closure will say.

    Attributes:
        status: ``completed``, ``empty``, ``failed``, ``stopped`` or ``interrupted``.
        text: the turn's answer ('' for none).
        error: the short failure message, for a failed turn.
        detail: what the inbox row's (and a run record's) detail keeps.
        suppressed: the kind logged the turn but forwards nothing (a quiet heartbeat): no
            ``stream_end`` and no history entry.
    """

    status: str
    text: str = ""
    error: str | None = None
    detail: dict[str, Any] | None = None
    suppressed: bool = False


class InputTurn:
    """What one input's kind does in its turn. The defaults are an ordinary turn: the agent
    answers the content, and nothing is settled beyond the inbox row."""

    #: The turn starts from a clean context (no earlier history): a dedicated heartbeat.
    fresh_history: bool = False
    #: The turn ends with a ``session_sync`` even when a client watched it start (a recall:
    #: recall.md's ``finally``); a turn nobody watched start ends with one whatever its kind.
    sync_after: bool = False

    def shape(self, turn: Turn, turn_input: TurnInput) -> TurnInput:
        """Fit the agent's input to the kind (a system segment, a model); may set the turn's
        ``buffer`` and ``allowed`` tools."""
        return turn_input

    def start_fields(self) -> dict[str, Any]:
        """What the turn's ``stream_start`` says about where the input came from:
        ``StreamStart``'s optional fields, by name."""
        return {}

    async def respond(
        self, host: TurnHost, context: TurnContext, run_agent: Callable[[], Awaitable[str]]
    ) -> str:
        """Do the turn's work and return its text; ``run_agent`` asks the agent."""
        return await run_agent()

    async def settle(self, host: TurnHost, turn: Turn, outcome: TurnOutcome) -> TurnOutcome:
        """Before the turn closes: decide what its closure says (a heartbeat may suppress it,
        retry it or disable its job). Runs shielded, with the session's closure bound."""
        return outcome

    def closing(self, outcome: TurnOutcome) -> Sequence[Step]:
        """What the kind keeps beside the session and settles with the turn (a job's run
        record): writes of the turn's closing transaction, which also stores its
        ``stream_end`` and its input's final state (``Store.close_input``), so that a crash
        leaves all of them or none. None by default."""
        return ()


#: The ordinary turn (stateless, shared).
ORDINARY = InputTurn()


class InputKind(Protocol):
    """One kind of turn input, as a feature registers it.

    Attributes:
        source: the inbox rows' ``source`` it owns.
        payload: the Struct its payloads decode to (a :class:`TurnPayload`).
        scheduled: its turns take one of the node's scheduled-turn slots.
    """

    source: str
    payload: type[TurnPayload]
    scheduled: bool

    async def open(self, item: InboxItem, received: TurnPayload | None) -> InputTurn:
        """The turn of ``item``, whose payload decoded as ``received`` (None: it did not; the
        turn fails, and the kind may still settle what it keeps for it)."""
        ...

    async def interrupted(self, item: InboxItem) -> None:
        """``item``'s turn was cut off by a crash and closed ``interrupted`` by the node's
        recovery (and does not run again): settle what the kind keeps for it."""
        ...


class PlainKind:
    """A kind whose turns are ordinary: the agent answers, nothing is settled beside the
    session. Sessions' own kinds and the webhooks' are plain."""

    def __init__(self, source: str, payload: type[TurnPayload], *, scheduled: bool = False):
        self.source = source
        self.payload = payload
        self.scheduled = scheduled

    async def open(self, item: InboxItem, received: TurnPayload | None) -> InputTurn:
        return ORDINARY

    async def interrupted(self, item: InboxItem) -> None:
        return None

    def __repr__(self) -> str:
        return f"PlainKind({self.source!r}, {self.payload.__name__})"


class InputKinds:
    """The node's input kinds by source, filled by the features as they start."""

    def __init__(self) -> None:
        self._kinds: dict[str, InputKind] = {}

    def register(self, kind: InputKind) -> None:
        """Add ``kind``.

        Raises:
            ValueError: another kind owns its source already.
        """
        held = self._kinds.get(kind.source)
        if held is not None:
            raise ValueError(f"input source {kind.source!r} is already registered ({held!r})")
        self._kinds[kind.source] = kind

    def get(self, source: str) -> InputKind:
        """The kind of ``source``: a plain kind of :class:`OtherInput` when none is
        registered (an ordinary turn that settles nothing)."""
        kind = self._kinds.get(source)
        return kind if kind is not None else PlainKind(source, OtherInput)

    def __contains__(self, source: object) -> bool:
        return source in self._kinds

    def __iter__(self) -> Iterator[InputKind]:
        return iter(self._kinds.values())

    def scheduled(self, source: str) -> bool:
        """Whether turns of ``source`` take a scheduled-turn slot."""
        kind = self._kinds.get(source)
        return kind is not None and kind.scheduled

    def scheduled_sources(self) -> list[str]:
        """The sources whose turns take a scheduled-turn slot."""
        return [source for source, kind in self._kinds.items() if kind.scheduled]

    def decode(
        self, source: str, payload: dict[str, Any], input_id: int | None = None
    ) -> TurnPayload:
        """``payload`` converted to the Struct ``source``'s kind names (left as it is).

        Raises:
            InputPayloadError: it does not convert (the message says where and why).
        """
        try:
            return msgspec.convert(payload, self.get(source).payload)
        except msgspec.ValidationError as exc:
            raise InputPayloadError(input_id, source, str(exc)) from None

    def decode_item(self, item: InboxItem) -> TurnPayload:
        """The inbox row ``item``'s payload, decoded by its ``source``."""
        return self.decode(item.source, item.payload, item.id)


def session_kinds() -> InputKinds:
    """A registry with the sessions feature's own kinds: ``user`` and ``notification``."""
    kinds = InputKinds()
    kinds.register(PlainKind("user", UserMessage))
    kinds.register(PlainKind("notification", Injection))
    return kinds
