"""User topics: ``UserTopics`` and a ``Connection``'s ``subscribe`` / ``unsubscribe`` frames,
driven directly over the fake WebSocket of ``test_connection``, on ``MockClock``.

The topic's log is a fake ``TopicLog`` per user (a list of events, with a ``pruned_seq``);
``publish`` appends to it and publishes through the hub, as a feature does after its commit.
What is checked: a user gets their own events and nobody else's; the replay after ``after_seq``
then live, each event once and in order (events published during the replay included);
``reset`` when the log no longer holds what followed ``after_seq``; ``lagged`` and catching up;
unsubscribing; unknown topics and bad frames answered with an error naming the topic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import pytest
import trio
import trio.testing

from tests.runtime.gateway.test_connection import FakeSessions, FakeWebSocket
from turnstile.runtime.gateway import Connection, ConnectionLimits, TopicEvent, TopicHead
from turnstile.runtime.gateway.topics import UserTopics

TS = datetime(2026, 1, 1, tzinfo=UTC)


class FakeLog:
    """A ``TopicLog`` in memory: each user's events, and how far each was pruned."""

    def __init__(self, topics: UserTopics, name: str = "notes") -> None:
        self.topics = topics
        self.name = name
        self.events: dict[str, list[TopicEvent]] = {}
        self.pruned: dict[str, int] = {}
        self.reads: list[tuple[str, int, int]] = []
        self.on_read: Callable[[int], Awaitable[None]] | None = None
        topics.register(name, self)

    def publish(self, user: str, n: int = 1, *, gap: int = 0) -> int:
        """Append ``n`` events of ``user`` (``gap`` seqs skipped before them, as a log that
        dropped moot events) and publish them; how many connections were offered them."""
        log = self.events.setdefault(user, [])
        seq = (log[-1].seq if log else 0) + gap
        new = []
        for _ in range(n):
            seq += 1
            new.append(TopicEvent(seq, "noted", TS, {"text": f"{user} {seq}"}))
        log.extend(new)
        return self.topics.publish(user, self.name, new)

    async def head(self, user: str) -> TopicHead:
        log = self.events.get(user, [])
        return TopicHead(log[-1].seq if log else 0, self.pruned.get(user, 0))

    async def read(self, user: str, after_seq: int, limit: int) -> list[TopicEvent]:
        self.reads.append((user, after_seq, limit))
        if self.on_read is not None:
            await self.on_read(len(self.reads))
        return [e for e in self.events.get(user, []) if e.seq > after_seq][:limit]


@asynccontextmanager
async def serving(
    topics: UserTopics | None, user: str = "ada", limits: ConnectionLimits | None = None
) -> AsyncIterator[tuple[FakeWebSocket, Connection]]:
    ws = FakeWebSocket()
    connection = Connection(ws, user, FakeSessions(), limits or ConnectionLimits(), topics=topics)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.serve)
        yield ws, connection
        ws.resume_reading()
        ws.hang_up()


def topic_frames(ws: FakeWebSocket) -> list[tuple[str, int | None]]:
    return [(f["type"], f.get("seq", f.get("last_seq"))) for f in ws.sent if "topic" in f]


async def test_a_user_gets_their_own_events_and_nobody_elses(autojump_clock):
    topics = UserTopics()
    log = FakeLog(topics)
    async with serving(topics, "ada") as (ada, _), serving(topics, "bob") as (bob, _):
        ada.send(type="subscribe", topic="notes")
        bob.send(type="subscribe", topic="notes")
        await ada.reply("topic_sync")
        await bob.reply("topic_sync")
        assert log.publish("ada", 2) == 1  # offered to ada's connection only
        assert log.publish("bob") == 1
        assert log.publish("carol") == 0  # nobody listens
        await ada.until(lambda f: f.get("seq") == 2)
        await bob.until(lambda f: f.get("seq") == 1)
        await trio.testing.wait_all_tasks_blocked()
        assert ada.sent == [
            {"type": "subscribed", "topic": "notes", "last_seq": 0},
            {"type": "topic_sync", "topic": "notes", "seq": 0},
            {
                "type": "noted",
                "text": "ada 1",
                "topic": "notes",
                "seq": 1,
                "ts": "2026-01-01T00:00:00Z",
            },
            {
                "type": "noted",
                "text": "ada 2",
                "topic": "notes",
                "seq": 2,
                "ts": "2026-01-01T00:00:00Z",
            },
        ]
        assert [f.get("text") for f in bob.sent] == [None, None, "bob 1"]
    assert topics.statistics().subscriptions == 0  # hanging up unsubscribes


async def test_after_seq_replays_the_missed_events_then_goes_live(autojump_clock):
    topics = UserTopics()
    log = FakeLog(topics)
    log.publish("ada", 3)
    log.publish("ada", 2, gap=4)  # seqs 8 and 9: the log dropped 4-7 as moot
    async with serving(topics) as (ws, _):
        ws.send(type="subscribe", topic="notes", after_seq=2)
        await ws.reply("topic_sync")
        log.publish("ada")
        await ws.until(lambda f: f.get("seq") == 10)
        assert topic_frames(ws) == [
            ("subscribed", 9),
            ("noted", 3),
            ("noted", 8),
            ("noted", 9),
            ("topic_sync", 9),
            ("noted", 10),
        ]
        assert "reset" not in ws.sent[0]


