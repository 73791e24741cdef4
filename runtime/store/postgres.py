"""The PostgreSQL backend, on asyncpg.

asyncpg is an asyncio library; it runs here on a trio-asyncio loop. Every public method is
trio-flavoured: it wraps an asyncio coroutine with ``trio_asyncio.aio_as_trio(..., loop=...)``
bound to the store's own loop reference, so it may be called from any trio task (even one
started before the loop was opened). :func:`open_postgres_store` uses the trio-asyncio loop of
the calling context when there is one, and otherwise opens one for the lifetime of the store.

Concurrency rests on PostgreSQL itself:

* event seqs: ``UPDATE sessions SET last_seq = last_seq + n ... RETURNING last_seq`` takes the
  session row lock, so concurrent appenders (any number of processes) serialise per session
  and seqs stay gap-free;
* ``claim_next_input``: ``FOR UPDATE SKIP LOCKED`` - concurrent claimers never share an item;
* ``fire_job``: a conditional ``UPDATE`` (the compare-and-set) whose row lock makes a second
  firer re-check the condition after the first commits, and lose.

Migrations run at start-up in one transaction under ``pg_advisory_xact_lock`` keyed by the
current schema, so concurrent start-ups apply them once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import trio
import trio_asyncio
from msgspec import UNSET, UnsetType

from turnstile.runtime.clock import Clock, SystemClock
from turnstile.runtime.errors import AlreadyExists, ConflictError, MigrationError, StoreError
from turnstile.runtime.store import _util as u
from turnstile.runtime.store.migrations import POSTGRES_BOOTSTRAP, POSTGRES_MIGRATIONS, pending
from turnstile.runtime.store.records import (
    EventRecord,
    FireResult,
    InboxItem,
    Job,
    JobRun,
    MigrationRecord,
    Session,
)

__all__ = ["PostgresStore", "open_postgres_store"]

T = TypeVar("T")
Conn = asyncpg.Connection

_CLOSE_TIMEOUT = 10.0

# -- row conversion ---------------------------------------------------------------------------


def _session(row: asyncpg.Record) -> Session:
    return Session(
        id=row["id"],
        owner=row["owner"],
        metadata=u.decode_json(row["metadata"]),
        policy=row["policy"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        last_seq=row["last_seq"],
    )


def _input(row: asyncpg.Record) -> InboxItem:
    return InboxItem(
        id=row["id"],
        session_id=row["session_id"],
        source=row["source"],
        payload=u.decode_json(row["payload"]),
        state=row["state"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        detail=u.decode_optional_json(row["detail"]),
    )


def _event(row: asyncpg.Record) -> EventRecord:
    return EventRecord(
        session_id=row["session_id"],
        seq=row["seq"],
        type=row["type"],
        payload=u.decode_json(row["payload"]),
        ts=row["ts"],
    )


def _job(row: asyncpg.Record) -> Job:
    return Job(
        id=row["id"],
        session_id=row["session_id"],
        kind=row["kind"],
        spec=u.decode_json(row["spec"]),
        state=row["state"],
        next_fire_at=row["next_fire_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        run_count=row["run_count"],
    )


def _run(row: asyncpg.Record) -> JobRun:
    return JobRun(
        id=row["id"],
        job_id=row["job_id"],
        scheduled_for=row["scheduled_for"],
        state=row["state"],
        input_id=row["input_id"],
        detail=u.decode_optional_json(row["detail"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


# -- operations (asyncio-flavoured, given a pooled connection) ---------------------------------


async def _require_session(conn: Conn, session_id: str) -> None:
    if await conn.fetchval("SELECT 1 FROM sessions WHERE id = $1", session_id) is None:
        raise u.no_session(session_id)


async def _require_job(conn: Conn, job_id: str) -> None:
    if await conn.fetchval("SELECT 1 FROM jobs WHERE id = $1", job_id) is None:
        raise u.no_job(job_id)


_INSERT_INPUT = (
    "INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at)"
    " VALUES ($1, $2, $3::jsonb, 'queued', $4, $4) RETURNING *"
)


async def _op_migrate(conn: Conn, now: datetime) -> None:
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock("
            "hashtext('turnstile.schema_migrations.' || coalesce(current_schema(), '')))"
        )
        await conn.execute(POSTGRES_BOOTSTRAP)
        applied = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]
        for m in pending(applied, POSTGRES_MIGRATIONS):
            for stmt in m.statements:
                await conn.execute(stmt)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
                m.version,
                m.name,
                now,
            )


async def _op_ping(conn: Conn) -> None:
    await conn.fetchval("SELECT 1")


async def _op_migrations(conn: Conn) -> list[MigrationRecord]:
    rows = await conn.fetch("SELECT * FROM schema_migrations ORDER BY version")
    return [
        MigrationRecord(version=r["version"], name=r["name"], applied_at=r["applied_at"])
        for r in rows
    ]


async def _op_create_session(
    conn: Conn, id: str, owner: str, metadata: str, policy: str, now: datetime
) -> Session:
    try:
        row = await conn.fetchrow(
            "INSERT INTO sessions (id, owner, metadata, policy, created_at, updated_at)"
            " VALUES ($1, $2, $3::jsonb, $4, $5, $5) RETURNING *",
            id,
            owner,
            metadata,
            policy,
            now,
        )
    except asyncpg.UniqueViolationError:
        raise AlreadyExists(f"session {id!r} already exists") from None
    return _session(row)


async def _op_get_session(conn: Conn, id: str) -> Session:
    row = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", id)
    if row is None:
        raise u.no_session(id)
    return _session(row)


async def _op_list_sessions(
    conn: Conn, owner: str | None, limit: int, after_id: str | None
) -> list[Session]:
    rows = await conn.fetch(
        "SELECT * FROM sessions WHERE ($1::text IS NULL OR owner = $1)"
        " AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
        owner,
        after_id,
        limit,
    )
    return [_session(r) for r in rows]


async def _op_update_session(conn: Conn, id: str, sets: dict[str, Any], now: datetime) -> Session:
    casts = {"metadata": "::jsonb"}
    cols = ", ".join(f"{c} = ${i}{casts.get(c, '')}" for i, c in enumerate(sets, start=3))
    row = await conn.fetchrow(
        f"UPDATE sessions SET {cols}, updated_at = $2 WHERE id = $1 RETURNING *",
        id,
        now,
        *sets.values(),
    )
    if row is None:
        raise u.no_session(id)
    return _session(row)


async def _op_delete_session(conn: Conn, id: str) -> None:
    if await conn.fetchval("DELETE FROM sessions WHERE id = $1 RETURNING id", id) is None:
        raise u.no_session(id)


async def _op_enqueue_input(
    conn: Conn, session_id: str, source: str, payload: str, now: datetime
) -> InboxItem:
    try:
        row = await conn.fetchrow(_INSERT_INPUT, session_id, source, payload, now)
    except asyncpg.ForeignKeyViolationError:
        raise u.no_session(session_id) from None
    return _input(row)


async def _op_claim_next_input(conn: Conn, session_id: str, now: datetime) -> InboxItem | None:
    row = await conn.fetchrow(
        "UPDATE inbox SET state = 'running', updated_at = $2"
        " WHERE id = (SELECT id FROM inbox WHERE session_id = $1 AND state = 'queued'"
        " ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING *",
        session_id,
        now,
    )
    if row is None:
        await _require_session(conn, session_id)
        return None
    return _input(row)


async def _op_finish_input(
    conn: Conn, input_id: int, state: str, detail: str | None, now: datetime
) -> InboxItem:
    if u.finish_allowed("running", state):
        row = await conn.fetchrow(
            "UPDATE inbox SET state = $2, detail = $3::jsonb, updated_at = $4"
            " WHERE id = $1 AND state = 'running' RETURNING *",
            input_id,
            state,
            detail,
            now,
        )
        if row is not None:
            return _input(row)
    current = await conn.fetchval("SELECT state FROM inbox WHERE id = $1", input_id)
    if current is None:
        raise u.no_input(input_id)
    raise u.transition_error(input_id, current, state)


async def _op_list_inputs(conn: Conn, session_id: str, states: list[str] | None) -> list[InboxItem]:
    rows = await conn.fetch(
        "SELECT * FROM inbox WHERE session_id = $1 AND ($2::text[] IS NULL OR state = ANY($2))"
        " ORDER BY id",
        session_id,
        states,
    )
    if not rows:
        await _require_session(conn, session_id)
    return [_input(r) for r in rows]


async def _op_interrupt_running(conn: Conn, now: datetime) -> list[InboxItem]:
    rows = await conn.fetch(
        "UPDATE inbox SET state = 'interrupted', updated_at = $1 WHERE state = 'running'"
        " RETURNING *",
        now,
    )
    return sorted((_input(r) for r in rows), key=lambda item: item.id)


async def _op_sessions_with_queued_inputs(conn: Conn) -> list[str]:
    rows = await conn.fetch(
        "SELECT DISTINCT session_id FROM inbox WHERE state = 'queued' ORDER BY session_id"
    )
    return [r[0] for r in rows]


async def _op_append_events(
    conn: Conn, session_id: str, events: list[tuple[str, str]], now: datetime
) -> list[EventRecord]:
    async with conn.transaction():
        last = await conn.fetchval(
            "UPDATE sessions SET last_seq = last_seq + $2, updated_at = $3 WHERE id = $1"
            " RETURNING last_seq",
            session_id,
            len(events),
            now,
        )
        if last is None:
            raise u.no_session(session_id)
        seqs = list(range(last - len(events) + 1, last + 1))
        await conn.execute(
            "INSERT INTO events (session_id, seq, type, payload, ts)"
            " SELECT $1, s, t, p::jsonb, $5"
            " FROM unnest($2::bigint[], $3::text[], $4::text[]) AS x(s, t, p)",
            session_id,
            seqs,
            [t for t, _ in events],
            [p for _, p in events],
            now,
        )
    return [
        EventRecord(session_id=session_id, seq=seq, type=t, payload=u.decode_json(p), ts=now)
        for seq, (t, p) in zip(seqs, events, strict=True)
    ]


async def _op_read_events(
    conn: Conn, session_id: str, after_seq: int, limit: int
) -> list[EventRecord]:
    rows = await conn.fetch(
        "SELECT * FROM events WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        session_id,
        after_seq,
        limit,
    )
    if not rows:
        await _require_session(conn, session_id)
    return [_event(r) for r in rows]


async def _op_last_seq(conn: Conn, session_id: str) -> int:
    last = await conn.fetchval("SELECT last_seq FROM sessions WHERE id = $1", session_id)
    if last is None:
        raise u.no_session(session_id)
    return last


async def _op_create_job(
    conn: Conn,
    id: str,
    kind: str,
    spec: str,
    session_id: str | None,
    next_fire_at: datetime | None,
    state: str,
    now: datetime,
) -> Job:
    try:
        row = await conn.fetchrow(
            "INSERT INTO jobs (id, session_id, kind, spec, state, next_fire_at, created_at,"
            " updated_at) VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $7) RETURNING *",
            id,
            session_id,
            kind,
            spec,
            state,
            next_fire_at,
            now,
        )
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == "jobs_pkey":
            raise AlreadyExists(f"job {id!r} already exists") from None
        raise ConflictError(f"job {id!r} conflicts with an existing job: {exc}") from None
    except asyncpg.ForeignKeyViolationError:
        raise u.no_session(session_id or "") from None
    return _job(row)


async def _op_get_job(conn: Conn, id: str) -> Job:
    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", id)
    if row is None:
        raise u.no_job(id)
    return _job(row)


async def _op_list_jobs(conn: Conn, session_id: str | None, states: list[str] | None) -> list[Job]:
    rows = await conn.fetch(
        "SELECT * FROM jobs WHERE ($1::text IS NULL OR session_id = $1)"
        " AND ($2::text[] IS NULL OR state = ANY($2)) ORDER BY created_at, id",
        session_id,
        states,
    )
    return [_job(r) for r in rows]


async def _op_update_job(conn: Conn, id: str, sets: dict[str, Any], now: datetime) -> Job:
    casts = {"spec": "::jsonb", "next_fire_at": "::timestamptz"}
    cols = ", ".join(f"{c} = ${i}{casts.get(c, '')}" for i, c in enumerate(sets, start=3))
    row = await conn.fetchrow(
        f"UPDATE jobs SET {cols}, updated_at = $2 WHERE id = $1 RETURNING *",
        id,
        now,
        *sets.values(),
    )
    if row is None:
        raise u.no_job(id)
    return _job(row)


async def _op_delete_job(conn: Conn, id: str) -> None:
    if await conn.fetchval("DELETE FROM jobs WHERE id = $1 RETURNING id", id) is None:
        raise u.no_job(id)


async def _op_due_jobs(conn: Conn, before: datetime, limit: int) -> list[Job]:
    rows = await conn.fetch(
        "SELECT * FROM jobs WHERE state = 'active' AND next_fire_at <= $1"
        " ORDER BY next_fire_at, id LIMIT $2",
        before,
        limit,
    )
    return [_job(r) for r in rows]


async def _op_list_runs(conn: Conn, job_id: str, limit: int) -> list[JobRun]:
    rows = await conn.fetch(
        "SELECT * FROM job_runs WHERE job_id = $1 ORDER BY id DESC LIMIT $2", job_id, limit
    )
    if not rows:
        await _require_job(conn, job_id)
    return [_run(r) for r in rows]


async def _op_get_run(conn: Conn, run_id: int) -> JobRun:
    row = await conn.fetchrow("SELECT * FROM job_runs WHERE id = $1", run_id)
    if row is None:
        raise u.no_run(run_id)
    return _run(row)


async def _op_update_run(
    conn: Conn, run_id: int, state: str, detail: str | None, now: datetime
) -> JobRun:
    row = await conn.fetchrow(
        "UPDATE job_runs SET state = $2, detail = coalesce($3::jsonb, detail), updated_at = $4"
        " WHERE id = $1 RETURNING *",
        run_id,
        state,
        detail,
        now,
    )
    if row is None:
        raise u.no_run(run_id)
    return _run(row)


async def _op_fire_job(
    conn: Conn,
    job_id: str,
    expected: datetime,
    new: datetime | None,
    run_state: str,
    input: tuple[str, str] | None,
    detail: str | None,
    now: datetime,
    counts: bool = True,
    extra_runs: list[tuple[datetime, str, str | None]] = (),
) -> FireResult | None:
    async with conn.transaction():
        row = await conn.fetchrow(
            "UPDATE jobs SET next_fire_at = $1::timestamptz,"
            " state = CASE WHEN $1::timestamptz IS NULL THEN 'completed' ELSE state END,"
            " run_count = run_count + $5, updated_at = $2"
            " WHERE id = $3 AND state = 'active' AND next_fire_at = $4 RETURNING *",
            new,
            now,
            job_id,
            expected,
            1 if counts else 0,
        )
        if row is None:
            await _require_job(conn, job_id)
            return None
        job = _job(row)
        item = None
        if input is not None:
            if job.session_id is None:
                raise ConflictError(f"job {job_id!r} has no session")
            item = _input(await conn.fetchrow(_INSERT_INPUT, job.session_id, *input, now))
        run = await conn.fetchrow(
            "INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail, created_at,"
            " updated_at) VALUES ($1, $2, $3, $4, $5::jsonb, $6, $6) RETURNING *",
            job_id,
            expected,
            run_state,
            item.id if item else None,
            detail,
            now,
        )
        if item is not None:  # the input names its run, so its turn finds it without a search
            item = _input(
                await conn.fetchrow(
                    "UPDATE inbox SET payload = payload || jsonb_build_object('run_id', $1::bigint)"
                    " WHERE id = $2 RETURNING *",
                    run["id"],
                    item.id,
                )
            )
        if extra_runs:
            await conn.executemany(
                "INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail,"
                " created_at, updated_at) VALUES ($1, $2, $3, NULL, $4::jsonb, $5, $5)",
                [(job_id, when, state, data, now) for when, state, data in extra_runs],
            )
    return FireResult(job=job, run=_run(run), input=item)


async def _op_kv_put(conn: Conn, namespace: str, rows, now: datetime) -> None:
    await conn.executemany(
        "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
        " VALUES ($1, $2, $3::jsonb, $4, $5) ON CONFLICT (namespace, key) DO UPDATE"
        " SET value = excluded.value, expires_at = excluded.expires_at,"
        " updated_at = excluded.updated_at",
        [(namespace, key, value, expires, now) for key, value, expires in rows],
    )


async def _op_kv_get(conn: Conn, namespace: str, key: str, now: datetime):
    value = await conn.fetchval(
        "SELECT value FROM kv WHERE namespace = $1 AND key = $2"
        " AND (expires_at IS NULL OR expires_at > $3)",
        namespace,
        key,
        now,
    )
    return None if value is None else u.decode_json(value)


async def _op_kv_delete(conn: Conn, namespace: str, keys: list[str]) -> int:
    return await conn.fetchval(
        "WITH gone AS (DELETE FROM kv WHERE namespace = $1 AND key = ANY($2::text[])"
        " RETURNING 1) SELECT count(*) FROM gone",
        namespace,
        keys,
    )


async def _op_kv_list(conn: Conn, namespace: str, after: str, limit: int, now: datetime):
    rows = await conn.fetch(
        "SELECT key, value FROM kv WHERE namespace = $1 AND key > $2"
        " AND (expires_at IS NULL OR expires_at > $3) ORDER BY key LIMIT $4",
        namespace,
        after,
        now,
        limit,
    )
    return [(r["key"], u.decode_json(r["value"])) for r in rows]


async def _op_kv_purge(conn: Conn, now: datetime) -> int:
    return await conn.fetchval(
        "WITH gone AS (DELETE FROM kv WHERE expires_at IS NOT NULL AND expires_at <= $1"
        " RETURNING 1) SELECT count(*) FROM gone",
        now,
    )


# -- the store --------------------------------------------------------------------------------


class PostgresStore:
    """The PostgreSQL backend of :class:`~runtime.store.base.Store`.

    Use :func:`runtime.store.open_store` (``postgresql://...``) rather than this class.

    Args:
        dsn: an asyncpg DSN; extra query parameters become server settings
            (``?search_path=myschema``).
        clock: stamps every row (default: the system clock).
        min_size, max_size: connection pool bounds.
    """

    backend = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock | None = None,
        min_size: int = 1,
        max_size: int = 10,
    ) -> None:
        self.dsn = dsn
        self.clock = clock if clock is not None else SystemClock()
        self._min_size = min_size
        self._max_size = max_size
        self._loop: trio_asyncio.TrioEventLoop | None = None
        self._pool: asyncpg.Pool | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<PostgresStore {self.dsn!r}>"

    # ---- lifecycle ----

    async def open(self, loop: trio_asyncio.TrioEventLoop) -> None:
        """Create the pool on ``loop`` and apply migrations."""
        self._loop = loop
        try:
            self._pool = await self._aio(asyncpg.create_pool)(
                self.dsn, min_size=self._min_size, max_size=self._max_size
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"postgres: cannot connect: {exc}") from exc
        try:
            await self._call(_op_migrate, self.clock.now())
        except MigrationError:
            await self.aclose()
            raise
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, StoreError):
                raise MigrationError(f"postgres: migration failed: {exc}") from exc
            raise

    async def aclose(self) -> None:
        """Close the pool (waiting for operations in flight, then terminating)."""
        if self._closed:
            return
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(_CLOSE_TIMEOUT) as scope:
                await self._aio(pool.close)()
            if scope.cancelled_caught:
                pool.terminate()

    # ---- plumbing ----

    def _aio(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        return trio_asyncio.aio_as_trio(fn, loop=self._loop)

    async def _call(self, op: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._pool is None:
            raise StoreError("store is closed")
        return await self._aio(self._with_conn)(self._pool, op, *args)

    @staticmethod
    async def _with_conn(pool: asyncpg.Pool, op: Callable[..., Awaitable[T]], *args: Any) -> T:
        """asyncio side: run ``op`` on a pooled connection, map driver errors to StoreError."""
        try:
            async with pool.acquire() as conn:
                return await op(conn, *args)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise StoreError(f"postgres: {exc}") from exc

    def _now(self) -> datetime:
        return self.clock.now()

    # ---- schema ----

    async def ping(self) -> None:
        await self._call(_op_ping)

    async def migrations(self) -> list[MigrationRecord]:
        return await self._call(_op_migrations)

    # ---- sessions ----

    async def create_session(
        self,
        id: str,
        owner: str,
        metadata: dict[str, Any] | None = None,
        policy: str = "enqueue",
    ) -> Session:
        u.check_text(id, "id")
        u.check_text(owner, "owner")
        u.check_text(policy, "policy")
        meta = u.encode_json({} if metadata is None else metadata, "metadata")
        return await self._call(_op_create_session, id, owner, meta, policy, self._now())

    async def get_session(self, id: str) -> Session:
        return await self._call(_op_get_session, id)

    async def list_sessions(
        self, owner: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Session]:
        u.check_limit(limit)
        return await self._call(_op_list_sessions, owner, limit, after_id)

    async def update_session(
        self,
        id: str,
        *,
        metadata: dict[str, Any] | UnsetType = UNSET,
        policy: str | UnsetType = UNSET,
    ) -> Session:
        sets: dict[str, Any] = {}
        if metadata is not UNSET:
            sets["metadata"] = u.encode_json(metadata, "metadata")  # type: ignore[arg-type]
        if policy is not UNSET:
            sets["policy"] = u.check_text(policy, "policy")
        if not sets:
            return await self.get_session(id)
        return await self._call(_op_update_session, id, sets, self._now())

    async def delete_session(self, id: str) -> None:
        await self._call(_op_delete_session, id)

    # ---- inbox ----

    async def enqueue_input(
        self, session_id: str, source: str, payload: dict[str, Any]
    ) -> InboxItem:
        u.check_text(session_id, "session_id")
        u.check_text(source, "source")
        data = u.encode_json(payload)
        return await self._call(_op_enqueue_input, session_id, source, data, self._now())

    async def claim_next_input(self, session_id: str) -> InboxItem | None:
        return await self._call(_op_claim_next_input, session_id, self._now())

    async def finish_input(
        self, input_id: int, state: str, detail: dict[str, Any] | None = None
    ) -> InboxItem:
        u.check_int(input_id, "input_id")
        u.check_input_state(state)
        data = u.encode_optional_json(detail)
        return await self._call(_op_finish_input, input_id, state, data, self._now())

    async def list_inputs(
        self, session_id: str, states: Sequence[str] | None = None
    ) -> list[InboxItem]:
        wanted = u.check_input_states(states)
        return await self._call(_op_list_inputs, session_id, wanted)

    async def interrupt_running(self) -> list[InboxItem]:
        return await self._call(_op_interrupt_running, self._now())

    async def sessions_with_queued_inputs(self) -> list[str]:
        return await self._call(_op_sessions_with_queued_inputs)

    # ---- events ----

    async def append_events(
        self, session_id: str, events: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[EventRecord]:
        encoded = u.check_events(events)
        if not encoded:
            await self.last_seq(session_id)  # still NotFound for an unknown session
            return []
        return await self._call(_op_append_events, session_id, encoded, self._now())

    async def read_events(
        self, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        u.check_int(after_seq, "after_seq")
        u.check_limit(limit)
        return await self._call(_op_read_events, session_id, after_seq, limit)

    async def last_seq(self, session_id: str) -> int:
        return await self._call(_op_last_seq, session_id)

    # ---- key-value ----

    async def kv_put(self, namespace, items) -> None:
        u.check_text(namespace, "namespace")
        rows = [
            (
                u.check_text(key, "key"),
                u.encode_json(value, "value"),
                None if expires is None else u.check_time(expires, "expires_at"),
            )
            for key, value, expires in items
        ]
        if rows:
            await self._call(_op_kv_put, namespace, rows, self._now())

    async def kv_get(self, namespace: str, key: str) -> dict[str, Any] | None:
        return await self._call(_op_kv_get, namespace, key, self._now())

    async def kv_delete(self, namespace: str, keys) -> int:
        return await self._call(_op_kv_delete, namespace, list(keys))

    async def kv_list(self, namespace: str, *, after_key: str | None = None, limit: int = 1000):
        return await self._call(_op_kv_list, namespace, after_key or "", limit, self._now())

    async def kv_purge_expired(self) -> int:
        return await self._call(_op_kv_purge, self._now())

    # ---- jobs ----

    async def create_job(
        self,
        id: str,
        *,
        kind: str,
        spec: dict[str, Any],
        session_id: str | None = None,
        next_fire_at: datetime | None = None,
        state: str = "active",
    ) -> Job:
        u.check_text(id, "id")
        u.check_text(kind, "kind")
        u.check_job_state(state)
        if session_id is not None:
            u.check_text(session_id, "session_id")
        data = u.encode_json(spec, "spec")
        nfa = None if next_fire_at is None else u.check_time(next_fire_at, "next_fire_at")
        return await self._call(_op_create_job, id, kind, data, session_id, nfa, state, self._now())

    async def get_job(self, id: str) -> Job:
        return await self._call(_op_get_job, id)

    async def list_jobs(
        self, session_id: str | None = None, states: Sequence[str] | None = None
    ) -> list[Job]:
        wanted = u.check_job_states(states)
        return await self._call(_op_list_jobs, session_id, wanted)

    async def update_job(
        self,
        id: str,
        *,
        kind: str | UnsetType = UNSET,
        spec: dict[str, Any] | UnsetType = UNSET,
        state: str | UnsetType = UNSET,
        next_fire_at: datetime | None | UnsetType = UNSET,
    ) -> Job:
        sets: dict[str, Any] = {}
        if kind is not UNSET:
            sets["kind"] = u.check_text(kind, "kind")
        if spec is not UNSET:
            sets["spec"] = u.encode_json(spec, "spec")  # type: ignore[arg-type]
        if state is not UNSET:
            sets["state"] = u.check_job_state(state)
        if next_fire_at is not UNSET:
            sets["next_fire_at"] = (
                None if next_fire_at is None else u.check_time(next_fire_at, "next_fire_at")
            )
        if not sets:
            return await self.get_job(id)
        return await self._call(_op_update_job, id, sets, self._now())

    async def delete_job(self, id: str) -> None:
        await self._call(_op_delete_job, id)

    async def due_jobs(self, before: datetime, limit: int = 100) -> list[Job]:
        b = u.check_time(before, "before")
        u.check_limit(limit)
        return await self._call(_op_due_jobs, b, limit)

    async def list_runs(self, job_id: str, limit: int = 100) -> list[JobRun]:
        u.check_limit(limit)
        return await self._call(_op_list_runs, job_id, limit)

    async def get_run(self, run_id: int) -> JobRun:
        u.check_int(run_id, "run_id")
        return await self._call(_op_get_run, run_id)

    async def update_run(
        self, run_id: int, state: str, detail: dict[str, Any] | None = None
    ) -> JobRun:
        u.check_int(run_id, "run_id")
        u.check_text(state, "state")
        data = u.encode_optional_json(detail)
        return await self._call(_op_update_run, run_id, state, data, self._now())

    async def fire_job(
        self,
        job_id: str,
        expected_next_fire_at: datetime,
        new_next_fire_at: datetime | None,
        run_state: str = "queued",
        input: tuple[str, dict[str, Any]] | None = None,
        detail: dict[str, Any] | None = None,
        counts: bool = True,
        extra_runs: Sequence[tuple[datetime, str, dict[str, Any] | None]] = (),
    ) -> FireResult | None:
        expected = u.check_time(expected_next_fire_at, "expected_next_fire_at")
        new = (
            None if new_next_fire_at is None else u.check_time(new_next_fire_at, "new_next_fire_at")
        )
        u.check_text(run_state, "run_state")
        inp = u.check_fire_input(input)
        data = u.encode_optional_json(detail)
        extra = [
            (u.check_time(when, "extra_runs"), state, u.encode_optional_json(more))
            for when, state, more in extra_runs
        ]
        return await self._call(
            _op_fire_job, job_id, expected, new, run_state, inp, data, self._now(), counts, extra
        )


@asynccontextmanager
async def open_postgres_store(
    dsn: str, *, clock: Clock | None = None, **pool_options: Any
) -> AsyncIterator[PostgresStore]:
    """Open a :class:`PostgresStore`, on the current trio-asyncio loop or a new one.

    When it opens its own loop, the loop's nursery would wrap every exception raised inside
    the ``async with`` block (the caller's included) in an ``ExceptionGroup``; a group holding
    a single exception is unwrapped so that callers see ``MigrationError``, ``NotFound``... as
    they would with SQLite.
    """
    try:
        async with AsyncExitStack() as stack:
            loop = trio_asyncio.current_loop.get()
            if loop is None or loop.is_closed():
                loop = await stack.enter_async_context(trio_asyncio.open_loop())
            store = PostgresStore(dsn, clock=clock, **pool_options)
            await store.open(loop)
            stack.push_async_callback(store.aclose)
            yield store
    except BaseExceptionGroup as group:
        leaf = _only_exception(group)
        if leaf is None:
            raise
        raise leaf from leaf.__cause__


def _only_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception in a (nested) group, or None when there are several."""
    while len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return None
