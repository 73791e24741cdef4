"""One WebSocket client: its frames in, its events out.

A connection keeps reading while work it started is under way. ``call`` frames (a tool call can
wait minutes for a person's approval) each run in a task of the connection's nursery, at most
``ConnectionLimits.max_inflight_calls`` at once; beyond that a call is answered at once with a
``limit_exceeded`` error. Their ``result`` frames come back in any order, paired by ``id``. Every
other frame is quick and answered in the order it came (``send`` → ``ack`` order, attach and
detach). When the client goes away the nursery is cancelled: calls still in flight stop, and an
approval one of them was waiting on is withdrawn. A writer task sends what is queued in the
connection's bounded outbox. Sessions *offer* events to the connection without ever waiting, so
a client that stops reading cannot slow a session or the other clients: once its outbox is full
it is dropped from that session with a ``lagged`` error naming the last ``seq`` it was sent, and
it can re-attach with ``after_seq`` to catch up from the store.

Attaching with ``after_seq`` replays the persisted events after it, then goes live. Events that
arrive during the replay are held (bounded) and delivered after it, skipping any ``seq`` already
sent, so the client sees every event exactly once, in order.

Subscribing to a user topic (``subscribe``, ``runtime.gateway.topics``) works the same way with
the topic's log in place of the session's events: ``subscribed``, the replay when ``after_seq``
was given (none when the log no longer holds what came after it: ``reset``), ``topic_sync``,
then live events of this connection's user only, dropped with ``lagged`` when the outbox is full.

It is over 400 lines because the reader, the writer, the calls in flight and the replay-then-live
handover of attach and subscribe share one outbox and its lag rules: they are one connection's
state.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from starlette.websockets import WebSocket, WebSocketDisconnect

from turnstile.protocol import (
    Ack,
    Attached,
    Detached,
    ErrorFrame,
    PolicySet,
    SessionDeleted,
    SessionSyncFrame,
    Stopping,
    Subscribed,
    TopicSync,
    Unsubscribed,
)
from turnstile.runtime import tracing
from turnstile.runtime.errors import (
    DecodeError,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    TurnstileError,
)
from turnstile.runtime.gateway.backend import SessionBackend, Submitted, submit_from_client
from turnstile.runtime.gateway.frames import (
    CLIENT_FRAMES,
    ApproveFrame,
    AttachFrame,
    CallFrame,
    ClientFrame,
    DenyFrame,
    DetachFrame,
    SendFrame,
    SetPolicyFrame,
    StopFrame,
    SubscribeFrame,
    UnsubscribeFrame,
    encode_answer,
    encode_event,
    encode_frame,
    encode_topic_event,
    error_frame,
)
from turnstile.runtime.gateway.topics import UserTopics
from turnstile.runtime.metrics import Metrics

__all__ = ["DELIVERY_SECONDS", "FRAMES_SENT", "Connection", "ConnectionLimits", "declare_metrics"]

log = logging.getLogger("turnstile.gateway")


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds for one WebSocket client.

    Attributes:
        max_frame_bytes: largest accepted client frame.
        outbox_frames: frames queued for a client before it counts as fallen behind.
        max_attached: sessions one connection may watch at once.
        max_inflight_calls: ``call`` frames of one connection running at once; one more is
            answered with a ``limit_exceeded`` error.
    """

    max_frame_bytes: int = 256 * 1024
    outbox_frames: int = 2048
    max_attached: int = 64
    max_inflight_calls: int = 16

    def __post_init__(self) -> None:
        if self.max_inflight_calls < 1:
            raise ValueError("max_inflight_calls must be >= 1")


#: At most this many frames, or about this many bytes, go out in one socket write.
WRITE_BATCH_FRAMES = 256
WRITE_BATCH_BYTES = 256 * 1024

#: Frames written to WebSocket clients (a counter).
FRAMES_SENT = "turnstile_frames_sent_total"
#: Event delivery lag (a histogram): a live event offered to a connection (its append to the
#: session's or topic's log committed) to its frame written to the client's socket.
DELIVERY_SECONDS = "turnstile_event_delivery_seconds"

