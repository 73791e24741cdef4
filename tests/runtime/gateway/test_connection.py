"""One WebSocket client's ``Connection``, driven directly: replay, lag, backpressure, limits, and
the error frames for bad input.

The WebSocket is an in-memory fake (``receive`` / ``send_text``, the two methods the connection
uses) whose client can stop reading, and the sessions are a fake ``SessionBackend`` that keeps
each session's event log in a list and offers every new event to its subscribers the way a
session actor does (a refused offer drops the subscriber and tells it ``lagged``). Every test
runs on ``MockClock(autojump_threshold=0)``, so a test waiting for a frame that never comes
fails at once instead of hanging; the tests wait for frames, never for time.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
import trio
import trio.testing

from turnstile.runtime.errors import IdempotencyKeyReused, NotFound
from turnstile.runtime.gateway import Attached, Connection, ConnectionLimits, Submitted
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.store import EventRecord

TS = datetime(2026, 1, 1, tzinfo=UTC)


class FakeWebSocket:
    """The client end of one connection, in memory. ``sent`` is every frame the server wrote,
    decoded; after ``stop_reading`` the server's next write blocks until ``resume_reading``
    (a client that stopped reading its socket)."""

    def __init__(self) -> None:
        self._to_server, self._from_client = trio.open_memory_channel[dict](math.inf)
        self.sent: list[dict] = []
        self._reading = trio.Event()
        self._reading.set()
        self._arrived = trio.Event()

    # -- what Connection calls --

    async def receive(self) -> dict:
        try:
            return await self._from_client.receive()
        except trio.EndOfChannel:
            return {"type": "websocket.disconnect", "code": 1000}

    async def send_text(self, text: str) -> None:
        await self._reading.wait()
        self.sent.append(json.loads(text))
        self._arrived.set()

    # -- what the test does as the client --

    def send(self, **frame: Any) -> None:
        self.send_raw(json.dumps(frame))

    def send_raw(self, text: str) -> None:
        self._to_server.send_nowait({"type": "websocket.receive", "text": text})

    def hang_up(self) -> None:
        self._to_server.close()

    def stop_reading(self) -> None:
        self._reading = trio.Event()

    def resume_reading(self) -> None:
        self._reading.set()

    async def until(self, predicate: Callable[[dict], bool]) -> dict:
        """The first frame received so far (or next) that matches ``predicate``."""
        while True:
            for frame in self.sent:
                if predicate(frame):
                    return frame
            self._arrived = trio.Event()
            await self._arrived.wait()

    async def reply(self, type_: str, **fields: Any) -> dict:
        """Wait for a frame of ``type_`` with these fields."""
        return await self.until(
            lambda f: f["type"] == type_ and all(f.get(k) == v for k, v in fields.items())
        )

    def count(self, type_: str, **fields: Any) -> int:
        """How many frames of ``type_`` with these fields were received."""
        return sum(
            f["type"] == type_ and all(f.get(k) == v for k, v in fields.items()) for f in self.sent
        )

    def seqs(self, session_id: str) -> list[int]:
        """The seqs of the session events received, in arrival order."""
        return [
            f["seq"]
            for f in self.sent
            if f.get("session_id") == session_id and f["type"] == "stream_delta"
        ]


class FakeSessions:
    """A ``SessionBackend`` over in-memory event logs. ``publish`` stores an event and offers it
    to the session's subscribers like a session actor; ``on_read`` / ``after_read`` run inside
    ``read_events`` before and after the page is taken from the log (to publish mid-replay)."""

    def __init__(self, **owners: str) -> None:
        self.owners = owners or {"s": "ada", "t": "ada"}
        self.logs: dict[str, list[EventRecord]] = {name: [] for name in self.owners}
        self.subscribers: dict[str, list[Any]] = {name: [] for name in self.owners}
        self.attaches: list[str] = []
        self.detaches: list[str] = []
        self.reads: list[tuple[str, int, int]] = []
        self.on_read: Callable[[int], Awaitable[None]] | None = None
        self.after_read: Callable[[int], Awaitable[None]] | None = None
        self.fail_attach_with: BaseException | None = None
        self.keyed: dict[tuple[str, str], tuple[str, int]] = {}
        self.keys_seen: list[str] = []

    def _owned(self, user: str, session_id: str) -> None:
        if self.owners.get(session_id) != user:
            raise NotFound(f"no session with id {session_id!r}")

    def store(self, session_id: str, n: int = 1) -> None:
        """Append ``n`` events nobody is offered (they happened while nobody watched)."""
        log = self.logs[session_id]
        for _ in range(n):
            seq = len(log) + 1
            log.append(
                EventRecord(
                    session_id=session_id,
                    seq=seq,
                    type="stream_delta",
                    payload={"text": f"e{seq}"},
                    ts=TS,
                )
            )

    def offer(self, session_id: str, *seqs: int) -> list[bool]:
        """Offer stored events to the subscribers; what each offer answered."""
        answers = []
        for seq in seqs:
            record = self.logs[session_id][seq - 1]
            frame = encode_event(session_id, record)
            for sub in list(self.subscribers[session_id]):
                accepted = sub.offer(session_id, record.seq, frame)
                answers.append(accepted)
                if not accepted:
                    self.subscribers[session_id].remove(sub)
                    sub.lagged(session_id, record.seq - 1)
        return answers

    def publish(self, session_id: str, n: int = 1) -> list[bool]:
        """Store ``n`` events and offer each (a session offers an event once it is stored)."""
        self.store(session_id, n)
        last = len(self.logs[session_id])
        return self.offer(session_id, *range(last - n + 1, last + 1))

    # -- SessionBackend --

    async def ping(self) -> None:
        pass

    async def submit(
        self, user, session_id, content, payload=None, *, idempotency_key=None
    ) -> Submitted:
        self._owned(user, session_id)
        if content == "boom":
            raise RuntimeError("a bug in the backend")
        if idempotency_key is None:
            return Submitted(input_id=1)
        self.keys_seen.append(idempotency_key)
        earlier = self.keyed.get((session_id, idempotency_key))
        if earlier is None:  # the store's rule, in short: the first input under a key stays
            self.keyed[(session_id, idempotency_key)] = (content, len(self.keyed) + 1)
            return Submitted(input_id=len(self.keyed))
        if earlier[0] != content:
            raise IdempotencyKeyReused("the key names another input")
        return Submitted(input_id=earlier[1], replayed=True)

    async def stop(self, user, session_id) -> bool:
        self._owned(user, session_id)
        return False

    async def set_policy(self, user, session_id, policy) -> str:
        self._owned(user, session_id)
        return policy

    async def attach(self, user, session_id, subscriber) -> Attached:
        self._owned(user, session_id)
        self.attaches.append(session_id)
        if self.fail_attach_with is not None:
            raise self.fail_attach_with
        self.subscribers[session_id].append(subscriber)
        return Attached(
            last_seq=len(self.logs[session_id]),
            busy=False,
            policy="enqueue",
            queued=0,
            current_input_id=None,
        )

    async def detach(self, user, session_id, subscriber) -> None:
        self._owned(user, session_id)
        self.detaches.append(session_id)
        if subscriber in self.subscribers[session_id]:
            self.subscribers[session_id].remove(subscriber)

    async def read_events(self, user, session_id, after_seq=0, limit=1000) -> list[EventRecord]:
        self._owned(user, session_id)
        self.reads.append((session_id, after_seq, limit))
        index = len(self.reads)
        if self.on_read is not None:
            await self.on_read(index)
        page = self.logs[session_id][after_seq : after_seq + limit]
        if self.after_read is not None:
            await self.after_read(index)
        return page

    async def call_tool(self, user, session_id, tool, arguments):
        raise NotImplementedError

    async def resolve_approval(self, user, approval_id, approved):
        raise NotFound(f"no pending approval with id {approval_id!r}")


@asynccontextmanager
async def serving(
    sessions: FakeSessions, limits: ConnectionLimits | None = None, user: str = "ada"
) -> AsyncIterator[tuple[FakeWebSocket, Connection]]:
    """A connection serving ``user`` over a fake WebSocket; the client hangs up at the end."""
    ws = FakeWebSocket()
    connection = Connection(ws, user, sessions, limits or ConnectionLimits())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.serve)
        yield ws, connection
        ws.resume_reading()
        ws.hang_up()


def kinds(frames: list[dict]) -> list[tuple[str, int | None]]:
    return [(f["type"], f.get("seq", f.get("last_seq"))) for f in frames]


# -- replay --------------------------------------------------------------------------------


async def test_attach_after_seq_replays_exactly_the_missed_events_in_order_then_goes_live(
    autojump_clock,
):
    sessions = FakeSessions()
    sessions.store("s", 5)
    async with serving(sessions) as (ws, _):
        ws.send(type="attach", session_id="s", after_seq=2)
        await ws.reply("session_sync")
        sessions.publish("s", 2)
        await ws.until(lambda f: f.get("seq") == 7)
        assert kinds(ws.sent) == [
            ("attached", 5),
            ("stream_delta", 3),
            ("stream_delta", 4),
            ("stream_delta", 5),
            ("session_sync", 5),
            ("stream_delta", 6),
            ("stream_delta", 7),
        ]
        assert ws.sent[1] == {
            "type": "stream_delta",
            "text": "e3",
            "session_id": "s",
            "seq": 3,
            "ts": "2026-01-01T00:00:00Z",
        }
        assert ws.sent[4] == {
            "type": "session_sync",
            "session_id": "s",
            "seq": 5,
            "busy": False,
            "policy": "enqueue",
            "queued": 0,
        }


async def test_attach_without_after_seq_replays_nothing(autojump_clock):
    sessions = FakeSessions()
    sessions.store("s", 5)
    async with serving(sessions) as (ws, _):
        ws.send(type="attach", session_id="s")
        await ws.reply("session_sync")
        sessions.publish("s")
        await ws.until(lambda f: f.get("seq") == 6)
        assert kinds(ws.sent) == [("attached", 5), ("session_sync", 5), ("stream_delta", 6)]
        assert sessions.reads == []


async def test_an_after_seq_beyond_the_log_goes_live_from_the_sessions_last_seq(autojump_clock):
    """A client that remembers seq 100 of a session now at 5 (it was re-created) still gets
    event 6: it is not taken for one already sent."""
    sessions = FakeSessions()
    sessions.store("s", 5)
    async with serving(sessions) as (ws, _):
        ws.send(type="attach", session_id="s", after_seq=100)
        await ws.reply("session_sync")
        sessions.publish("s")
        await ws.until(lambda f: f.get("seq") == 6)
        assert kinds(ws.sent) == [("attached", 5), ("session_sync", 5), ("stream_delta", 6)]


async def test_events_arriving_during_a_replay_come_once_each_in_order_without_a_gap(
    autojump_clock,
):
    """1,200 stored events replay in pages of 500. Three events are published while the second
    page is being read (so they are both in the store and offered: sent once), three more once
    the last page was read (offered only: held and sent after the replay), then live ones."""
    sessions = FakeSessions()
    sessions.store("s", 1200)

    async def during(index: int) -> None:
        if index == 2:
            assert sessions.publish("s", 3) == [True] * 3  # held, not refused

    async def after(index: int) -> None:
        if index == 4:  # the read that found nothing more
            assert sessions.publish("s", 3) == [True] * 3

    sessions.on_read, sessions.after_read = during, after
    async with serving(sessions) as (ws, _):
        ws.send(type="attach", session_id="s", after_seq=0)
        sync = await ws.reply("session_sync")
        assert sync["seq"] == 1203  # the replay read the three published mid-replay
        sessions.publish("s", 2)
        await ws.until(lambda f: f.get("seq") == 1208)
        assert ws.seqs("s") == list(range(1, 1209))
        assert [r[1:] for r in sessions.reads] == [(0, 500), (500, 500), (1000, 500), (1203, 500)]
        after_sync = ws.sent[ws.sent.index(sync) + 1 :]
        assert [f["seq"] for f in after_sync] == [1204, 1205, 1206, 1207, 1208]


async def test_an_event_the_replay_read_before_the_session_offered_it_is_sent_once(
    autojump_clock,
):
    """A session stores a batch, then offers it: a replay can read events that are offered to
    the connection only after it went live."""
    sessions = FakeSessions()
    sessions.store("s", 2)

    async def during(index: int) -> None:
        if index == 1:
            sessions.store("s", 2)  # 3 and 4: stored, not offered yet

    sessions.on_read = during
    async with serving(sessions) as (ws, _):
        ws.send(type="attach", session_id="s", after_seq=0)
        await ws.reply("session_sync", seq=4)
        assert sessions.offer("s", 3, 4) == [True, True]
        sessions.publish("s")
        await ws.until(lambda f: f.get("seq") == 5)
        assert ws.seqs("s") == [1, 2, 3, 4, 5]


# -- lag and backpressure -------------------------------------------------------------------


async def test_offer_refuses_once_the_outbox_holds_outbox_frames_and_accepts_after_a_drain(
    autojump_clock,
):
    sessions = FakeSessions()
    async with serving(sessions, ConnectionLimits(outbox_frames=3)) as (ws, conn):
        ws.send(type="attach", session_id="s")
        await ws.reply("session_sync")
        ws.stop_reading()
        frame = b'{"type":"stream_delta"}'
        assert conn.offer("s", 1, frame) is True
        await trio.testing.wait_all_tasks_blocked()  # the writer took it and waits on the client
        assert [conn.offer("s", seq, frame) for seq in (2, 3, 4, 5)] == [True, True, True, False]
        assert conn.offer("s", 5, frame) is False  # still full
        ws.resume_reading()
        await ws.until(lambda f: len(ws.sent) == 6)  # attached, sync, and the 4 accepted
        await trio.testing.wait_all_tasks_blocked()
        assert conn.offer("s", 5, frame) is True
        assert conn.offer("t", 1, frame) is False  # not attached to t: nothing is queued


async def test_a_client_that_fell_behind_is_dropped_from_that_session_only_and_told_where_to_resume(
    autojump_clock,
):
    sessions = FakeSessions()
    async with serving(sessions, ConnectionLimits(outbox_frames=4)) as (ws, conn):
        for name in ("s", "t"):
            ws.send(type="attach", session_id=name)
            await ws.reply("session_sync", session_id=name)
        ws.stop_reading()
        assert sessions.publish("s") == [True]
        await trio.testing.wait_all_tasks_blocked()  # seq 1 is in the blocked write
        assert sessions.publish("s", 5) == [True, True, True, True, False]
        assert sessions.subscribers["s"] == []  # the session let go of this client
        assert set(conn.subscriptions) == {"t"}
        assert sessions.publish("s") == []  # later events of s are not offered at all
        ws.resume_reading()
        lagged = await ws.reply("error", code="lagged")
        assert lagged == {
            "type": "error",
            "code": "lagged",
            "message": "dropped from session 's'; re-attach with after_seq=5 to catch up",
            "session_id": "s",
            "last_seq": 5,
        }
        assert ws.seqs("s") == [1, 2, 3, 4, 5]

        sessions.publish("t", 2)  # the other session's events still come, live
        await ws.until(lambda f: f.get("session_id") == "t" and f.get("seq") == 2)
        assert ws.seqs("t") == [1, 2]

        ws.send(type="attach", session_id="s", after_seq=lagged["last_seq"])
        await ws.reply("session_sync", session_id="s", seq=7)
        assert ws.seqs("s") == [1, 2, 3, 4, 5, 6, 7]  # caught up from the store, no gap


def held_beyond_the_bound(sessions: FakeSessions, answers: list[bool]) -> None:
    """Two stored events; while the first replay page is read, four more are published."""
    sessions.store("s", 2)

    async def during(index: int) -> None:
        if index == 1:
            answers.extend(sessions.publish("s", 4))

    sessions.on_read = during


async def test_events_held_during_a_replay_are_bounded_by_outbox_frames(autojump_clock):
    sessions = FakeSessions()
    answers: list[bool] = []
    held_beyond_the_bound(sessions, answers)
    async with serving(sessions, ConnectionLimits(outbox_frames=3)) as (ws, conn):
        ws.send(type="attach", session_id="s", after_seq=0)
        lagged = await ws.reply("error", code="lagged")
        assert answers == [True, True, True, False]
        assert lagged["last_seq"] == 0  # dropped before any event was sent
        await trio.testing.wait_all_tasks_blocked()
        assert conn.subscriptions == {}
        assert ws.count("session_sync") == 0  # it never went live


async def test_a_client_dropped_mid_replay_is_sent_nothing_more_of_that_session(autojump_clock):
    sessions = FakeSessions()
    held_beyond_the_bound(sessions, [])
    async with serving(sessions, ConnectionLimits(outbox_frames=3)) as (ws, _):
        ws.send(type="attach", session_id="s", after_seq=0)
        await ws.reply("error", code="lagged")
        await trio.testing.wait_all_tasks_blocked()
        assert [f["type"] for f in ws.sent] == ["attached", "error"]


# -- limits ---------------------------------------------------------------------------------


async def test_a_connection_attaches_to_at_most_max_attached_sessions(autojump_clock):
    sessions = FakeSessions(a="ada", b="ada", c="ada")
    async with serving(sessions, ConnectionLimits(max_attached=2)) as (ws, conn):
        for name in ("a", "b"):
            ws.send(type="attach", session_id=name)
            await ws.reply("session_sync", session_id=name)
        ws.send(type="attach", session_id="c")
        refused = await ws.reply("error", session_id="c")
        assert refused == {
            "type": "error",
            "code": "invalid_argument",
            "message": "a connection may attach to at most 2 sessions",
            "session_id": "c",
        }
        assert sessions.attaches == ["a", "b"]  # c was never asked

        ws.send(type="attach", session_id="a", after_seq=0)  # re-attaching is not one more
        await ws.until(lambda f: ws.count("session_sync", session_id="a") == 2)
        ws.send(type="detach", session_id="b")
        await ws.reply("detached", session_id="b")
        ws.send(type="attach", session_id="c")
        await ws.reply("session_sync", session_id="c")
        assert set(conn.subscriptions) == {"a", "c"}
        assert sessions.attaches == ["a", "b", "a", "c"]
    assert sorted(sessions.detaches) == ["a", "a", "b", "c"]  # the hang-up detached the rest


# -- error frames ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (
            "not json",
            {
                "code": "bad_message",
                "message": "malformed JSON: JSON is malformed: invalid character (byte 4)",
            },
        ),
        (
            '{"type": "nope"}',
            {"code": "bad_message", "message": "unknown message type at $.type", "field": "$.type"},
        ),
        (
            '{"type": "attach"}',
            {
                "code": "bad_message",
                "message": "missing required field at $.session_id",
                "field": "$.session_id",
            },
        ),
        (
            '{"type": "attach", "session_id": "s", "extra": 1}',
            {"code": "bad_message", "message": "unknown field at $.extra", "field": "$.extra"},
        ),
        (
            '{"type": "attach", "session_id": "s", "after_seq": -1}',
            {
                "code": "bad_message",
                "message": "expected `int` >= 0 at $.after_seq",
                "field": "$.after_seq",
            },
        ),
        (
            '{"type": "attach", "session_id": "s\\n"}',
            {
                "code": "bad_message",
                "message": "expected `str` matching regex '\\\\A[A-Za-z0-9_.:-]{1,128}\\\\Z' "
                "at $.session_id",
                "field": "$.session_id",
            },
        ),
        (
            "[" * 65 + "]" * 65,
            {"code": "bad_message", "message": "malformed JSON: nested deeper than 64 levels"},
        ),
        (
            json.dumps({"type": "send", "session_id": "s", "content": "x" * 200}),
            {"code": "invalid_argument", "message": "frame is larger than 200 bytes"},
        ),
    ],
)
async def test_a_bad_frame_is_answered_with_a_typed_error_and_the_connection_reads_on(
    raw, error, autojump_clock
):
    sessions = FakeSessions()
    async with serving(sessions, ConnectionLimits(max_frame_bytes=200)) as (ws, conn):
        ws.send_raw(raw)
        ws.send(type="send", session_id="s", content="hi", client_msg_id="m1")
        await ws.reply("ack")
        assert ws.sent == [
            {"type": "error", **error},
            {"type": "ack", "session_id": "s", "client_msg_id": "m1", "input_id": 1},
        ]
        assert conn.subscriptions == {}
        assert sessions.attaches == []


async def test_a_session_of_another_user_is_not_found_and_a_backend_bug_is_internal(
    autojump_clock,
):
    sessions = FakeSessions(s="ada", theirs="bob")
    async with serving(sessions) as (ws, conn):
        ws.send(type="attach", session_id="theirs")
        ws.send(type="send", session_id="s", content="boom")
        ws.send(type="send", session_id="s", content="fine")
        await ws.reply("ack")
        assert ws.sent == [
            {
                "type": "error",
                "code": "not_found",
                "message": "no session with id 'theirs'",
                "session_id": "theirs",
            },
            {"type": "error", "code": "internal", "message": "internal error", "session_id": "s"},
            {"type": "ack", "session_id": "s", "input_id": 1},
        ]
        assert conn.subscriptions == {}


async def test_a_send_s_client_msg_id_is_its_idempotency_key(autojump_clock):
    """The connection hands the backend ``client:<client_msg_id>``: a resend is acked as the
    first send was; a malformed id or one reused for another message is a typed error naming
    ``client_msg_id``, and the connection reads on."""
    sessions = FakeSessions()
    async with serving(sessions) as (ws, conn):
        ack = {"type": "ack", "session_id": "s", "client_msg_id": "m1", "input_id": 1}
        ws.send(type="send", session_id="s", content="hi", client_msg_id="m1")
        ws.send(type="send", session_id="s", content="hi", client_msg_id="m1")
        ws.send(type="send", session_id="s", content="other", client_msg_id="m1")
        ws.send(type="send", session_id="s", content="hi", client_msg_id="has space")
        ws.send(type="send", session_id="s", content="hi", client_msg_id="m2")
        await ws.reply("ack", client_msg_id="m2")
        assert ws.sent == [
            ack,
            ack,
            {
                "type": "error",
                "code": "idempotency_key_reused",
                "message": "client_msg_id 'm1' was already used for another message of this"
                " session; a resend must repeat the message exactly",
                "field": "client_msg_id",
                "session_id": "s",
            },
            {
                "type": "error",
                "code": "invalid_argument",
                "message": "client_msg_id must be 1 to 128 visible ASCII characters"
                " (no spaces or control characters)",
                "field": "client_msg_id",
                "session_id": "s",
            },
            {"type": "ack", "session_id": "s", "client_msg_id": "m2", "input_id": 2},
        ]
        assert sessions.keys_seen == ["client:m1"] * 3 + ["client:m2"]


async def test_an_attach_the_backend_refuses_leaves_no_subscription(autojump_clock):
    sessions = FakeSessions()
    sessions.fail_attach_with = NotFound("no session with id 's'")
    async with serving(sessions, ConnectionLimits(max_attached=1)) as (ws, conn):
        ws.send(type="attach", session_id="s")
        await ws.reply("error", code="not_found")
        assert conn.subscriptions == {}
        assert conn.offer("s", 1, b"{}") is False
        sessions.fail_attach_with = None
        ws.send(type="attach", session_id="t")  # the refused attach took no slot
        await ws.reply("session_sync", session_id="t")
