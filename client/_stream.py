"""``SessionStream``: one attached session over its own WebSocket, which it reconnects.

The stream keeps the ``seq`` of the last event it received. When the connection drops it
opens a new one and attaches with ``after_seq`` set to that ``seq``: the node replays what was
missed, then goes on live, and any event at or below it is dropped, so the reader sees every
event once, in order. A message is sent with an idempotency key (``client_msg_id``), made for
it when the caller gives none, and sent again with the same key when the connection drops
before its ``ack``: the node stores it once and answers the first ``ack`` again
(``docs/protocol.md``, "Resending a message").

Events wait in a bounded buffer for the reader. A reader that falls behind by a full buffer
is not allowed to grow it: later events are dropped until it has read what is there, then the
stream attaches again after its last event (as for the node's ``lagged``), so nothing is lost.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, Self

import anyio
import httpx
import msgspec
from anyio.abc import TaskGroup, TaskStatus
from httpx_ws import HTTPXWSException

from turnstile.client._errors import (
    ConnectionLost,
    SessionDeleted,
    StoreUnavailable,
    ToolError,
    TurnstileClientError,
    error_for,
)
from turnstile.client._events import Event, decode_event
from turnstile.protocol import (
    Ack,
    ApprovalDecided,
    ApproveFrame,
    Attached,
    AttachFrame,
    CallFrame,
    ClientFrame,
    DenyFrame,
    ErrorFrame,
    PolicySet,
    Result,
    SendFrame,
    ServerFrame,
    SessionSyncFrame,
    SetPolicyFrame,
    StopFrame,
    Stopping,
    Subscribed,
    SubscribeFrame,
    TopicSync,
)
from turnstile.protocol import (
    SessionDeleted as SessionDeletedFrame,
)

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

__all__ = [
    "SessionStream",
    "TopicEvent",
    "TopicReset",
    "TopicStream",
    "StreamStatistics",
    "call_result",
    "connection_error",
    "decode_answer",
    "new_client_msg_id",
    "why_failed",
]

_encoder = msgspec.json.Encoder()
_frames = msgspec.json.Decoder()


def new_client_msg_id() -> str:
    """A fresh idempotency key for a message (``tsc-`` and 24 hex digits)."""
    return f"tsc-{secrets.token_hex(12)}"


class WebSocket(Protocol):
    """What the stream needs of a WebSocket (httpx-ws's ``AsyncWebSocketSession``)."""

    async def send_text(self, data: str) -> None: ...
    async def receive_text(self) -> str: ...
    async def close(self, code: int = 1000, reason: str | None = None) -> Any: ...


class Connector(Protocol):
    """Opens a WebSocket to the node's ``/ws`` (the ``Client``'s)."""

    def __call__(self) -> AbstractAsyncContextManager[WebSocket]: ...


class StreamStatistics(msgspec.Struct, frozen=True):
    """A snapshot of a stream.

    Attributes:
        session_id: the session.
        last_seq: the ``seq`` of the last event received (None before the first attach).
        connects: connections opened so far (1 + reconnects).
        buffered: events received and not read yet.
        dropped: events dropped because the reader was a full buffer behind (each is read
            again from the node once the reader has caught up).
        busy: whether a turn ran at the last attach (its ``session_sync``).
        policy: the session's policy at the last attach.
    """

    session_id: str
    last_seq: int | None
    connects: int
    buffered: int
    dropped: int
    busy: bool | None
    policy: str | None


class _Waiter:
    """One answer to wait for."""

    def __init__(self) -> None:
        self._done = anyio.Event()
        self._answer: ServerFrame | None = None
        self._error: BaseException | None = None

    def set(self, answer: ServerFrame) -> None:
        if not self._done.is_set():
            self._answer = answer
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self) -> ServerFrame:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._answer is not None
        return self._answer