#: The offer time of a frame that is not a live event (a reply, a replayed event).
_NOT_LIVE = -1.0


def declare_metrics(metrics: Metrics) -> None:
    """The series connections record: frames written and the delivery lag of live events."""
    metrics.counter(FRAMES_SENT, "Frames written to WebSocket clients.")
    metrics.histogram(
        DELIVERY_SECONDS,
        "Event delivery lag: a live event's append to its log (offered to the connection) "
        "to its frame written to the client's socket.",
    )


class _Subscription:
    __slots__ = ("session_id", "live", "pending", "last_sent")

    def __init__(self, session_id: str, last_sent: int) -> None:
        self.session_id = session_id
        self.live = False
        #: Live events held while the replay runs: ``(seq, frame, offered at)``.
        self.pending: list[tuple[int, bytes, float]] = []
        self.last_sent = last_sent


class Connection:
    """Serves one accepted WebSocket for one authenticated user."""

    def __init__(
        self,
        websocket: WebSocket,
        user: str,
        backend: SessionBackend,
        limits: ConnectionLimits,
        *,
        metrics: Metrics | None = None,
        send_many: Callable[[list[bytes]], Awaitable[None]] | None = None,
        topics: UserTopics | None = None,
    ) -> None:
        self.websocket = websocket
        self.user = user
        self.backend = backend
        self.limits = limits
        self.subscriptions: dict[str, _Subscription] = {}
        self.topics = topics
        self.topic_subscriptions: dict[str, _Subscription] = {}
        #: Frames to write, each with the trio time a live event was offered (else -1).
        self._outbox: deque[tuple[bytes, float]] = deque()
        self._ready = trio.Event()
        self._room = trio.Event()
        self._closed = False
        self._metrics = metrics
        self._send_many = send_many
        self._inflight: set[str] = set()  # ids of the calls running now
        self._nursery: trio.Nursery | None = None

    def _offer(self, sub: _Subscription | None, seq: int, frame: bytes) -> bool:
        """One event for a session or topic subscription: held while its replay runs, skipped
        if the replay sent it, else queued; False when there is no room (the caller then
        drops this connection from it with ``lagged``)."""
        if sub is None or self._closed:
            return False
        if not sub.live:
            if len(sub.pending) >= self.limits.outbox_frames:
                return False
            sub.pending.append((seq, frame, trio.current_time()))
            return True
        if seq <= sub.last_sent:
            return True  # already sent during replay
        if len(self._outbox) >= self.limits.outbox_frames:
            return False
        sub.last_sent = seq
        self._push(frame, trio.current_time())
        return True

    # -- the Subscriber protocol (called by sessions, never blocks) --

    def offer(self, session_id: str, seq: int, frame: bytes) -> bool:
        return self._offer(self.subscriptions.get(session_id), seq, frame)

    def lagged(self, session_id: str, last_seq: int) -> None:
        sub = self.subscriptions.pop(session_id, None)
        if sub is None or self._closed:
            return
        self._push(
            encode_answer(
                ErrorFrame(
                    code="lagged",
                    message=f"dropped from session {session_id!r}; re-attach with "
                    f"after_seq={sub.last_sent} to catch up",
                    session_id=session_id,
                    last_seq=sub.last_sent,
                )
            )
        )

    def deleted(self, session_id: str) -> None:
        sub = self.subscriptions.pop(session_id, None)
        if sub is None or self._closed:
            return
        self._push(encode_answer(SessionDeleted(session_id=session_id, last_seq=sub.last_sent)))

    # -- the TopicSubscriber protocol (called by UserTopics.publish, never blocks) --

    def offer_topic(self, topic: str, seq: int, frame: bytes) -> bool:
        return self._offer(self.topic_subscriptions.get(topic), seq, frame)

    def topic_lagged(self, topic: str) -> None:
        sub = self.topic_subscriptions.pop(topic, None)
        if sub is None or self._closed:
            return
        self._push(
            encode_answer(
                ErrorFrame(
                    code="lagged",
                    message=f"dropped from topic {topic!r}; subscribe again with "
                    f"after_seq={sub.last_sent} to catch up",
                    topic=topic,
                    last_seq=sub.last_sent,
                )
            )
        )

    # -- outbox --

    def _push(self, frame: bytes, offered_at: float = _NOT_LIVE) -> None:
        self._outbox.append((frame, offered_at))
        self._ready.set()

    async def _put(self, frame: bytes, offered_at: float = _NOT_LIVE) -> None:
        """Queue a frame for this client, waiting for room (for replies and replays; held
        live events keep the time they were offered)."""
        while len(self._outbox) >= self.limits.outbox_frames and not self._closed:
            self._room = trio.Event()
            await self._room.wait()
        self._push(frame, offered_at)

    async def _writer(self) -> None:
        """Send what the outbox holds, everything queued so far in one write when it can."""
        outbox = self._outbox
        send_many = self._send_many
        if send_many is None:
            send_text = self.websocket.send_text

            async def send_many(texts: list[bytes]) -> None:
                for text in texts:
                    await send_text(text.decode())

        try:
            while True:
                await self._ready.wait()
                # Let the tasks woken alongside this one run first, so what they queue for
                # this client (a reply to the frame that caused the event, say) joins the write.
                await trio.lowlevel.checkpoint()
                self._ready = trio.Event()
                while outbox:
                    batch: list[bytes] = []  # UTF-8 JSON, framed as text by the server
                    offered: list[float] = []
                    size = 0
                    while outbox and len(batch) < WRITE_BATCH_FRAMES and size < WRITE_BATCH_BYTES:
                        frame, at = outbox.popleft()
                        size += len(frame)
                        batch.append(frame)
                        if at != _NOT_LIVE:
                            offered.append(at)
                    await send_many(batch)
                    if self._metrics is not None:
                        self._count_sent(self._metrics, len(batch), offered)
                    self._room.set()
        except (WebSocketDisconnect, OSError, RuntimeError, trio.BrokenResourceError):
            self._closed = True  # the client is gone; the reader sees the disconnect

    def _count_sent(self, metrics: Metrics, frames: int, offered: list[float]) -> None:
        metrics.inc(FRAMES_SENT, frames)
        now = trio.current_time()
        for at in offered:
            metrics.observe(DELIVERY_SECONDS, now - at)

    # -- serving --

    async def serve(self) -> None:
        """Read and answer frames until the client goes away; then cancel the calls still in
        flight and detach everywhere."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer, name=f"ws writer {self.user}")
                try:
                    await self._read_loop()
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            for topic in list(self.topic_subscriptions):
                self._unsubscribe(topic)
            with trio.move_on_after(5, shield=True):
                for session_id in list(self.subscriptions):
                    await self._detach(session_id)

    async def _read_loop(self) -> None:
        while True:
            try:
                message = await self.websocket.receive()
            except WebSocketDisconnect:
                return
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            if len(raw) > self.limits.max_frame_bytes:
                await self._put(
                    error_frame(
                        InvalidArgument(f"frame is larger than {self.limits.max_frame_bytes} bytes")
                    )
                )
                continue
            try:
                frame = CLIENT_FRAMES.decode_json(raw)
            except DecodeError as exc:
                await self._put(error_frame(exc))
                continue
            if isinstance(frame, CallFrame):
                await self._start_call(frame)
            else:
                await self._handle(frame)

    async def _start_call(self, frame: CallFrame) -> None:
        """Run a ``call`` in its own task, so the connection reads on while it waits."""
        refused: TurnstileError | None = None
        if frame.id in self._inflight:
            refused = InvalidArgument(f"a call with id {frame.id!r} is already in flight", "id")
        elif len(self._inflight) >= self.limits.max_inflight_calls:
            refused = LimitExceeded(
                f"at most {self.limits.max_inflight_calls} calls may be in flight on one connection"
            )
        if refused is not None:
            await self._put(error_frame(refused, session_id=frame.session_id, id=frame.id))
            return
        assert self._nursery is not None
        self._inflight.add(frame.id)
        self._nursery.start_soon(self._call, frame, name=f"ws call {frame.tool} for {self.user}")

    async def _call(self, frame: CallFrame) -> None:
        try:
            result = await self.backend.call_tool(
                self.user, frame.session_id, frame.tool, frame.arguments
            )
            fields: dict[str, Any] = {"id": frame.id, "ok": result.ok}
            if result.ok:
                fields["data"] = result.data
            else:
                fields["error"] = result.error
            answer = encode_frame("result", **fields)
        except TurnstileError as exc:
            answer = error_frame(exc, session_id=frame.session_id, id=frame.id)
        except Exception as exc:  # a bug must not take the connection down
            log.exception("handling call frame failed")
            answer = error_frame(exc, session_id=frame.session_id, id=frame.id)
        finally:
            self._inflight.discard(frame.id)
        await self._put(answer)

    async def _send(self, frame: SendFrame) -> Submitted:
        """Store a ``send`` frame's message: in a span of its own when the node traces, under
        the frame's ``traceparent`` and ``tracestate`` (its turn continues that trace)."""
        # client_msg_id is the input's idempotency key: a resend (after a reconnect) gets the
        # first ack again and starts no second turn.
        if not tracing.active():
            return await submit_from_client(
                self.backend,
                self.user,
                frame.session_id,
                frame.content,
                frame.client_msg_id,
                "client_msg_id",
            )
        attributes = {"turnstile.session.id": frame.session_id}
        # no traceparent: a trace of its own, never the span current in this task
        parent: dict[str, str] = {}
        if frame.traceparent is not None:
            parent["traceparent"] = frame.traceparent
            if frame.tracestate is not None:  # checked in tracing.span (a bad one is dropped)
                parent["tracestate"] = frame.tracestate
        with tracing.span("ws send", parent=parent, kind="server", attributes=attributes):
            return await submit_from_client(
                self.backend,
                self.user,
                frame.session_id,
                frame.content,
                frame.client_msg_id,
                "client_msg_id",
            )

    async def _handle(self, frame: ClientFrame) -> None:
        """Answer a frame other than ``call``, before the next frame is read."""
        session_id = getattr(frame, "session_id", None)
        topic = getattr(frame, "topic", None)
        try:
            match frame:
                case SubscribeFrame():
                    await self._subscribe(frame)
                case UnsubscribeFrame():
                    self._unsubscribe(frame.topic)
                    await self._put(encode_answer(Unsubscribed(topic=frame.topic)))
                case AttachFrame():
                    await self._attach(frame)
                case DetachFrame():
                    await self._detach(frame.session_id)
                    await self._put(encode_answer(Detached(session_id=frame.session_id)))
                case SendFrame():
                    submitted = await self._send(frame)
                    await self._put(
                        encode_answer(
                            Ack(
                                session_id=frame.session_id,
                                client_msg_id=frame.client_msg_id,
                                input_id=submitted.input_id,
                                injected=submitted.injected,
                            )
                        )
                    )
                case StopFrame():
                    stopped = await self.backend.stop(self.user, frame.session_id)
                    await self._put(
                        encode_answer(Stopping(session_id=frame.session_id, running=stopped))
                    )
                case SetPolicyFrame():
                    policy = await self.backend.set_policy(
                        self.user, frame.session_id, frame.policy
                    )
                    await self._put(
                        encode_answer(PolicySet(session_id=frame.session_id, policy=policy))
                    )
                case ApproveFrame() | DenyFrame():
                    decided = await self.backend.resolve_approval(
                        self.user, frame.approval_id, isinstance(frame, ApproveFrame)
                    )
                    await self._put(encode_frame("approval", **decided))
        except TurnstileError as exc:
            await self._put(error_frame(exc, session_id=session_id, topic=topic))
        except Exception as exc:  # a bug must not take the connection down
            log.exception("handling %s frame failed", type(frame).__name__)
            await self._put(error_frame(exc, session_id=session_id, topic=topic))

    async def _attach(self, frame: AttachFrame) -> None:
        session_id = frame.session_id
        if session_id in self.subscriptions:
            await self._detach(session_id)
        elif len(self.subscriptions) >= self.limits.max_attached:
            raise InvalidArgument(
                f"a connection may attach to at most {self.limits.max_attached} sessions"
            )
        sub = _Subscription(session_id, last_sent=frame.after_seq or 0)
        self.subscriptions[session_id] = sub
        try:
            info = await self.backend.attach(self.user, session_id, self)
        except BaseException:
            self.subscriptions.pop(session_id, None)
            raise
        if frame.after_seq is None or frame.after_seq > info.last_seq:
            sub.last_sent = info.last_seq  # live from here on (nothing to replay)
        await self._put(encode_answer(Attached(session_id=session_id, last_seq=info.last_seq)))
        if frame.after_seq is not None:
            after = sub.last_sent
            while self.subscriptions.get(session_id) is sub:
                page = await self.backend.read_events(self.user, session_id, after, 500)
                if not page:
                    break
                for event in page:
                    if self.subscriptions.get(session_id) is not sub:
                        break  # dropped mid-page: its lagged frame named the last seq sent
                    await self._put(encode_event(session_id, event))
                    sub.last_sent = event.seq
                after = page[-1].seq
        if self.subscriptions.get(session_id) is not sub:
            return  # dropped while replaying (lagged or deleted)
        await self._put(
            encode_answer(
                SessionSyncFrame(
                    session_id=session_id,
                    seq=sub.last_sent,
                    busy=info.busy,
                    policy=info.policy,
                    queued=info.queued,
                    current_input_id=info.current_input_id,
                )
            )
        )
        for seq, event_frame, offered_at in sub.pending:
            if seq > sub.last_sent:
                await self._put(event_frame, offered_at)
                sub.last_sent = seq
        sub.pending = []
        sub.live = True

    async def _subscribe(self, frame: SubscribeFrame) -> None:
        """Subscribe to a user topic: ``subscribed``, the replay after ``after_seq`` (unless
        the log no longer holds it all: ``reset``), ``topic_sync``, then live events."""
        name = frame.topic
        if self.topics is None:
            raise NotFound(f"no topic {name!r} on this node")
        self._unsubscribe(name)
        sub = _Subscription(name, last_sent=frame.after_seq or 0)
        self.topic_subscriptions[name] = sub
        try:
            log = self.topics.subscribe(self.user, name, self)
            head = await log.head(self.user)
        except BaseException:
            self._unsubscribe(name)
            raise
        after = frame.after_seq
        reset = after is not None and not head.pruned_seq <= after <= head.last_seq
        if after is None or reset:
            sub.last_sent = head.last_seq  # live from here on (nothing to replay)
        await self._put(encode_answer(Subscribed(topic=name, last_seq=head.last_seq, reset=reset)))
        if after is not None and not reset:
            while self.topic_subscriptions.get(name) is sub:
                page = await log.read(self.user, sub.last_sent, 500)
                if not page:
                    break
                for event in page:
                    if self.topic_subscriptions.get(name) is not sub:
                        break  # dropped mid-page: its lagged frame named the last seq sent
                    await self._put(encode_topic_event(name, event))
                    sub.last_sent = event.seq
        if self.topic_subscriptions.get(name) is not sub:
            return  # dropped while replaying (lagged, or unsubscribed)
        await self._put(encode_answer(TopicSync(topic=name, seq=sub.last_sent)))
        for seq, event_frame, offered_at in sub.pending:
            if seq > sub.last_sent:
                await self._put(event_frame, offered_at)
                sub.last_sent = seq
        sub.pending = []
        sub.live = True

    def _unsubscribe(self, topic: str) -> None:
        if self.topic_subscriptions.pop(topic, None) is not None and self.topics is not None:
            self.topics.unsubscribe(self.user, topic, self)

    async def _detach(self, session_id: str) -> None:
        if self.subscriptions.pop(session_id, None) is None:
            return
        try:
            await self.backend.detach(self.user, session_id, self)
        except TurnstileError:
            pass  # the session is gone; nothing to detach from
