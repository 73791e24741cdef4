"""Any data round-trips on both backends (issue 23, 'Any data'): every string a client, a tool, a
model or a sender gives is read back as written, U+0000 included, which PostgreSQL's text and
jsonb cannot hold (``runtime/store/escaping.py``); a lone surrogate, which is not text, is
``InvalidArgument`` on both backends and writes nothing.

Hypothesis drives the store's write paths (events, inbox payloads, kv values, session metadata,
the sessions' and inputs' text columns) from a worker thread, one store per test, with full
Unicode (no surrogates) biased towards the escape's own characters (U+0000, U+FDD0, ``0``,
backslashes and ``u``, so ``\\u0000`` written as text is tried too); 1 MB strings separately.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.store.escaping import ESC

#: The characters the escape is made of, and those that spell ``\u0000`` as text.
_TRICKY = st.sampled_from(["\x00", ESC, "0", "\\", "u", '"', "\n", "é", "\U0001f600"])
#: Every code point but the surrogates (a str holding one is not text: see below).
_ANY = st.characters(blacklist_categories=("Cs",))
TEXT = st.one_of(st.text(_TRICKY, max_size=12), st.text(_ANY, max_size=40))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
OBJECT = st.dictionaries(TEXT, JSON, max_size=5)
#: A non-empty text for a column that refuses the empty string (event types, sources).
NAME = st.text(st.one_of(_TRICKY, _ANY), min_size=1, max_size=20)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
#: 1 MB of characters with the escape's own among them.
MEGA = ("a\x00b" + ESC + "0\\u0000é\U0001f600" + "x" * 1000) * 1040


def _run(prop: Any) -> Any:
    """Run a hypothesis property (a sync function calling the store through trio) off-thread."""
    return trio.to_thread.run_sync(prop)


async def test_events_round_trip(store):
    await store.create_session("s", owner="o")

    @SETTINGS
    @given(events=st.lists(st.tuples(NAME, OBJECT), min_size=1, max_size=4))
    def prop(events):
        written = trio.from_thread.run(store.append_events, "s", events)
        assert [(e.type, e.payload) for e in written] == events
        read = trio.from_thread.run(store.read_events, "s", written[0].seq - 1, len(events))
        assert [(e.type, e.payload) for e in read] == events

    await _run(prop)


async def test_inbox_payloads_and_sources_round_trip(store):
    await store.create_session("s", owner="o")
    keys = itertools.count()

    @SETTINGS
    @given(source=NAME, payload=OBJECT)
    def prop(source, payload):
        item = trio.from_thread.run(store.enqueue_input, "s", source, payload)
        listed = {i.id: i for i in trio.from_thread.run(store.list_inputs, "s")}
        assert (listed[item.id].source, listed[item.id].payload) == (source, payload)
        key = f"k{next(keys)}"
        keyed = trio.from_thread.run(store.enqueue_keyed, "s", source, payload, key)
        again = trio.from_thread.run(store.enqueue_keyed, "s", source, payload, key)
        assert keyed.created and not again.created  # the same payload compares equal
        assert (again.item.source, again.item.payload) == (source, payload)

    await _run(prop)


async def test_kv_values_and_keys_round_trip(store):
    @SETTINGS
    @given(key=NAME, value=OBJECT)
    def prop(key, value):
        trio.from_thread.run(store.kv_put, "ns", [(key, value, None)])
        assert trio.from_thread.run(store.kv_get, "ns", key) == value
        assert (key, value) in trio.from_thread.run(store.kv_list, "ns")
        seq = trio.from_thread.run(store.kv_append, "notify:s", value)
        assert trio.from_thread.run(store.kv_get, "notify:s", f"{seq:020d}") == value

    await _run(prop)


async def test_kv_items_written_together_round_trip_and_the_last_of_a_key_wins(store):
    """Several items in one ``kv_put_items`` (on SQLite one statement over a JSON array, unless
    a name holds U+0000): every value and name comes back as given, and of a key given twice
    the last value is kept, as if they had been written one after the other."""

    @SETTINGS
    @given(items=st.lists(st.tuples(NAME, NAME, OBJECT), min_size=2, max_size=6))
    def prop(items):
        trio.from_thread.run(
            store.kv_put_items, [(space, key, value, None) for space, key, value in items]
        )
        last = {(space, key): value for space, key, value in items}
        for (space, key), value in last.items():
            assert trio.from_thread.run(store.kv_get, space, key) == value

    await _run(prop)


async def test_session_metadata_and_ids_round_trip(store):
    made = set()

    @SETTINGS
    @given(id=NAME, owner=NAME, metadata=OBJECT, later=OBJECT)
    def prop(id, owner, metadata, later):
        if id in made:
            return
        made.add(id)
        created = trio.from_thread.run(store.create_session, id, owner, metadata)
        assert (created.id, created.owner, created.metadata) == (id, owner, metadata)
        got = trio.from_thread.run(store.get_session, id)
        assert (got.id, got.owner, got.metadata) == (id, owner, metadata)
        updated = trio.from_thread.run(lambda: store.update_session(id, metadata=later))
        assert updated.metadata == later == trio.from_thread.run(store.get_session, id).metadata

    await _run(prop)


async def test_one_megabyte_strings_round_trip(store):
    payload = {MEGA: MEGA, "list": [MEGA]}
    session = await store.create_session(MEGA[:200], owner="o", metadata=payload)
    assert (await store.get_session(session.id)).metadata == payload
    (event,) = await store.append_events(session.id, [("tool_result", payload)])
    assert (await store.read_events(session.id))[0].payload == payload == event.payload
    item = await store.enqueue_input(session.id, "user", payload)
    assert (await store.list_inputs(session.id))[0].payload == payload == item.payload
    # a key is an index entry: PostgreSQL's btree takes about 2.7 KB of one
    await store.kv_put("ns", [(MEGA[:1000], payload, None)])
    assert await store.kv_get("ns", MEGA[:1000]) == payload


async def test_the_escape_is_what_the_database_holds(store, backend):
    """No U+0000 reaches the database; the row holds the escape (both backends alike)."""
    await store.create_session("s", owner="o")
    await store.append_events("s", [("t", {"k": "a\x00b" + ESC})])
    ((raw,),) = await backend.sql("SELECT CAST(payload AS TEXT) FROM events")
    assert "\x00" not in raw and "\\u0000" not in raw
    assert "a" + ESC + "0b" + ESC + ESC in raw


@pytest.mark.parametrize(
    "write",
    [
        lambda s: s.append_events("s", [("t", {"k": "\ud800"})]),
        lambda s: s.enqueue_input("s", "user", {"k": ["\udfff"]}),
        lambda s: s.kv_put("ns", [("k", {"\ud800": 1}, None)]),
        lambda s: s.update_session("s", metadata={"k": "a\udc00b"}),
    ],
    ids=["events", "inbox", "kv", "metadata"],
)
async def test_a_lone_surrogate_is_invalid_and_writes_nothing(store, write):
    await store.create_session("s", owner="o")
    with pytest.raises(InvalidArgument, match=r"holds a lone surrogate \(U\+D[89A-F][0-9A-F]{2}\)"):
        await write(store)
    assert await store.read_events("s") == []
    assert await store.list_inputs("s") == []
    assert await store.kv_list("ns") == []
    assert (await store.get_session("s")).metadata == {}
