"""``Stream``: the machinery of a stream over a WebSocket of its own, which it reconnects.

The stream keeps the ``seq`` of the last event it received. When the connection drops it
opens a new one and attaches with ``after_seq`` set to that ``seq``: the node replays what was
missed, then goes on live, and any event at or below it is dropped, so the reader sees every
event once, in order. What is opened and what an event is are the kind's: a session
(``SessionStream``, ``_session.py``) or a user topic (``TopicStream``, ``_topic.py``).

Events wait in a bounded buffer for the reader. A reader that falls behind by a full buffer
is not allowed to grow it: later events are dropped until it has read what is there, then the
stream attaches again after its last event (as for the node's ``lagged``), so nothing is lost.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Generic, Self, TypeVar

import anyio
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from turnstile.client._errors import (
    ConnectionLost,
    SessionDeleted,
    StoreUnavailable,
    TurnstileClientError,
)
from turnstile.client._wire import (
    Connector,
    WebSocket,
    connection_error,
    encode,
    frame_error,
    frames,
)
from turnstile.protocol import (
    Attached,
    ClientFrame,
    ErrorFrame,
    Result,
    ServerFrame,
    SessionSyncFrame,
    Subscribed,
)

__all__ = ["Link", "Stream", "StreamStatistics", "Waiter"]

#: What the stream gives its reader (an ``Event`` of a session …).
T = TypeVar("T")


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
        head_seq: the node's last ``seq`` when the stream last attached (the ``last_seq`` of
            its ``attached`` or ``subscribed``: what the events replayed then led up to); None
            before the first attach.
    """

    session_id: str
    last_seq: int | None
    connects: int
    buffered: int
    dropped: int
    busy: bool | None
    policy: str | None
    head_seq: int | None = None


class Waiter:
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


class Link:
    """One connection: its socket and the answers still due on it. Frames other than ``call``
    are answered one at a time, in the order sent (``docs/protocol.md``), so those wait in a
    queue; calls wait by ``id``."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.live = True
        self.replies: deque[Waiter] = deque()
        self.calls: dict[str, Waiter] = {}
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


class Stream(Generic[T]):
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
        self._send_events, self._events = anyio.create_memory_object_stream[T](max_buffer)
        self._link: Link | None = None
        self._changed = anyio.Event()
        self._failure: TurnstileClientError | None = None
        self._closed = False
        self._resyncing = False  # events are dropped until the next ``attached``
        self._overflowed = False
        self._sync: SessionSyncFrame | None = None
        self._connects = 0
        self._head_seq: int | None = None
        self._attached_once = False
        self._dropped = 0
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
            head_seq=self._head_seq,
        )

    async def receive(self) -> T:
        """The next event, waiting for it (reconnecting meanwhile if needed): a session's
        ``Event``; a topic's ``TopicEvent`` or ``TopicReset``.

        Raises:
            SessionDeleted: the session was deleted (after every event before it was read).
            ConnectionLost: the connection dropped and could not be opened again.
            anyio.ClosedResourceError: the stream was closed.
        """
        try:
            event = await self._events.receive()
        except anyio.EndOfStream:
            raise self._ended() from None
        self._taken()
        return event

    def receive_nowait(self) -> T:
        """The next event if one is buffered (``receive`` without the wait).

        Raises:
            anyio.WouldBlock: no event is buffered now.
            SessionDeleted, ConnectionLost, anyio.ClosedResourceError: as ``receive``.
        """
        try:
            event = self._events.receive_nowait()
        except anyio.EndOfStream:
            raise self._ended() from None
        self._taken()
        return event

    def _ended(self) -> BaseException:
        """Why the events ended: the stream's failure, or that it was closed."""
        if self._failure is not None:
            return self._failure
        return anyio.ClosedResourceError()

    def _taken(self) -> None:
        if self._overflowed and self._events.statistics().current_buffer_used == 0:
            self._overflowed = False  # read up: attach again after the last event kept
            assert self._tasks is not None
            self._tasks.start_soon(self._reattach)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
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
                link = Link(ws)
                # nothing is raised inside the task group (it would come out wrapped in a group)
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._read, link)
                    try:
                        answer = await self._attach(link)
                    except ConnectionLost as exc:
                        lost = exc
                    else:
                        if isinstance(answer, ErrorFrame):
                            refused = frame_error(answer)
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

    async def _attach(self, link: Link) -> ServerFrame:
        waiter = Waiter()
        link.replies.append(waiter)
        await self._write(link, self._open_frame())
        return await waiter.wait()

    async def _read(self, link: Link) -> None:
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

    def _dispatch(self, link: Link, text: str) -> None:
        try:
            frame = frames.decode(text)
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

    def _on_item(self, item: T | None) -> None:
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

    def _item(self, frame: dict[str, Any]) -> T | None:
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
        self._head_seq = answer.last_seq
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
        waiter = Waiter()
        async with link.send_lock:
            if not link.live:
                raise ConnectionLost("the connection to the node dropped")
            link.replies.append(waiter)
            await self._write(link, frame, locked=True)
        answer = await waiter.wait()
        if isinstance(answer, ErrorFrame):
            raise frame_error(answer)
        return answer

    async def _write(self, link: Link, frame: ClientFrame, *, locked: bool = False) -> None:
        text = encode(frame)
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

    async def _current(self) -> Link:
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

    def _set_link(self, link: Link | None) -> None:
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


class _Refused(Exception):
    def __init__(self, error: TurnstileClientError) -> None:
        self.error = error


class _Dropped(Exception):
    def __init__(self, reason: str, attached: bool) -> None:
        super().__init__(reason)
        self.attached = attached
