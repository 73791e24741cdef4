"""The database itself refuses a second pending recall in a session (scheduling's step 1, once
the kernel's step 2).

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
from turnstile.actors.scheduling.store import JobStore
from turnstile.runtime.errors import StoreError
from turnstile.runtime.store import SCHEMA_VERSION

INDEX = "jobs_one_pending_recall_idx"


async def recall(jobs, id: str, session_id: str = "s", state: str = "active"):
    return await jobs.create_job(
        id,
        kind="recall",
        spec={},
        session_id=session_id,
        next_fire_at=T0 if state in ("active", "paused") else None,
        state=state,
    )


async def raw_error(jobs_backend, sql: str) -> str:
    """The database's own error for ``sql`` (raw driver errors may come in a group)."""
    try:
        await jobs_backend.sql(sql)
    except Exception as exc:  # whatever the driver raised, unwrapped
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        return str(exc)
    raise AssertionError(f"the database accepted {sql!r}")


async def test_a_second_pending_recall_is_refused_by_the_database(jobs, jobs_store, jobs_backend):
    await jobs_store.create_session("s", "ada")
    await recall(jobs, "r1")
    with pytest.raises(StoreError):
        await recall(jobs, "r2")
    with pytest.raises(StoreError):
        await recall(jobs, "r3", state="paused")  # paused is pending too
    assert [j.id for j in await jobs.list_jobs(session_id="s")] == ["r1"]
    # Behind the store's back: the index, not the code, is what refuses.
    insert = (
        "INSERT INTO jobs (id, session_id, kind, spec, state, created_at, updated_at)"
        " VALUES ('raw', 's', 'recall', '{}', 'active', '2030-01-01T09:00:00.000000Z',"
        " '2030-01-01T09:00:00.000000Z')"
    )
    if jobs_backend.kind == "postgres":
        insert = insert.replace("'{}'", "'{}'::jsonb").replace(".000000Z'", "+00'")
    assert "unique" in (await raw_error(jobs_backend, insert)).lower()
    assert await jobs_backend.count("jobs") == 1


async def test_the_constraint_is_per_session_per_kind_and_only_while_pending(jobs, jobs_store):
    await jobs_store.create_session("s", "ada")
    await jobs_store.create_session("t", "bob")
    await recall(jobs, "r1")
    await recall(jobs, "other-session", session_id="t")  # another session: its own recall
    for kind in ("once", "interval", "cron"):  # other kinds of job are not limited
        await jobs.create_job(f"{kind}-1", kind=kind, spec={}, session_id="s", next_fire_at=T0)
        await jobs.create_job(f"{kind}-2", kind=kind, spec={}, session_id="s", next_fire_at=T0)
    # Finished recalls do not count, however many there are.
    await recall(jobs, "old-1", state="completed")
    await recall(jobs, "old-2", state="cancelled")
    await jobs.update_job("r1", state="completed", next_fire_at=None)
    await recall(jobs, "r2")  # the slot is free again
    # Reviving a finished recall while another is pending is refused as well.
    with pytest.raises(StoreError):
        await jobs.update_job("old-2", state="active", next_fire_at=T0)
    assert (await jobs.get_job("old-2")).state == "cancelled"
    pending = await jobs.list_jobs(session_id="s", states=["active", "paused"])
    assert sorted(j.id for j in pending if j.kind == "recall") == ["r2"]


async def test_a_store_from_before_the_index_gets_it_from_schedulings_set(jobs_backend, clock):
    # The index was kernel step 2 ("one_pending_recall", kept by name, empty now); scheduling's
    # step 1 makes it IF NOT EXISTS, so a store a release before it left gets it at start-up.
    async with jobs_backend.open(clock) as store:
        assert [(m.set_name, m.version, m.name) for m in await store.migrations()][1:2] == [
            ("kernel", 2, "one_pending_recall")
        ]
    assert SCHEMA_VERSION >= 2
    # Roll the database back to kernel version 1, as a node of that release left it: the jobs
    # tables there (kernel step 1 made them then), the index and every later step not ...
    await jobs_backend.sql(f"DROP INDEX {INDEX}")
    await jobs_backend.sql("DROP TABLE kv")  # migration 3's table
    await jobs_backend.sql("DROP INDEX inbox_idempotency_idx")  # migration 4's index and column
    await jobs_backend.sql("ALTER TABLE inbox DROP COLUMN idempotency_key")
    await jobs_backend.sql("DROP TABLE nodes")  # migration 5's table and columns
    await jobs_backend.sql("ALTER TABLE inbox DROP COLUMN claimed_by")
    await jobs_backend.sql("ALTER TABLE inbox DROP COLUMN claimed_epoch")
    for column in ("lease_node", "lease_node_epoch", "lease_epoch"):  # migration 6's
        await jobs_backend.sql(f"ALTER TABLE sessions DROP COLUMN {column}")
    await jobs_backend.sql(
        "DELETE FROM schema_migrations WHERE set_name <> 'kernel' OR version >= 2"
    )
    # ... and the next start-up brings it back up to date, the index included.
    async with jobs_backend.open(clock) as store:
        assert [(m.set_name, m.version) for m in await store.migrations()] == [
            *(("kernel", v) for v in range(1, SCHEMA_VERSION + 1)),
            ("scheduling", 1),
        ]
        await store.create_session("s", "ada")
        await recall(JobStore(store), "r1")
        with pytest.raises(StoreError):
            await recall(JobStore(store), "r2")
