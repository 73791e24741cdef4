"""The per-session event log, on both backends."""

from __future__ import annotations

import pytest
import trio

from tests.runtime.store._support import T0
from turnstile.runtime.errors import NotFound
from turnstile.runtime.store import EventRecord


async def test_append_and_read(store, clock):
    await store.create_session("s1", "ada")
    assert await store.last_seq("s1") == 0
    assert await store.read_events("s1") == []

    first = await store.append_events("s1", [("turn.started", {"n": 1}), ("text", {"t": "hi"})])
    assert first == [
        EventRecord(session_id="s1", seq=1, type="turn.started", payload={"n": 1}, ts=T0),
        EventRecord(session_id="s1", seq=2, type="text", payload={"t": "hi"}, ts=T0),
    ]
    clock.advance(seconds=1)
    (third,) = await store.append_events("s1", [("turn.ended", {})])
    assert third.seq == 3 and third.ts > T0

    assert await store.read_events("s1") == [*first, third]
    assert [e.seq for e in await store.read_events("s1", after_seq=1)] == [2, 3]
    assert [e.seq for e in await store.read_events("s1", after_seq=1, limit=1)] == [2]
    assert await store.read_events("s1", after_seq=3) == []
    assert await store.last_seq("s1") == 3
    session = await store.get_session("s1")
    assert session.last_seq == 3 and session.updated_at == third.ts


async def test_append_nothing(store):
    await store.create_session("s1", "ada")
    assert await store.append_events("s1", []) == []
    assert await store.last_seq("s1") == 0
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.append_events("nope", [])


async def test_logs_are_per_session(store):
    await store.create_session("s1", "ada")
    await store.create_session("s2", "ada")
    await store.append_events("s1", [("a", {})] * 3)
    (e,) = await store.append_events("s2", [("b", {})])
    assert e.seq == 1
    assert [e.type for e in await store.read_events("s2")] == ["b"]


async def test_unknown_session(store):
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.append_events("nope", [("a", {})])
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.read_events("nope")
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.last_seq("nope")


async def test_bad_events_write_nothing(store):
    await store.create_session("s1", "ada")
    with pytest.raises(TypeError, match="payload must be a dict"):
        await store.append_events("s1", [("a", {}), ("b", None)])
    with pytest.raises(TypeError, match=r"events must be a sequence of \(type, payload\) pairs"):
        await store.append_events("s1", [("a",)])
    with pytest.raises(ValueError, match="event type must not be empty"):
        await store.append_events("s1", [("", {})])
    assert await store.last_seq("s1") == 0


async def test_concurrent_appenders_get_gap_free_seqs(store):
    """50 tasks append a pair each at once: seqs are 1..100, each pair consecutive."""
    await store.create_session("s1", "ada")
    pairs: dict[int, list[int]] = {}

    async def appender(i: int) -> None:
        recs = await store.append_events("s1", [("a", {"i": i}), ("b", {"i": i})])
        pairs[i] = [r.seq for r in recs]

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(appender, i)

    assert sorted(s for seqs in pairs.values() for s in seqs) == list(range(1, 101))
    assert all(b == a + 1 and a % 2 == 1 for a, b in pairs.values())
    stored = await store.read_events("s1")
    assert [e.seq for e in stored] == list(range(1, 101))
    assert all(stored[s - 1].payload == {"i": i} for i, seqs in pairs.items() for s in seqs)
    assert await store.last_seq("s1") == 100


async def test_concurrent_appenders_across_stores(store, backend):
    await store.create_session("s1", "ada")
    async with backend.open() as other:
        async with trio.open_nursery() as nursery:
            for i in range(20):
                s = store if i % 2 else other
                nursery.start_soon(s.append_events, "s1", [("e", {"i": i})])
    assert [e.seq for e in await store.read_events("s1")] == list(range(1, 21))


async def test_reading_back_the_newest_events_of_some_types(store):
    """``read_events_back``: the newest events of the types asked for, before a seq, newest
    first: the end of a long log (a transcript) without reading all of it."""
    await store.create_session("s1", "ada")
    await store.create_session("s2", "ada")
    kinds = ["start", "delta", "delta", "end"] * 3  # seqs 1..12
    await store.append_events("s1", [(kind, {"i": i}) for i, kind in enumerate(kinds, 1)])
    await store.append_events("s2", [("start", {}), ("end", {})])
    back = await store.read_events_back("s1", ["start", "end"])
    assert [(e.seq, e.type) for e in back] == [
        (12, "end"),
        (9, "start"),
        (8, "end"),
        (5, "start"),
        (4, "end"),
        (1, "start"),
    ]
    assert back[0].payload == {"i": 12}
    assert [e.seq for e in await store.read_events_back("s1", ["end"], limit=2)] == [12, 8]
    assert [e.seq for e in await store.read_events_back("s1", ["end"], before_seq=8)] == [4]
    assert await store.read_events_back("s1", ["start"], before_seq=1) == []
    assert await store.read_events_back("s1", ["nothing"]) == []
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.read_events_back("nope", ["start"])
    with pytest.raises(ValueError, match="types must name 1 to 16 event types"):
        await store.read_events_back("s1", [])
    with pytest.raises(TypeError, match="before_seq must be an int"):
        await store.read_events_back("s1", ["start"], before_seq="3")
