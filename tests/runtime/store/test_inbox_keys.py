"""Idempotency keys on the inbox: one row per session and key, on both backends.

What ingress relies on: a client's resend, or the same delivery sent many times at once, stores
one input, and every caller gets that input back; the rule is the database's own (a unique
index), so it holds across concurrent callers and across a restart.
"""

from __future__ import annotations

import pytest
import trio

from tests.runtime.store._support import T0
from turnstile.runtime.errors import IdempotencyKeyReused, InvalidArgument, NotFound
from turnstile.runtime.store import Enqueued, InboxItem


async def test_a_key_stores_one_input_and_answers_it_again(store):
    await store.create_session("s1", "ada")
    first = await store.enqueue_keyed("s1", "user", {"content": "hi"}, "client:m1")
    assert first == Enqueued(
        item=InboxItem(
            id=first.item.id,
            session_id="s1",
            source="user",
            payload={"content": "hi"},
            state="queued",
            created_at=T0,
            updated_at=T0,
            idempotency_key="client:m1",
        ),
        created=True,
    )
    again = await store.enqueue_keyed("s1", "user", {"content": "hi"}, "client:m1")
    assert again == Enqueued(item=first.item, created=False)
    assert [i.id for i in await store.list_inputs("s1")] == [first.item.id]
    # The answer follows the row: once claimed, a resend sees it running.
    await store.claim_next_input("s1")
    later = await store.enqueue_keyed("s1", "user", {"content": "hi"}, "client:m1")
    assert (later.item.id, later.item.state, later.created) == (first.item.id, "running", False)


async def test_keys_are_per_session_and_inputs_without_keys_are_unaffected(store):
    await store.create_session("s1", "ada")
    await store.create_session("s2", "ada")
    a = await store.enqueue_keyed("s1", "user", {"content": "x"}, "k")
    b = await store.enqueue_keyed("s2", "user", {"content": "x"}, "k")
    assert a.created and b.created and a.item.id != b.item.id
    plain = [await store.enqueue_input("s1", "user", {"content": "x"}) for _ in range(2)]
    assert [p.idempotency_key for p in plain] == [None, None]
    assert len(await store.list_inputs("s1")) == 3


async def test_a_key_reused_for_another_input_is_refused_and_writes_nothing(store):
    await store.create_session("s1", "ada")
    kept = await store.enqueue_keyed("s1", "user", {"content": "one"}, "k")
    with pytest.raises(IdempotencyKeyReused, match=r"already names another input") as info:
        await store.enqueue_keyed("s1", "user", {"content": "two"}, "k")
    assert info.value.field == "idempotency_key" and info.value.code == "idempotency_key_reused"
    with pytest.raises(IdempotencyKeyReused):
        await store.enqueue_keyed("s1", "webhook", {"content": "one"}, "k")
    assert [i.payload for i in await store.list_inputs("s1")] == [{"content": "one"}]
    # The payload compares as data, not as text (PostgreSQL's jsonb reorders keys).
    nested = {"content": "n", "b": [1, {"z": None, "a": 2.5}], "a": "é"}
    await store.enqueue_keyed("s1", "user", nested, "n")
    assert not (
        await store.enqueue_keyed("s1", "user", dict(reversed(nested.items())), "n")
    ).created
    assert kept.created


@pytest.mark.parametrize(
    "key",
    ["", "a b", "tab\there", "line\nbreak", "caf\u00e9", "x" * 256, "\x00"],
)
async def test_a_malformed_key_is_refused_naming_the_field(store, key):
    await store.create_session("s1", "ada")
    with pytest.raises(InvalidArgument, match=r"^idempotency_key must be 1 to 255") as info:
        await store.enqueue_keyed("s1", "user", {"content": "x"}, key)
    assert info.value.field == "idempotency_key"
    with pytest.raises(InvalidArgument):
        await store.keyed_input("s1", key, source="user", payload={"content": "x"})
    assert await store.list_inputs("s1") == []


async def test_the_longest_key_and_every_visible_character_are_kept(store):
    await store.create_session("s1", "ada")
    longest = "k" * 255
    visible = "".join(chr(c) for c in range(0x21, 0x7F))
    for key in (longest, visible, "github:72d3162e-cc78-11e3-81ab-4c9367dc0958"):
        stored = await store.enqueue_keyed("s1", "user", {"content": key}, key)
        assert stored.created and stored.item.idempotency_key == key


async def test_a_key_for_no_session_is_not_found(store):
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.enqueue_keyed("nope", "user", {"content": "x"}, "k")