class _Link:
    """One connection: its socket and the answers still due on it. Frames other than ``call``
    are answered one at a time, in the order sent (``docs/protocol.md``), so those wait in a
    queue; calls wait by ``id``."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.live = True
        self.replies: deque[_Waiter] = deque()
        self.calls: dict[str, _Waiter] = {}
        self.send_lock = anyio.Lock()
        self.dropped = anyio.Event()

    def drop(self, error: BaseException) -> None:
        self.live = False
        self.dropped.set()
        for waiter in [*self.replies, *self.calls.values()]:
            waiter.fail(error)
        self.replies.clear()
        self.calls.clear()


#: Delays between reconnection attempts (the last one repeats).
_BACKOFF = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


class _Stream:
    """The machinery of a stream: a WebSocket of its own, opened (``attach`` or
    ``subscribe``), read, and opened again after a drop from the last ``seq`` received.
    ``SessionStream`` and ``TopicStream`` say what is opened and what an event is."""

    def __init__(
        self,
        connect: Connector,
        target: str,
        *,
        after_seq: int | None,
        max_buffer: int,
        reconnect_attempts: int,
    ) -> None:
        if max_buffer < 1:
            raise ValueError("max_buffer must be >= 1")
        if reconnect_attempts < 0:
            raise ValueError("reconnect_attempts must be >= 0")
        self._target = target
        self._connect = connect
        self._last_seq = after_seq
        self._reconnect_attempts = reconnect_attempts
        self._send_events, self._events = anyio.create_memory_object_stream[Any](max_buffer)
        self._link: _Link | None = None
        self._changed = anyio.Event()
        self._failure: TurnstileClientError | None = None
        self._closed = False
        self._resyncing = False  # events are dropped until the next ``attached``
        self._overflowed = False
        self._sync: SessionSyncFrame | None = None
        self._connects = 0
        self._attached_once = False
        self._dropped = 0
        self._call_ids = itertools.count(1)
        self._tasks: TaskGroup | None = None

    # ---- public --------------------------------------------------------------------------

    @property
    def last_seq(self) -> int | None:
        """The ``seq`` of the last event received (None before the first attach)."""
        return self._last_seq

    def statistics(self) -> StreamStatistics:
        """A snapshot of the stream's state."""
        return StreamStatistics(
            session_id=self._target,
            last_seq=self._last_seq,
            connects=self._connects,
            buffered=self._events.statistics().current_buffer_used,
            dropped=self._dropped,
            busy=None if self._sync is None else self._sync.busy,
            policy=None if self._sync is None else self._sync.policy,
        )

    async def receive(self) -> Any:
        """The next event, waiting for it (reconnecting meanwhile if needed).

        Raises:
            SessionDeleted: the session was deleted (after every event before it was read).
            ConnectionLost: the connection dropped and could not be opened again.
            anyio.ClosedResourceError: the stream was closed.
        """
        try:
            event = await self._events.receive()
        except anyio.EndOfStream:
            if self._failure is not None:
                raise self._failure from None
            raise anyio.ClosedResourceError from None
        if self._overflowed and self._events.statistics().current_buffer_used == 0:
            self._overflowed = False  # read up: attach again after the last event kept
            assert self._tasks is not None
            self._tasks.start_soon(self._reattach)
        return event

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        """The next event; the iteration ends when the session is deleted or the stream
        closed (``receive()`` says which)."""
        try:
            return await self.receive()
        except (SessionDeleted, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    # ---- running ---------------------------------------------------------------------------

    async def run(self, tasks: TaskGroup, *, task_status: TaskStatus[None]) -> None:
        """Connect, attach, and keep the session attached until cancelled (``tasks.start``).

        Raises (before ``started``): the attach's refusal, or ``ConnectionLost``.
        """
        self._tasks = tasks
        failures = 0
        try:
            while True:
                try:
                    await self._connect_once(task_status)
                except _Refused as refused:
                    if not self._attached_once:
                        raise refused.error from None
                    if not isinstance(refused.error, StoreUnavailable):
                        self._fail(refused.error)
                        return
                    dropped = _Dropped(str(refused.error), attached=False)
                except _Dropped as caught:
                    dropped = caught
                else:
                    continue
                if not self._attached_once:
                    raise ConnectionLost(str(dropped)) from None
                if self._failure is not None:
                    return
                if dropped.attached:
                    failures = 0
                if failures >= self._reconnect_attempts:
                    self._fail(ConnectionLost(f"{dropped}; gave up reconnecting"))
                    return
                await anyio.sleep(_BACKOFF[min(failures, len(_BACKOFF) - 1)])
                failures += 1
        finally:
            self._closed = True
            self._send_events.close()
            self._set_link(None)

    async def _connect_once(self, task_status: TaskStatus[None]) -> None:
        """One connection, from opening to its end: raises ``_Dropped`` when it ends,
        ``_Refused`` when the node refuses the attach."""
        attached = False
        refused: TurnstileClientError | None = None
        lost: ConnectionLost | None = None
        try:
            async with self._connect() as ws:
                self._connects += 1
                link = _Link(ws)
                # nothing is raised inside the task group (it would come out wrapped in a group)
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._read, link)
                    try:
                        answer = await self._attach(link)
                    except ConnectionLost as exc:
                        lost = exc
                    else:
                        if isinstance(answer, ErrorFrame):
                            refused = _error(answer)
                        else:
                            attached = True
                            self._set_link(link)
                            if not self._attached_once:
                                self._attached_once = True
                                task_status.started()
                            await link.dropped.wait()
                    tasks.cancel_scope.cancel()
        except BaseException as exc:
            reason = connection_error(exc)
            if reason is None:
                raise
            raise _Dropped(reason, attached) from None
        finally:
            self._set_link(None)
        if refused is not None:
            raise _Refused(refused)
        raise _Dropped(lost.message if lost else "the connection closed", attached)

    async def _attach(self, link: _Link) -> ServerFrame:
        waiter = _Waiter()
        link.replies.append(waiter)
        await self._write(link, self._open_frame())
        return await waiter.wait()

    async def _read(self, link: _Link) -> None:
        """Read the connection's frames until it drops, then fail what waits on it."""
        error: BaseException = ConnectionLost("the connection to the node dropped")
        try:
            while True:
                self._dispatch(link, await link.ws.receive_text())
        except BaseException as exc:
            reason = connection_error(exc)
            if reason is None:
                raise
            error = ConnectionLost(f"the connection to the node dropped: {reason}")
        finally:
            link.drop(error)
            self._signal()

    def _dispatch(self, link: _Link, text: str) -> None:
        try:
            frame = _frames.decode(text)
        except msgspec.DecodeError:
            return
        if not isinstance(frame, dict):
            return
        if "ts" in frame and "seq" in frame:
            if not self._resyncing:
                self._on_item(self._item(frame))
            return
        try:
            answer = msgspec.convert(frame, ServerFrame)
        except msgspec.ValidationError:
            return  # a frame this client does not know: ignored, as the protocol says
        if isinstance(answer, Result) or (isinstance(answer, ErrorFrame) and answer.id):
            call_id = answer.id
            waiter = link.calls.pop(call_id, None) if call_id else None
            if waiter is not None:
                waiter.set(answer)
        elif isinstance(answer, ErrorFrame) and answer.code == "lagged":
            if self._mine(answer):  # dropped by the node: open again
                self._resyncing = True
                assert self._tasks is not None
                self._tasks.start_soon(self._reattach)
        elif self._note(answer):
            pass
        elif link.replies:
            if isinstance(answer, Attached | Subscribed):
                self._on_attached(answer)
            link.replies.popleft().set(answer)

    def _on_item(self, item: Any) -> None:
        """Keep ``item`` (an event of this stream; None: not one) for the reader."""
        if item is None:
            return
        seq = getattr(item, "seq", None)
        if seq is not None and self._last_seq is not None and seq <= self._last_seq:
            return  # had it already
        try:
            self._send_events.send_nowait(item)
        except anyio.WouldBlock:
            # the reader is a full buffer behind: keep what it has, open again once read
            self._dropped += 1
            self._resyncing = True
            self._overflowed = True
            return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        if seq is not None:
            self._last_seq = seq

    # ---- what a kind of stream says ------------------------------------------------------

    def _open_frame(self) -> ClientFrame:
        """The frame that opens the stream after ``self._last_seq``."""
        raise NotImplementedError

    def _item(self, frame: dict[str, Any]) -> Any:
        """The event ``frame`` is for this stream's reader, or None (another's)."""
        raise NotImplementedError

    def _mine(self, lagged: ErrorFrame) -> bool:
        """Whether a ``lagged`` error is about this stream."""
        raise NotImplementedError

    def _note(self, answer: ServerFrame) -> bool:
        """Take a frame that answers no request (``session_sync`` …); False: not one."""
        return False

    def _on_attached(self, answer: Attached | Subscribed) -> None:
        # Replayed events follow this frame and nothing of an earlier attach does, so this is
        # where events are taken again. An after_seq beyond the end (another database) is read
        # by the node as "live from last_seq"; a topic's reset replays nothing.
        self._resyncing = False
        reset = isinstance(answer, Subscribed) and answer.reset
        if self._last_seq is None or self._last_seq > answer.last_seq or reset:
            self._last_seq = answer.last_seq

    async def _reattach(self) -> None:
        """Attach again on the current connection, after the last event kept."""
        try:
            answer = await self._request(self._open_frame())
        except ConnectionLost:
            return  # the new connection attaches after the last event kept
        except StoreUnavailable:
            link = self._link  # the node's problem: a new connection attaches later
            if link is not None:
                link.drop(ConnectionLost("the node's store is unavailable"))
                self._signal()
            return
        except TurnstileClientError as exc:
            self._fail(exc)
            return
        assert isinstance(answer, Attached | Subscribed)

    async def _request(self, frame: ClientFrame) -> ServerFrame:
        """Send a frame other than ``call`` and wait for its answer.

        Raises:
            TurnstileClientError: the node answered ``error`` (by its code).
            ConnectionLost: the connection dropped first.
        """
        link = await self._current()
        waiter = _Waiter()
        async with link.send_lock:
            if not link.live:
                raise ConnectionLost("the connection to the node dropped")
            link.replies.append(waiter)
            await self._write(link, frame, locked=True)
        answer = await waiter.wait()
        if isinstance(answer, ErrorFrame):
            raise _error(answer)
        return answer

    async def _write(self, link: _Link, frame: ClientFrame, *, locked: bool = False) -> None:
        text = _encoder.encode(frame).decode()
        try:
            if locked:
                await link.ws.send_text(text)
            else:
                async with link.send_lock:
                    await link.ws.send_text(text)
        except BaseException as exc:
            reason = connection_error(exc)
            if reason is None:
                raise
            link.drop(ConnectionLost(f"the connection to the node dropped: {reason}"))
            self._signal()
            raise ConnectionLost(f"the connection to the node dropped: {reason}") from None

    async def _current(self) -> _Link:
        """The live connection, waiting while the stream reconnects."""
        while True:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                raise anyio.ClosedResourceError
            link = self._link
            if link is not None and link.live:
                return link
            changed = self._changed
            await changed.wait()

    def _set_link(self, link: _Link | None) -> None:
        self._link = link
        self._signal()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _fail(self, error: TurnstileClientError) -> None:
        """End the stream with ``error``: the reader gets it after the events buffered."""
        if self._failure is None:
            self._failure = error
        self._send_events.close()
        link = self._link
        if link is not None:
            link.drop(error)
        self._signal()