async def test_events_published_during_the_replay_come_once_each_in_order(autojump_clock):
    """1,200 events replay in pages of 500; three are published while the second page is
    read (in the log and offered: sent once), then live ones."""
    topics = UserTopics()
    log = FakeLog(topics)
    log.publish("ada", 1200)

    async def during(index: int) -> None:
        if index == 2:
            assert log.publish("ada", 3) == 1

    log.on_read = during
    async with serving(topics) as (ws, _):
        ws.send(type="subscribe", topic="notes", after_seq=0)
        sync = await ws.reply("topic_sync")
        assert sync["seq"] == 1203
        log.publish("ada", 2)
        await ws.until(lambda f: f.get("seq") == 1205)
        seqs = [f["seq"] for f in ws.sent if f["type"] == "noted"]
        assert seqs == list(range(1, 1206))
        assert [r[1:] for r in log.reads] == [(0, 500), (500, 500), (1000, 500), (1203, 500)]


@pytest.mark.parametrize(
    ("after_seq", "why"), [(3, "older than what was pruned"), (50, "beyond the log")]
)
async def test_a_log_that_no_longer_holds_what_followed_says_reset(autojump_clock, after_seq, why):
    topics = UserTopics()
    log = FakeLog(topics)
    log.publish("ada", 10)
    log.pruned["ada"] = 5
    async with serving(topics) as (ws, _):
        ws.send(type="subscribe", topic="notes", after_seq=after_seq)
        await ws.reply("topic_sync")
        log.publish("ada")
        await ws.until(lambda f: f.get("seq") == 11)
        assert ws.sent[0] == {"type": "subscribed", "topic": "notes", "last_seq": 10, "reset": True}
        assert topic_frames(ws) == [("subscribed", 10), ("topic_sync", 10), ("noted", 11)], why
        assert log.reads == []  # nothing replayed: the client reloads instead
    # exactly at the pruned point nothing is missing
    async with serving(topics) as (ws, _):
        ws.send(type="subscribe", topic="notes", after_seq=5)
        await ws.reply("topic_sync")
        assert [f["seq"] for f in ws.sent if f["type"] == "noted"] == [6, 7, 8, 9, 10, 11]


async def test_a_client_that_falls_behind_is_dropped_and_catches_up(autojump_clock):
    topics = UserTopics()
    log = FakeLog(topics)
    async with serving(topics, limits=ConnectionLimits(outbox_frames=4)) as (ws, _):
        ws.send(type="subscribe", topic="notes")
        await ws.reply("topic_sync")
        await trio.testing.wait_all_tasks_blocked()
        ws.stop_reading()
        log.publish("ada", 12)  # the writer blocks on the first; the outbox fills behind it
        ws.resume_reading()
        lagged = await ws.reply("error", code="lagged")
        last = lagged["last_seq"]
        assert lagged == {
            "type": "error",
            "code": "lagged",
            "topic": "notes",
            "last_seq": last,
            "message": f"dropped from topic 'notes'; subscribe again with after_seq={last}"
            " to catch up",
        }
        assert topics.statistics().lagged == 1
        assert [f["seq"] for f in ws.sent if f["type"] == "noted"] == list(range(1, last + 1))
        log.publish("ada")  # not offered: dropped
        ws.send(type="subscribe", topic="notes", after_seq=last)
        await ws.until(lambda f: f.get("seq") == 13)
        assert [f["seq"] for f in ws.sent if f["type"] == "noted"] == list(range(1, 14))


async def test_unsubscribe_stops_the_events(autojump_clock):
    topics = UserTopics()
    log = FakeLog(topics)
    async with serving(topics) as (ws, _):
        ws.send(type="subscribe", topic="notes")
        await ws.reply("topic_sync")
        ws.send(type="unsubscribe", topic="notes")
        await ws.reply("unsubscribed", topic="notes")
        assert log.publish("ada") == 0
        ws.send(type="unsubscribe", topic="notes")  # again: harmless
        await trio.testing.wait_all_tasks_blocked()
        assert ws.count("unsubscribed") == 2
        assert ws.count("noted") == 0


async def test_unknown_topics_and_bad_frames_are_errors_naming_the_topic(autojump_clock):
    topics = UserTopics()
    FakeLog(topics)
    async with serving(topics) as (ws, _):
        ws.send(type="subscribe", topic="elsewhere")
        error = await ws.reply("error")
        assert error == {
            "type": "error",
            "code": "not_found",
            "message": "no topic 'elsewhere' on this node",
            "topic": "elsewhere",
        }
        ws.send(type="subscribe", topic="Not A Name")
        bad = await ws.reply("error", code="bad_message")
        assert bad["field"] == "$.topic"
        ws.send(type="subscribe", topic="notes", after_seq=-1)
        bad = await ws.reply("error", field="$.after_seq")
        assert bad["code"] == "bad_message"
        ws.send(type="subscribe", topic="notes", session_id="s")
        assert (await ws.reply("error", field="$.session_id"))["code"] == "bad_message"
    async with serving(None) as (ws, _):  # a gateway without topics
        ws.send(type="subscribe", topic="notes")
        assert (await ws.reply("error"))["code"] == "not_found"


def test_topic_names_are_checked_and_unique():
    topics = UserTopics()
    FakeLog(topics, "notes")
    with pytest.raises(ValueError, match="already registered"):
        FakeLog(topics, "notes")
    with pytest.raises(ValueError, match="topic name must match"):
        FakeLog(topics, "Notes!")
    with pytest.raises(LookupError, match="no topic 'other'"):
        topics.publish("ada", "other", [])