async def test_a_done_row_keeps_its_key_and_never_runs(store):
    await store.create_session("s1", "ada")
    folded = await store.enqueue_keyed(
        "s1", "user", {"content": "x"}, "k", state="done", detail={"injected_into": 7}
    )
    assert (folded.item.state, folded.item.detail) == ("done", {"injected_into": 7})
    assert await store.claim_next_input("s1") is None
    assert await store.sessions_with_queued_inputs() == []
    again = await store.enqueue_keyed("s1", "user", {"content": "x"}, "k")
    assert again == Enqueued(item=folded.item, created=False)
    with pytest.raises(ValueError, match="queued or done"):
        await store.enqueue_keyed("s1", "user", {"content": "x"}, "k2", state="running")


async def test_keyed_input_reads_without_writing(store):
    await store.create_session("s1", "ada")
    assert await store.keyed_input("s1", "k", source="user", payload={"content": "x"}) is None
    stored = (await store.enqueue_keyed("s1", "user", {"content": "x"}, "k")).item
    assert await store.keyed_input("s1", "k", source="user", payload={"content": "x"}) == stored
    with pytest.raises(IdempotencyKeyReused):
        await store.keyed_input("s1", "k", source="user", payload={"content": "y"})
    assert await store.keyed_input("s2", "k", source="user", payload={"content": "x"}) is None


async def test_a_hundred_concurrent_duplicates_store_one_row(store):
    await store.create_session("s1", "ada")
    answers: list[Enqueued] = []

    async def send() -> None:
        answers.append(await store.enqueue_keyed("s1", "webhook", {"content": "ci"}, "gh:d1"))

    async with trio.open_nursery() as nursery:
        for _ in range(100):
            nursery.start_soon(send)
    assert len(answers) == 100
    assert sum(a.created for a in answers) == 1
    assert {a.item.id for a in answers} == {answers[0].item.id}
    assert len(await store.list_inputs("s1")) == 1


async def test_the_dedupe_survives_a_restart(backend, clock):
    async with backend.open(clock) as store:
        await store.create_session("s1", "ada")
        first = await store.enqueue_keyed("s1", "user", {"content": "hi"}, "client:m1")
    async with backend.open(clock) as store:
        again = await store.enqueue_keyed("s1", "user", {"content": "hi"}, "client:m1")
        assert again == Enqueued(item=first.item, created=False)
        assert len(await store.list_inputs("s1")) == 1


async def test_the_unique_index_itself_refuses_a_second_row(backend, clock):
    """Not only the front: a second row with the same session and key cannot be written at
    all, whoever writes it (another node's code, a hand-written statement)."""
    async with backend.open(clock) as store:
        await store.create_session("s1", "ada")
        await store.enqueue_keyed("s1", "user", {"content": "hi"}, "k")
    mark = "?1" if backend.kind == "sqlite" else "$1"
    insert = (
        "INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at,"
        f" idempotency_key) VALUES ('s1', 'user', '{{}}', 'queued', {mark}, {mark}, 'k')"
    )
    when = "2030-01-01T09:00:00.000000Z" if backend.kind == "sqlite" else T0
    with pytest.raises(BaseException) as info:  # asyncpg's error comes in an ExceptionGroup
        await backend.sql(insert, when)
    assert "unique" in repr(info.value).lower()
    assert await backend.count("inbox") == 1


async def test_a_version_3_database_gets_the_keys_and_keeps_its_rows(backend, clock):
    async with backend.open(clock) as store:
        await store.create_session("s1", "ada")
        old = await store.enqueue_input("s1", "user", {"content": "before"})
    # Back to version 3, as the previous release left it ...
    await backend.sql("DROP INDEX inbox_idempotency_idx")
    await backend.sql("ALTER TABLE inbox DROP COLUMN idempotency_key")
    await backend.sql("DELETE FROM schema_migrations WHERE version = 4")
    # ... and the next start-up adds the column and the index.
    async with backend.open(clock) as store:
        assert (await store.list_inputs("s1")) == [old]
        assert old.idempotency_key is None
        first = await store.enqueue_keyed("s1", "user", {"content": "after"}, "k")
        assert not (await store.enqueue_keyed("s1", "user", {"content": "after"}, "k")).created
        assert first.item.id > old.id


async def test_deleting_the_session_frees_its_keys(store):
    await store.create_session("s1", "ada")
    first = await store.enqueue_keyed("s1", "user", {"content": "x"}, "k")
    await store.delete_session("s1")
    await store.create_session("s1", "ada")
    second = await store.enqueue_keyed("s1", "user", {"content": "x"}, "k")
    assert second.created and second.item.id != first.item.id