class SessionStream(_Stream):
    """A session attached over a WebSocket: its events, and what can be done to it.

    Made by ``Client.attach`` (an async context manager); never constructed by hand. Iterate
    it (``async for event in stream``) or call ``receive()`` for the session's events
    (``Event``).

    Args:
        connect: opens a WebSocket to the node.
        session_id: the session.
        after_seq: replay the events after this ``seq`` first; None: live events only.
        max_buffer: events kept for the reader before it falls behind.
        reconnect_attempts: connections tried in a row when the connection drops, before the
            stream fails with ``ConnectionLost``.
    """

    def __init__(
        self,
        connect: Connector,
        session_id: str,
        *,
        after_seq: int | None,
        max_buffer: int,
        reconnect_attempts: int,
    ) -> None:
        super().__init__(
            connect,
            session_id,
            after_seq=after_seq,
            max_buffer=max_buffer,
            reconnect_attempts=reconnect_attempts,
        )
        self.session_id = session_id

    async def receive(self) -> Event:
        """The session's next event, waiting for it (reconnecting meanwhile if needed).

        Raises:
            SessionDeleted: the session was deleted (after every event before it was read).
            ConnectionLost: the connection dropped and could not be opened again.
            anyio.ClosedResourceError: the stream was closed.
        """
        event: Event = await super().receive()
        return event

    async def __anext__(self) -> Event:
        """The next event; the iteration ends when the session is deleted or the stream
        closed (``receive()`` says which)."""
        event: Event = await super().__anext__()
        return event

    async def send(
        self, content: str, *, client_msg_id: str | None = None, traceparent: str | None = None
    ) -> Ack:
        """Send a user message; return its ``ack`` once the node has stored it.

        Args:
            content: the message.
            client_msg_id: its idempotency key in the session; one is made when None. If the
                connection drops before the ``ack``, the message is sent again with the same
                key: the node stores it once and answers the first ``ack`` again.
            traceparent: a W3C trace context: when the node traces, the message's turn is
                part of that trace (``docs/tracing.md``).

        Returns:
            The ``ack``: ``input_id`` (or ``injected``) and the ``client_msg_id`` used.

        Raises:
            Conflict: ``busy`` (policy ``reject``), ``idempotency_key_reused``.
            BadRequest: ``content`` too long, a malformed ``client_msg_id``.
            ConnectionLost: the connection dropped and could not be opened again.
        """
        frame = SendFrame(
            session_id=self.session_id,
            content=content,
            client_msg_id=client_msg_id or new_client_msg_id(),
            traceparent=traceparent,
        )
        while True:
            try:
                answer = await self._request(frame)
            except ConnectionLost:
                if self._failure is not None or self._closed:
                    raise
                continue  # sent again, with the same key, once reconnected
            assert isinstance(answer, Ack)
            return answer

    async def stop(self) -> bool:
        """Stop the running turn (it ends with ``stream_end`` status ``stopped``).

        Returns:
            Whether a turn was running.

        Raises:
            ConnectionLost: the connection dropped before the answer (not sent again: a
                second stop could stop the next turn).
        """
        answer = await self._request(StopFrame(session_id=self.session_id))
        assert isinstance(answer, Stopping)
        return answer.running

    async def set_policy(self, policy: str) -> str:
        """Set what a message sent during a turn does: ``enqueue``, ``reject``, ``interrupt``
        or ``inject``. Returns the policy set.

        Raises:
            BadRequest: an unknown policy.
        """
        answer = await self._request(SetPolicyFrame(session_id=self.session_id, policy=policy))
        assert isinstance(answer, PolicySet)
        return answer.policy

    async def approve(self, approval_id: str) -> ApprovalDecided:
        """Approve a pending tool call (an ``approval_required`` event's ``approval_id``).

        Raises:
            NotFound: no such pending approval (decided already, or not yours).
        """
        frame = ApproveFrame(session_id=self.session_id, approval_id=approval_id)
        answer = await self._request(frame)
        assert isinstance(answer, ApprovalDecided)
        return answer

    async def deny(self, approval_id: str) -> ApprovalDecided:
        """Refuse a pending tool call.

        Raises:
            NotFound: no such pending approval.
        """
        answer = await self._request(DenyFrame(session_id=self.session_id, approval_id=approval_id))
        assert isinstance(answer, ApprovalDecided)
        return answer

    async def call(self, tool: str, arguments: dict[str, Any] | None = None) -> Any:
        """Call a tool or primitive by name, as the session, and return what it returned.

        Calls run concurrently (at most 16 in flight on a connection); a tool whose policy is
        ``APPROVE`` answers once a person decided.

        Raises:
            ToolError: the tool answered ``ok: false`` (``unknown_tool``, ``bad_arguments``,
                ``blocked``, ``denied`` …).
            LimitExceeded: too many calls in flight.
            ConnectionLost: the connection dropped before the result (a call is not sent
                again: it may have run).
        """
        call_id = f"call-{next(self._call_ids)}"
        frame = CallFrame(
            id=call_id, session_id=self.session_id, tool=tool, arguments=arguments or {}
        )
        link = await self._current()
        waiter = _Waiter()
        link.calls[call_id] = waiter
        await self._write(link, frame)
        return call_result(await waiter.wait())

    def _open_frame(self) -> ClientFrame:
        return AttachFrame(session_id=self.session_id, after_seq=self._last_seq)

    def _item(self, frame: dict[str, Any]) -> Event | None:
        if frame.get("session_id") != self.session_id:
            return None
        try:
            return decode_event(frame)
        except msgspec.ValidationError:
            return None

    def _mine(self, lagged: ErrorFrame) -> bool:
        return lagged.session_id == self.session_id

    def _note(self, answer: ServerFrame) -> bool:
        if isinstance(answer, SessionSyncFrame):
            self._sync = answer
            return True
        if isinstance(answer, SessionDeletedFrame) and answer.session_id == self.session_id:
            self._fail(SessionDeleted("not_found", f"session {self.session_id!r} was deleted"))
            return True
        return False


