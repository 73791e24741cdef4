"""Migration 2: the database itself refuses a second pending recall in a session.

``jobs_one_pending_recall_idx`` is a unique partial index on ``jobs (session_id)`` for
``kind = 'recall' AND state IN ('active', 'paused')``. These tests go through the store and
behind its back (raw SQL), on SQLite and PostgreSQL alike.

What the store raises today on the violation (``scheduling/recall.py`` maps every one of them to a
``ConflictError`` naming the pending recall):

* SQLite, insert or update: ``StoreError("sqlite: UNIQUE constraint failed: jobs.session_id")``;
* PostgreSQL, insert: ``AlreadyExists("job 'b' already exists")`` (every unique violation on
  insert is read as a duplicate id);
* PostgreSQL, update: ``StoreError('postgres: duplicate key value violates unique constraint
  "jobs_one_pending_recall_idx" ...')``.
"""

from __future__ import annotations

import pytest

from tests.runtime.store._support import T0
from turnstile.runtime.errors import StoreError
from turnstile.runtime.store import SCHEMA_VERSION

INDEX = "jobs_one_pending_recall_idx"


async def recall(store, id: str, session_id: str = "s", state: str = "active"):
    return await store.create_job(
        id,
        kind="recall",
        spec={},
        session_id=session_id,
        next_fire_at=T0 if state in ("active", "paused") else None,
        state=state,
    )


async def raw_error(backend, sql: str) -> str:
    """The database's own error for ``sql`` (raw driver errors may come in a group)."""
    try:
        await backend.sql(sql)
    except Exception as exc:  # whatever the driver raised, unwrapped
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        return str(exc)
    raise AssertionError(f"the database accepted {sql!r}")


async def test_a_second_pending_recall_is_refused_by_the_database(store, backend):
    await store.create_session("s", "ada")
    await recall(store, "r1")
    with pytest.raises(StoreError):
        await recall(store, "r2")
    with pytest.raises(StoreError):
        await recall(store, "r3", state="paused")  # paused is pending too
    assert [j.id for j in await store.list_jobs(session_id="s")] == ["r1"]
    # Behind the store's back: the index, not the code, is what refuses.
    insert = (
        "INSERT INTO jobs (id, session_id, kind, spec, state, created_at, updated_at)"
        " VALUES ('raw', 's', 'recall', '{}', 'active', '2030-01-01T09:00:00.000000Z',"
        " '2030-01-01T09:00:00.000000Z')"
    )
    if backend.kind == "postgres":
        insert = insert.replace("'{}'", "'{}'::jsonb").replace(".000000Z'", "+00'")
    assert "unique" in (await raw_error(backend, insert)).lower()
    assert await backend.count("jobs") == 1


async def test_the_constraint_is_per_session_per_kind_and_only_while_pending(store):
    await store.create_session("s", "ada")
    await store.create_session("t", "bob")
    await recall(store, "r1")
    await recall(store, "other-session", session_id="t")  # another session: its own recall
    for kind in ("once", "interval", "cron"):  # other kinds of job are not limited
        await store.create_job(f"{kind}-1", kind=kind, spec={}, session_id="s", next_fire_at=T0)
        await store.create_job(f"{kind}-2", kind=kind, spec={}, session_id="s", next_fire_at=T0)
    # Finished recalls do not count, however many there are.
    await recall(store, "old-1", state="completed")
    await recall(store, "old-2", state="cancelled")
    await store.update_job("r1", state="completed", next_fire_at=None)
    await recall(store, "r2")  # the slot is free again
    # Reviving a finished recall while another is pending is refused as well.
    with pytest.raises(StoreError):
        await store.update_job("old-2", state="active", next_fire_at=T0)
    assert (await store.get_job("old-2")).state == "cancelled"
    pending = await store.list_jobs(session_id="s", states=["active", "paused"])
    assert sorted(j.id for j in pending if j.kind == "recall") == ["r2"]


async def test_migration_2_is_recorded_and_applied_to_a_version_1_database(backend, clock):
    async with backend.open(clock) as store:
        assert [(m.version, m.name) for m in await store.migrations()][1:2] == [
            (2, "one_pending_recall")
        ]
    assert SCHEMA_VERSION >= 2
    # Roll the database back to version 1, as a node of the previous release left it ...
    await backend.sql(f"DROP INDEX {INDEX}")
    await backend.sql("DROP TABLE kv")  # migration 3's table
    await backend.sql("DROP INDEX inbox_idempotency_idx")  # migration 4's index and column
    await backend.sql("ALTER TABLE inbox DROP COLUMN idempotency_key")
    await backend.sql("DROP TABLE nodes")  # migration 5's table and columns
    await backend.sql("ALTER TABLE inbox DROP COLUMN claimed_by")
    await backend.sql("ALTER TABLE inbox DROP COLUMN claimed_epoch")
    for column in ("lease_node", "lease_node_epoch", "lease_epoch"):  # migration 6's
        await backend.sql(f"ALTER TABLE sessions DROP COLUMN {column}")
    await backend.sql("DELETE FROM schema_migrations WHERE version >= 2")
    # ... and the next start-up brings it back up to date.
    async with backend.open(clock) as store:
        assert [m.version for m in await store.migrations()] == list(range(1, SCHEMA_VERSION + 1))
        await store.create_session("s", "ada")
        await recall(store, "r1")
        with pytest.raises(StoreError):
            await recall(store, "r2")