class TopicEvent(msgspec.Struct, frozen=True):
    """One event of a user topic (``docs/protocol.md``, "User topics").

    Attributes:
        topic: the topic (``memory``).
        seq: its place in your log of the topic: increasing, with gaps (a later event can make
            an earlier one moot).
        ts: when it was recorded (UTC).
        type: what happened (``fact_saved`` …).
        fields: the event's other fields, as JSON values.
    """

    topic: str
    seq: int
    ts: datetime
    type: str
    fields: dict[str, Any]


class TopicReset(msgspec.Struct, frozen=True):
    """The topic's log no longer holds everything after the ``seq`` the stream resumed from
    (or it is another database's): nothing was replayed. Reload the state (for ``memory``:
    ``Client.facts()``, ``memory_summary()``); the events after ``last_seq`` follow.
    """

    topic: str
    last_seq: int


class _TopicStamp(msgspec.Struct):
    topic: str
    seq: int
    ts: datetime
    type: str


class TopicStream(_Stream):
    """Your events of a user topic over a WebSocket of its own (``Client.subscribe``), read
    again from the last ``seq`` received after a drop. Iterate it: ``TopicEvent``s, and a
    ``TopicReset`` when what was missed is no longer all in the log.
    """

    def __init__(
        self,
        connect: Connector,
        topic: str,
        *,
        after_seq: int | None,
        max_buffer: int,
        reconnect_attempts: int,
    ) -> None:
        super().__init__(
            connect,
            topic,
            after_seq=after_seq,
            max_buffer=max_buffer,
            reconnect_attempts=reconnect_attempts,
        )
        self.topic = topic

    async def receive(self) -> TopicEvent | TopicReset:
        """The topic's next event (or a reset), waiting for it.

        Raises:
            ConnectionLost: the connection dropped and could not be opened again.
            anyio.ClosedResourceError: the stream was closed.
        """
        event: TopicEvent | TopicReset = await super().receive()
        return event

    async def __anext__(self) -> TopicEvent | TopicReset:
        event: TopicEvent | TopicReset = await super().__anext__()
        return event

    def _open_frame(self) -> ClientFrame:
        return SubscribeFrame(topic=self.topic, after_seq=self._last_seq)

    def _item(self, frame: dict[str, Any]) -> TopicEvent | None:
        if frame.get("topic") != self.topic:
            return None
        try:
            stamp = msgspec.convert(frame, _TopicStamp)
        except msgspec.ValidationError:
            return None
        fields = {k: v for k, v in frame.items() if k not in ("type", "topic", "seq", "ts")}
        return TopicEvent(self.topic, stamp.seq, stamp.ts, stamp.type, fields)

    def _mine(self, lagged: ErrorFrame) -> bool:
        return lagged.topic == self.topic

    def _note(self, answer: ServerFrame) -> bool:
        return isinstance(answer, TopicSync) and answer.topic == self.topic

    def _on_attached(self, answer: Attached | Subscribed) -> None:
        super()._on_attached(answer)
        if isinstance(answer, Subscribed) and answer.reset:
            self._on_item(TopicReset(self.topic, answer.last_seq))


class _Refused(Exception):
    def __init__(self, error: TurnstileClientError) -> None:
        self.error = error


class _Dropped(Exception):
    def __init__(self, reason: str, attached: bool) -> None:
        super().__init__(reason)
        self.attached = attached


def call_result(answer: ServerFrame) -> Any:
    """What a call's answer (``result`` or ``error`` with its ``id``) returned.

    Raises:
        ToolError: the tool answered ``ok: false``.
        TurnstileClientError: the node refused the call (by its code).
    """
    if isinstance(answer, ErrorFrame):
        raise _error(answer)
    assert isinstance(answer, Result)
    if not answer.ok:
        error = answer.error
        code = error.code if error is not None else "tool_failed"
        raise ToolError(code, error.message if error else "", field=error.field if error else None)
    return answer.data


def decode_answer(text: str) -> ServerFrame | None:
    """A server answer frame, or None for anything else (an event, a frame this client does
    not know)."""
    try:
        frame = _frames.decode(text)
    except msgspec.DecodeError:
        return None
    if not isinstance(frame, dict) or "ts" in frame:
        return None
    try:
        answer: ServerFrame = msgspec.convert(frame, ServerFrame)
    except msgspec.ValidationError:
        return None
    return answer


def _error(frame: ErrorFrame) -> TurnstileClientError:
    details: dict[str, Any] = {}
    if frame.last_seq is not None:
        details["last_seq"] = frame.last_seq
    return error_for(frame.code, frame.message, field=frame.field, details=details)


def why_failed(exc: BaseException) -> str:
    """Why a connection failed, in a few words ("connection refused" when anything in its
    chain of causes says so: under anyio, httpx says "All connection attempts failed")."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        found = todo.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, ConnectionRefusedError) or "refused" in str(found).lower():
            return "connection refused"
        if isinstance(found, BaseExceptionGroup):
            todo.extend(found.exceptions)
        todo.extend(e for e in (found.__cause__, found.__context__) if e is not None)
    return str(exc) or type(exc).__name__


def connection_error(exc: BaseException) -> str | None:
    """Why a connection failed, when ``exc`` (or every error of a group) says it did."""
    if isinstance(exc, BaseExceptionGroup):
        reasons = [
            connection_error(inner)
            for inner in exc.exceptions
            if not isinstance(inner, anyio.get_cancelled_exc_class())
        ]
        if reasons and all(r is not None for r in reasons):
            return reasons[0]
        return None
    if isinstance(exc, ConnectionLost):
        return exc.message
    if isinstance(
        exc,
        (
            HTTPXWSException,
            httpx.TransportError,
            OSError,
            anyio.BrokenResourceError,
            anyio.EndOfStream,
            anyio.ClosedResourceError,
        ),
    ):
        return why_failed(exc)
    return None
