"""The PostgreSQL backend's operations (see :mod:`runtime.store.backend` for what each answers).

asyncio-flavoured: each is given a pooled asyncpg connection and runs on the store's asyncio
thread (:mod:`runtime.store.postgres`). Arguments arrive checked and encoded (JSON as text,
cast to jsonb here; times as aware datetimes); rows go back as ``asyncpg.Record``.

Concurrency rests on PostgreSQL itself:

* event seqs: ``UPDATE sessions SET last_seq = last_seq + n ... RETURNING last_seq`` takes the
  session row lock, so concurrent appenders (any number of processes) serialise per session
  and seqs stay gap-free;
* ``claim_next_input``: ``FOR UPDATE SKIP LOCKED`` - concurrent claimers never share an item;
* ``fire_job``: a conditional ``UPDATE`` (the compare-and-set) whose row lock makes a second
  firer re-check the condition after the first commits, and lose; the input and the run are
  written in the same statement (CTEs that read the ``UPDATE``'s row), so a lost race writes
  nothing.
* ``fire_jobs``: the same over arrays, many occurrences in one statement; rows are locked in
  job id order, so overlapping batches wait for each other instead of deadlocking.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from turnstile.runtime.errors import ConflictError
from turnstile.runtime.store import _util as u

Conn = asyncpg.Connection
Row = asyncpg.Record


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


# -- schema -----------------------------------------------------------------------------------


async def ping(conn: Conn) -> None:
    await conn.fetchval("SELECT 1")


async def migrations(conn: Conn) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM schema_migrations ORDER BY set_name <> 'kernel', set_name, version"
    )


# -- sessions ---------------------------------------------------------------------------------


async def create_session(
    conn: Conn, id: str, owner: str, metadata: str, policy: str, now: datetime
) -> Row | None:
    return await conn.fetchrow(
        "INSERT INTO sessions (id, owner, metadata, policy, created_at, updated_at)"
        " VALUES ($1, $2, $3::jsonb, $4, $5, $5) ON CONFLICT (id) DO NOTHING RETURNING *",
        id,
        owner,
        metadata,
        policy,
        now,
    )


async def get_session(conn: Conn, id: str) -> Row | None:
    return await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", id)


async def list_sessions(
    conn: Conn, owner: str | None, limit: int, after_id: str | None
) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM sessions WHERE ($1::text IS NULL OR owner = $1)"
        " AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
        owner,
        after_id,
        limit,
    )


_CASTS = {"metadata": "::jsonb", "spec": "::jsonb", "next_fire_at": "::timestamptz"}


async def _update(conn: Conn, table: str, id: str, sets: dict[str, Any], now: datetime):
    cols = ", ".join(f"{c} = ${i}{_CASTS.get(c, '')}" for i, c in enumerate(sets, start=3))
    sql = f"UPDATE {table} SET {cols}, updated_at = $2 WHERE id = $1 RETURNING *"
    return await conn.fetchrow(sql, id, now, *sets.values())


async def update_session(conn: Conn, id: str, sets: dict[str, Any], now: datetime) -> Row | None:
    return await _update(conn, "sessions", id, sets, now)


async def delete_session(conn: Conn, id: str) -> bool:
    return await conn.fetchval("DELETE FROM sessions WHERE id = $1 RETURNING id", id) is not None


# -- inbox ------------------------------------------------------------------------------------


async def enqueue_input(
    conn: Conn, session_id: str, source: str, payload: str, now: datetime
) -> Row | None:
    try:
        return await conn.fetchrow(_INSERT_INPUT, session_id, source, payload, now)
    except asyncpg.ForeignKeyViolationError:
        return None


async def enqueue_keyed(
    conn: Conn,
    session_id: str,
    source: str,
    payload: str,
    key: str,
    state: str,
    detail: str | None,
    now: datetime,
) -> tuple[Row, bool] | None:
    # Two statements, each its own snapshot (READ COMMITTED): a concurrent insert of the same
    # key makes the first wait for it and do nothing; the second then sees its committed row.
    try:
        row = await conn.fetchrow(
            "INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at,"
            " detail, idempotency_key) VALUES ($1, $2, $3::jsonb, $4, $5, $5, $6::jsonb, $7)"
            " ON CONFLICT DO NOTHING RETURNING *",
            session_id,
            source,
            payload,
            state,
            now,
            detail,
            key,
        )
    except asyncpg.ForeignKeyViolationError:
        return None
    if row is not None:
        return row, True
    return await keyed_input(conn, session_id, key), False


async def keyed_input(conn: Conn, session_id: str, key: str) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM inbox WHERE session_id = $1 AND idempotency_key = $2", session_id, key
    )


async def _fenced(conn: Conn, session_id: str, fence: int) -> None:
    """Raise ``Fenced`` when ``session_id``'s lease epoch is no longer ``fence`` (and
    ``NotFound`` when the session is gone): called after a fenced write matched nothing."""
    current = await conn.fetchval("SELECT lease_epoch FROM sessions WHERE id = $1", session_id)
    if current is None:
        raise u.no_session(session_id)
    if current != fence:
        raise u.fenced(session_id, fence, current)


# A fenced write locks the session's row in share mode while it checks the lease epoch: a
# concurrent acquisition (an UPDATE of that row) waits for the write's transaction, and a write
# that starts after an acquisition committed re-reads the row and finds the new epoch. So a
# write either commits before the lease moved (and the new holder sees it) or not at all.
async def claim_next_input(
    conn: Conn,
    session_id: str,
    now: datetime,
    node: str | None,
    epoch: int | None,
    fence: int | None = None,
) -> Row | None:
    lease, held = "", ""
    if fence is not None:
        lease = (
            "WITH lease AS (SELECT 1 FROM sessions WHERE id = $1 AND lease_epoch = $5 FOR SHARE) "
        )
        held = " AND EXISTS (SELECT 1 FROM lease)"
    row = await conn.fetchrow(
        f"{lease}UPDATE inbox SET state = 'running', updated_at = $2, claimed_by = $3,"
        " claimed_epoch = $4"
        " WHERE id = (SELECT id FROM inbox WHERE session_id = $1 AND state = 'queued'"
        f" ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED){held} RETURNING *",
        session_id,
        now,
        node,
        epoch,
        *(() if fence is None else (fence,)),
    )
    if row is None:
        if fence is not None:
            await _fenced(conn, session_id, fence)
        await _require_session(conn, session_id)
    return row


async def finish_input(
    conn: Conn,
    input_id: int,
    state: str,
    detail: str | None,
    now: datetime,
    fence: int | None = None,
) -> Row | None:
    return await _move_input(conn, input_id, "running", state, detail, now, fence)


async def fold_input(
    conn: Conn, input_id: int, detail: str | None, now: datetime, fence: int | None = None
) -> Row | None:
    return await _move_input(conn, input_id, "queued", "done", detail, now, fence)


async def _move_input(
    conn: Conn,
    input_id: int,
    was: str,
    state: str,
    detail: str | None,
    now: datetime,
    fence: int | None,
) -> Row | None:
    """Move an input from ``was`` to ``state`` in one statement (None unless it was ``was``);
    with ``fence``, only while the session's lease epoch is that (else ``Fenced``)."""
    lease, held = "", ""
    if fence is not None:
        lease = (
            "WITH lease AS (SELECT 1 FROM sessions s JOIN inbox i ON i.session_id = s.id"
            " WHERE i.id = $1 AND s.lease_epoch = $6 FOR SHARE OF s) "
        )
        held = " AND EXISTS (SELECT 1 FROM lease)"
    row = await conn.fetchrow(
        f"{lease}UPDATE inbox SET state = $2, detail = $3::jsonb, updated_at = $4"
        f" WHERE id = $1 AND state = $5{held} RETURNING *",
        input_id,
        state,
        detail,
        now,
        was,
        *(() if fence is None else (fence,)),
    )
    if row is None and fence is not None:
        session_id = await conn.fetchval("SELECT session_id FROM inbox WHERE id = $1", input_id)
        if session_id is not None:
            await _fenced(conn, session_id, fence)
    return row


async def requeue_input(conn: Conn, input_id: int, detail: str | None, now: datetime) -> Row | None:
    return await conn.fetchrow(
        "UPDATE inbox SET state = 'queued', detail = $2::jsonb, updated_at = $3"
        " WHERE id = $1 AND state = 'interrupted' RETURNING *",
        input_id,
        detail,
        now,
    )


async def input_state(conn: Conn, input_id: int) -> str | None:
    return await conn.fetchval("SELECT state FROM inbox WHERE id = $1", input_id)


async def list_inputs(conn: Conn, session_id: str, states: list[str] | None) -> list[Row]:
    rows = await conn.fetch(
        "SELECT * FROM inbox WHERE session_id = $1 AND ($2::text[] IS NULL OR state = ANY($2))"
        " ORDER BY id",
        session_id,
        states,
    )
    if not rows:
        await _require_session(conn, session_id)
    return rows


async def interrupt_running(conn: Conn, now: datetime) -> list[Row]:
    return await conn.fetch(
        "UPDATE inbox SET state = 'interrupted', updated_at = $1 WHERE state = 'running'"
        " RETURNING *",
        now,
    )


async def sessions_with_queued_inputs(
    conn: Conn, node: str | None = None, epoch: int | None = None
) -> list[Row]:
    if node is None:
        return await conn.fetch(
            "SELECT DISTINCT session_id FROM inbox WHERE state = 'queued' ORDER BY session_id"
        )
    return await conn.fetch(
        "SELECT DISTINCT session_id FROM inbox q WHERE state = 'queued' AND NOT EXISTS ("
        " SELECT 1 FROM inbox r JOIN nodes n ON n.id = r.claimed_by AND n.epoch = r.claimed_epoch"
        " WHERE r.session_id = q.session_id AND r.state = 'running' AND n.state <> 'stopped'"
        " AND NOT (r.claimed_by = $1 AND r.claimed_epoch = $2)) ORDER BY session_id",
        node,
        epoch,
    )


# -- nodes ------------------------------------------------------------------------------------
# Every lease decision is taken by the database clock (now() in the statement), never by the
# node's: the ``now`` and ``expires`` arguments the front computes from the store's clock are
# for SQLite, and unused here.

_LEASE = "now() + make_interval(secs => $3)"
_NODE_ROW = "*, state <> 'stopped' AND lease_expires_at > now() AS alive"


async def register_node(
    conn: Conn, id: str, address: str | None, lease: float, now: datetime, expires: datetime
) -> tuple[Row, Row | None]:
    async with conn.transaction():
        previous = await conn.fetchrow(
            f"SELECT {_NODE_ROW} FROM nodes WHERE id = $1 FOR UPDATE", id
        )
        row = await conn.fetchrow(
            "INSERT INTO nodes (id, epoch, state, address, started_at, heartbeat_at,"
            f" lease_expires_at) VALUES ($1, 1, 'running', $2, now(), now(), {_LEASE})"
            " ON CONFLICT (id) DO UPDATE SET epoch = nodes.epoch + 1, state = 'running',"
            " address = excluded.address, started_at = excluded.started_at,"
            " heartbeat_at = excluded.heartbeat_at, lease_expires_at = excluded.lease_expires_at"
            f" RETURNING {_NODE_ROW}",
            id,
            address,
            lease,
        )
    return row, previous


async def heartbeat_node(
    conn: Conn,
    id: str,
    epoch: int,
    lease: float,
    address: str | None,
    now: datetime,
    expires: datetime,
) -> Row | None:
    return await conn.fetchrow(
        f"UPDATE nodes SET heartbeat_at = now(), lease_expires_at = {_LEASE},"
        " address = coalesce($4, address)"
        f" WHERE id = $1 AND epoch = $2 AND state <> 'stopped' RETURNING {_NODE_ROW}",
        id,
        epoch,
        lease,
        address,
    )


async def drain_node(conn: Conn, id: str, epoch: int) -> bool:
    drained = await conn.fetchval(
        "UPDATE nodes SET state = 'draining' WHERE id = $1 AND epoch = $2 AND state = 'running'"
        " RETURNING 1",
        id,
        epoch,
    )
    return drained is not None


async def stop_node(conn: Conn, id: str, epoch: int, now: datetime) -> bool:
    stopped = await conn.fetchval(
        "UPDATE nodes SET state = 'stopped', heartbeat_at = now(),"
        " lease_expires_at = least(lease_expires_at, now())"
        " WHERE id = $1 AND epoch = $2 AND state <> 'stopped' RETURNING 1",
        id,
        epoch,
    )
    return stopped is not None


async def get_node(conn: Conn, id: str, now: datetime) -> Row | None:
    return await conn.fetchrow(f"SELECT {_NODE_ROW} FROM nodes WHERE id = $1", id)


async def list_nodes(conn: Conn, now: datetime) -> tuple[datetime, list[Row]]:
    async with conn.transaction():  # one transaction: one now() for the rows and the answer
        db_now = await conn.fetchval("SELECT now()")
        rows = await conn.fetch(f"SELECT {_NODE_ROW} FROM nodes ORDER BY id")
    return db_now, rows


_CUT_OFF_PG = (
    "state = 'running' AND CASE WHEN claimed_by IS NULL THEN $4::boolean"
    " ELSE NOT (claimed_by = $2 AND claimed_epoch = $3) AND NOT EXISTS ("
    " SELECT 1 FROM nodes n WHERE n.id = inbox.claimed_by"
    " AND n.epoch = inbox.claimed_epoch AND n.state <> 'stopped') END"
)


async def take_over_dead_nodes(
    conn: Conn, node: str, epoch: int, unclaimed: bool, now: datetime
) -> tuple[list[Row], list[Row], list[Row]]:
    # First the nodes whose lease expired become ``stopped`` (their heartbeat can no longer
    # renew: they stop serving); the row lock orders this against a concurrent heartbeat,
    # which either renewed first (then the lease is live again and the node is left alone)
    # or finds the row stopped. Then every running input whose claimer is not a current,
    # non-stopped epoch is interrupted: its turn was cut off.
    async with conn.transaction():
        dead = await conn.fetch(
            "UPDATE nodes SET state = 'stopped' WHERE state <> 'stopped'"
            " AND lease_expires_at <= now() AND id <> $1 RETURNING *, false AS alive",
            node,
        )
        # The sessions of the cut-off inputs are locked first (in id order, as an acquisition
        # locks its one session before its inputs), and the ones no live node holds are leased
        # to this node in the same transaction: no other node starts a turn of them before
        # this one has closed the cut-off turn and released them (``release_session``).
        await conn.execute(
            # ($1, the time, is not needed here; typed so that the statement prepares)
            "SELECT 1 FROM sessions WHERE $1::timestamptz IS NOT NULL AND id IN ("
            f"SELECT session_id FROM inbox WHERE {_CUT_OFF_PG}) ORDER BY id FOR UPDATE",
            now,
            node,
            epoch,
            unclaimed,
        )
        items = await conn.fetch(
            f"UPDATE inbox SET state = 'interrupted', updated_at = $1 WHERE {_CUT_OFF_PG}"
            " RETURNING *",
            now,
            node,
            epoch,
            unclaimed,
        )
        leases = await conn.fetch(
            "UPDATE sessions s SET lease_node = $1, lease_node_epoch = $2,"
            " lease_epoch = s.lease_epoch + 1 WHERE s.id = ANY($3::text[]) AND NOT EXISTS ("
            " SELECT 1 FROM nodes n WHERE n.id = s.lease_node AND n.epoch = s.lease_node_epoch"
            " AND n.state <> 'stopped' AND n.lease_expires_at > now())"
            " RETURNING s.id, s.lease_epoch",
            node,
            epoch,
            sorted({r["session_id"] for r in items}),
        )
    return dead, items, leases


async def acquire_session(
    conn: Conn, session_id: str, node: str, epoch: int, now: datetime
) -> tuple[Row | None, Row | None]:
    # The row lock orders acquisitions of one session, and fenced writes (which hold a share
    # lock on the same row) against them. The holder is live exactly as long as its node is:
    # that node's current epoch, not stopped, its lease unexpired by the database clock.
    async with conn.transaction():
        # lock first, then look at the holder's node in a statement of its own: a join in the
        # locking statement would be re-checked against the node row it read before the wait
        locked = await conn.fetchval("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", session_id)
        if locked is None:
            return None, None, []
        current = await conn.fetchrow(
            "SELECT s.lease_node, s.lease_node_epoch, s.lease_epoch, n.address,"
            " coalesce(n.state <> 'stopped' AND n.lease_expires_at > now(), false) AS live"
            " FROM sessions s LEFT JOIN nodes n"
            " ON n.id = s.lease_node AND n.epoch = s.lease_node_epoch"
            " WHERE s.id = $1",
            session_id,
        )
        if current is None:
            return None, None
        if current["live"] and not (
            current["lease_node"] == node and current["lease_node_epoch"] == epoch
        ):
            return None, current, []
        row = await conn.fetchrow(
            "UPDATE sessions SET lease_node = $2, lease_node_epoch = $3,"
            " lease_epoch = lease_epoch + 1 WHERE id = $1 RETURNING lease_epoch",
            session_id,
            node,
            epoch,
        )
        # the session's turns cut off on a node that is not live: the new holder closes them
        # before it starts one (its claim and their closure cannot interleave with a sweep's)
        cut_off = await conn.fetch(
            "UPDATE inbox SET state = 'interrupted', updated_at = $4 WHERE session_id = $1"
            " AND state = 'running' AND claimed_by IS NOT NULL"
            " AND NOT (claimed_by = $2 AND claimed_epoch = $3) AND NOT EXISTS ("
            " SELECT 1 FROM nodes n WHERE n.id = inbox.claimed_by"
            " AND n.epoch = inbox.claimed_epoch AND n.state <> 'stopped'"
            " AND n.lease_expires_at > now()) RETURNING *",
            session_id,
            node,
            epoch,
            now,
        )
    return row, current, cut_off


async def release_session(conn: Conn, session_id: str, fence: int) -> bool:
    released = await conn.fetchval(
        "UPDATE sessions SET lease_node = NULL, lease_node_epoch = NULL"
        " WHERE id = $1 AND lease_epoch = $2 AND lease_node IS NOT NULL RETURNING 1",
        session_id,
        fence,
    )
    return released is not None


async def notify(conn: Conn, channel: str, payload: str) -> None:
    await conn.execute("SELECT pg_notify($1, $2)", channel, payload)


# -- events -----------------------------------------------------------------------------------


# One statement, one round trip (it was BEGIN, UPDATE, INSERT, COMMIT: four): the UPDATE of
# the session's row takes its lock, allocates the seqs and checks the fence; the INSERT gets
# the new last_seq from its RETURNING, so it writes nothing when the UPDATE matched nothing.
# A statement is atomic, as the transaction was.
_APPEND_EVENTS = (
    "WITH s AS (UPDATE sessions SET last_seq = last_seq + $2, updated_at = $3 WHERE id = $1{held}"
    " RETURNING last_seq), ins AS (INSERT INTO events (session_id, seq, type, payload, ts)"
    " SELECT $1, s.last_seq - $2 + x.n, x.t, x.p::jsonb, $3"
    " FROM s, unnest($4::text[], $5::text[]) WITH ORDINALITY AS x(t, p, n))"
    " SELECT last_seq FROM s"
)
_APPEND_EVENTS_FREE = _APPEND_EVENTS.format(held="")
_APPEND_EVENTS_FENCED = _APPEND_EVENTS.format(held=" AND lease_epoch = $6")


async def append_events(
    conn: Conn,
    session_id: str,
    events: list[tuple[str, str]],
    now: datetime,
    fence: int | None = None,
) -> int | None:
    # the UPDATE locks the session's row and re-reads it after a concurrent acquisition:
    # the seq allocation and the fence check are one step
    last = await conn.fetchval(
        _APPEND_EVENTS_FREE if fence is None else _APPEND_EVENTS_FENCED,
        session_id,
        len(events),
        now,
        [t for t, _ in events],
        [p for _, p in events],
        *(() if fence is None else (fence,)),
    )
    if last is None and fence is not None:
        await _fenced(conn, session_id, fence)
    return last


async def read_events(conn: Conn, session_id: str, after_seq: int, limit: int) -> list[Row]:
    rows = await conn.fetch(
        "SELECT * FROM events WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        session_id,
        after_seq,
        limit,
    )
    if not rows:
        await _require_session(conn, session_id)
    return rows


async def read_events_back(
    conn: Conn, session_id: str, types: list[str], before_seq: int | None, limit: int
) -> list[Row]:
    # the primary key (session_id, seq) read backwards from before_seq: a long log's end only
    rows = await conn.fetch(
        "SELECT * FROM events WHERE session_id = $1 AND seq < $2 AND type = ANY($3::text[])"
        " ORDER BY seq DESC LIMIT $4",
        session_id,
        (1 << 62) if before_seq is None else before_seq,
        types,
        limit,
    )
    if not rows:
        await _require_session(conn, session_id)
    return rows


async def last_seq(conn: Conn, session_id: str) -> int | None:
    return await conn.fetchval("SELECT last_seq FROM sessions WHERE id = $1", session_id)


# -- jobs -------------------------------------------------------------------------------------


async def create_job(
    conn: Conn,
    id: str,
    kind: str,
    spec: str,
    session_id: str | None,
    next_fire_at: datetime | None,
    state: str,
    now: datetime,
) -> Row | None:
    try:
        return await conn.fetchrow(
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
            return None
        raise ConflictError(f"job {id!r} conflicts with an existing job: {exc}") from None
    except asyncpg.ForeignKeyViolationError:
        raise u.no_session(session_id or "") from None


async def get_job(conn: Conn, id: str) -> Row | None:
    return await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", id)


async def list_jobs(conn: Conn, session_id: str | None, states: list[str] | None) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM jobs WHERE ($1::text IS NULL OR session_id = $1)"
        " AND ($2::text[] IS NULL OR state = ANY($2)) ORDER BY created_at, id",
        session_id,
        states,
    )


async def update_job(conn: Conn, id: str, sets: dict[str, Any], now: datetime) -> Row | None:
    return await _update(conn, "jobs", id, sets, now)


async def delete_job(conn: Conn, id: str) -> bool:
    return await conn.fetchval("DELETE FROM jobs WHERE id = $1 RETURNING id", id) is not None


async def due_jobs(conn: Conn, before: datetime, limit: int) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM jobs WHERE state = 'active' AND next_fire_at <= $1"
        " ORDER BY next_fire_at, id LIMIT $2",
        before,
        limit,
    )


async def list_runs(conn: Conn, job_id: str, limit: int) -> list[Row]:
    rows = await conn.fetch(
        "SELECT * FROM job_runs WHERE job_id = $1 ORDER BY id DESC LIMIT $2", job_id, limit
    )
    if not rows:
        await _require_job(conn, job_id)
    return rows


async def get_run(conn: Conn, run_id: int) -> Row | None:
    return await conn.fetchrow("SELECT * FROM job_runs WHERE id = $1", run_id)


async def update_run(
    conn: Conn, run_id: int, state: str, detail: str | None, now: datetime
) -> Row | None:
    return await conn.fetchrow(
        "UPDATE job_runs SET state = $2, detail = coalesce($3::jsonb, detail), updated_at = $4"
        " WHERE id = $1 RETURNING *",
        run_id,
        state,
        detail,
        now,
    )


# fire_job's one statement: the compare-and-set on the job, then (only if it matched) the input
# and the run. The run's id is drawn first, so the input's payload carries it and the run names
# the input, without the UPDATE of the input the transaction needs. A job without a session
# does not match here when an input is asked for: the transaction below says why. The three
# rows come back as one, column by column (not as whole-row composites: asyncpg caches a
# composite's layout per connection, and a column added while a node runs would make it raise
# after the statement had committed).
_JOB_COLUMNS = (
    "id", "session_id", "kind", "spec", "state", "next_fire_at", "created_at", "updated_at",
    "run_count",
)  # fmt: skip
_RUN_COLUMNS = (
    "id", "job_id", "scheduled_for", "state", "input_id", "detail", "created_at", "updated_at",
)  # fmt: skip
_INPUT_COLUMNS = (
    "id", "session_id", "source", "payload", "state", "created_at", "updated_at", "detail",
    "idempotency_key", "claimed_by", "claimed_epoch",
)  # fmt: skip


def _select(*tables: tuple[str, tuple[str, ...]]) -> str:
    return "SELECT " + ", ".join(f"{name}.{col}" for name, cols in tables for col in cols)


def _split(row: Row, *tables: tuple[str, ...]) -> list[dict[str, Any]]:
    out, at = [], 0
    for cols in tables:
        out.append(dict(zip(cols, row[at : at + len(cols)], strict=True)))
        at += len(cols)
    return out


_FIRE_JOB_UPDATE = """
WITH job AS (
    UPDATE jobs SET next_fire_at = $1::timestamptz,
        state = CASE WHEN $1::timestamptz IS NULL THEN 'completed' ELSE state END,
        run_count = run_count + $5, updated_at = $2
    WHERE id = $3 AND state = 'active' AND next_fire_at = $4{condition}
    RETURNING *
)"""

_FIRE_JOB = (
    _FIRE_JOB_UPDATE.format(condition=" AND session_id IS NOT NULL")
    + """, run_id AS (
    SELECT nextval(pg_get_serial_sequence('job_runs', 'id')) AS id FROM job
), item AS (
    INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at)
    SELECT job.session_id, $6, $7::jsonb || jsonb_build_object('run_id', run_id.id),
        'queued', $2, $2
    FROM job, run_id
    RETURNING *
), run AS (
    INSERT INTO job_runs (id, job_id, scheduled_for, state, input_id, detail, created_at,
        updated_at) OVERRIDING SYSTEM VALUE
    SELECT run_id.id, $3, $4, $8, item.id, $9::jsonb, $2, $2 FROM run_id, item
    RETURNING *
)
"""
    + _select(("job", _JOB_COLUMNS), ("run", _RUN_COLUMNS), ("item", _INPUT_COLUMNS))
    + " FROM job, run, item"
)

# The same without an input (a skipped or missed occurrence, a job that delivers nothing).
_FIRE_JOB_NO_INPUT = (
    _FIRE_JOB_UPDATE.format(condition="")
    + """, run AS (
    INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail, created_at,
        updated_at)
    SELECT $3, $4, $6, NULL, $7::jsonb, $2, $2 FROM job
    RETURNING *
)
"""
    + _select(("job", _JOB_COLUMNS), ("run", _RUN_COLUMNS))
    + " FROM job, run"
)


async def fire_job(
    conn: Conn,
    job_id: str,
    expected: datetime,
    new: datetime | None,
    run_state: str,
    input: tuple[str, str] | None,
    detail: str | None,
    now: datetime,
    counts: bool,
    extra_runs: list[tuple[datetime, str, str | None]],
) -> tuple[Any, Any, Any] | None:
    """One statement, one round trip, when the compare-and-set matches and there are no extra
    runs (an occurrence fired on time): under load every round trip waits for the asyncio
    thread's turn at the GIL, and the transaction's six did. Otherwise (extra runs, or nothing
    matched: lost, paused, no such job, no session) the transaction below decides, with the
    same compare-and-set, so its answer and its errors are the same."""
    if not extra_runs:
        count = 1 if counts else 0
        if input is None:
            row = await conn.fetchrow(
                _FIRE_JOB_NO_INPUT, new, now, job_id, expected, count, run_state, detail
            )
            if row is not None:
                job, run = _split(row, _JOB_COLUMNS, _RUN_COLUMNS)
                return job, run, None
        else:
            row = await conn.fetchrow(
                _FIRE_JOB, new, now, job_id, expected, count, *input, run_state, detail
            )
            if row is not None:
                job, run, item = _split(row, _JOB_COLUMNS, _RUN_COLUMNS, _INPUT_COLUMNS)
                return job, run, item
    return await _fire_job_transaction(
        conn, job_id, expected, new, run_state, input, detail, now, counts, extra_runs
    )


async def _fire_job_transaction(
    conn: Conn,
    job_id: str,
    expected: datetime,
    new: datetime | None,
    run_state: str,
    input: tuple[str, str] | None,
    detail: str | None,
    now: datetime,
    counts: bool,
    extra_runs: list[tuple[datetime, str, str | None]],
) -> tuple[Row, Row, Row | None] | None:
    async with conn.transaction():
        job = await conn.fetchrow(
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
        if job is None:
            await _require_job(conn, job_id)
            return None
        item = None
        if input is not None:
            if job["session_id"] is None:
                raise ConflictError(f"job {job_id!r} has no session")
            item = await conn.fetchrow(_INSERT_INPUT, job["session_id"], *input, now)
        run = await conn.fetchrow(
            "INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail, created_at,"
            " updated_at) VALUES ($1, $2, $3, $4, $5::jsonb, $6, $6) RETURNING *",
            job_id,
            expected,
            run_state,
            None if item is None else item["id"],
            detail,
            now,
        )
        if item is not None:  # the input names its run, so its turn finds it without a search
            item = await conn.fetchrow(
                "UPDATE inbox SET payload = payload || jsonb_build_object('run_id', $1::bigint)"
                " WHERE id = $2 RETURNING *",
                run["id"],
                item["id"],
            )
        if extra_runs:
            await conn.executemany(
                "INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail,"
                " created_at, updated_at) VALUES ($1, $2, $3, NULL, $4::jsonb, $5, $5)",
                [(job_id, when, state, data, now) for when, state, data in extra_runs],
            )
    return job, run, item


# fire_jobs' one statement: fire_job's, over arrays (one element per occurrence). Both ids of
# each fired occurrence (its run's and its input's) are drawn first, so the input and the run
# are inserted from the UPDATE's rows without reading each other's. The
# compare-and-set of each job is the same as fire_job's: a row another statement holds is
# waited for and its condition checked again once that commits, so two batches over the same
# jobs fire each occurrence once in total. Rows are locked in the order of the job ids (the
# arguments sorted as the primary key is, which the UPDATE scans in order or probes from the
# sorted arguments), so batches that overlap wait for each other instead of deadlocking. Every
# array is text[] (times in ISO form, cast in the statement): a timestamptz[] parameter made
# asyncpg introspect its type on each connection's first use, 8 ms instead of 1.
_FIRE_JOBS = (
    """
WITH args AS (
    SELECT job_id, expected::timestamptz, new::timestamptz, run_state, source, payload, detail
    FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
        $8::text[]) AS a(job_id, expected, new, run_state, source, payload, detail)
    ORDER BY job_id
), job AS (
    UPDATE jobs SET next_fire_at = args.new,
        state = CASE WHEN args.new IS NULL THEN 'completed' ELSE jobs.state END,
        run_count = jobs.run_count + 1, updated_at = $1
    FROM args
    WHERE jobs.id = ANY($2::text[]) AND jobs.id = args.job_id AND jobs.state = 'active'
        AND jobs.next_fire_at = args.expected AND jobs.session_id IS NOT NULL
    RETURNING jobs.*, args.expected AS a_expected, args.run_state AS a_run_state,
        args.source AS a_source, args.payload AS a_payload, args.detail AS a_detail
), ids AS (
    SELECT job.id AS job_id, nextval(pg_get_serial_sequence('job_runs', 'id')) AS run_id,
        nextval(pg_get_serial_sequence('inbox', 'id')) AS input_id
    FROM job
), item AS (
    INSERT INTO inbox (id, session_id, source, payload, state, created_at, updated_at)
        OVERRIDING SYSTEM VALUE
    SELECT ids.input_id, job.session_id, job.a_source,
        job.a_payload::jsonb || jsonb_build_object('run_id', ids.run_id), 'queued', $1, $1
    FROM job JOIN ids ON ids.job_id = job.id
    RETURNING *
), run AS (
    INSERT INTO job_runs (id, job_id, scheduled_for, state, input_id, detail, created_at,
        updated_at) OVERRIDING SYSTEM VALUE
    SELECT ids.run_id, job.id, job.a_expected, job.a_run_state, ids.input_id,
        job.a_detail::jsonb, $1, $1
    FROM job JOIN ids ON ids.job_id = job.id
    RETURNING *
)
"""
    + _select(("job", _JOB_COLUMNS), ("run", _RUN_COLUMNS), ("item", _INPUT_COLUMNS))
    + " FROM job JOIN run ON run.job_id = job.id JOIN item ON item.id = run.input_id"
)


async def fire_jobs(
    conn: Conn,
    fires: list[tuple[str, datetime, datetime | None, str, tuple[str, str], str | None]],
    now: datetime,
) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None]:
    """One statement, one round trip, for the whole batch (see ``_FIRE_JOBS``)."""
    rows = await conn.fetch(
        _FIRE_JOBS,
        now,
        [fire[0] for fire in fires],
        [fire[1].isoformat() for fire in fires],
        [None if fire[2] is None else fire[2].isoformat() for fire in fires],
        [fire[3] for fire in fires],
        [fire[4][0] for fire in fires],
        [fire[4][1] for fire in fires],
        [fire[5] for fire in fires],
    )
    fired = {}
    for row in rows:
        job, run, item = _split(row, _JOB_COLUMNS, _RUN_COLUMNS, _INPUT_COLUMNS)
        fired[job["id"]] = (job, run, item)
    return [fired.get(fire[0]) for fire in fires]


# -- key-value --------------------------------------------------------------------------------

_LIVE = " AND (expires_at IS NULL OR expires_at > $3)"


async def kv_put(conn: Conn, namespace: str, rows: list[tuple], now: datetime) -> None:
    await conn.executemany(
        "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
        " VALUES ($1, $2, $3::jsonb, $4, $5) ON CONFLICT (namespace, key) DO UPDATE"
        " SET value = excluded.value, expires_at = excluded.expires_at,"
        " updated_at = excluded.updated_at",
        [(namespace, key, value, expires, now) for key, value, expires in rows],
    )


async def kv_get(conn: Conn, namespace: str, key: str, now: datetime) -> str | None:
    sql = "SELECT value FROM kv WHERE namespace = $1 AND key = $2" + _LIVE
    return await conn.fetchval(sql, namespace, key, now)


async def kv_delete(conn: Conn, namespace: str, keys: list[str]) -> int:
    return await conn.fetchval(
        "WITH gone AS (DELETE FROM kv WHERE namespace = $1 AND key = ANY($2::text[])"
        " RETURNING 1) SELECT count(*) FROM gone",
        namespace,
        keys,
    )


async def kv_list(conn: Conn, namespace: str, after: str, limit: int, now: datetime) -> list[Row]:
    sql = "SELECT key, value FROM kv WHERE namespace = $1 AND key > $2" + _LIVE
    return await conn.fetch(sql + " ORDER BY key LIMIT $4", namespace, after, now, limit)


async def kv_append(
    conn: Conn,
    namespace: str,
    value: str,
    expires: datetime | None,
    keep: int | None,
    now: datetime,
) -> int:
    # The counter row's lock (its UPDATE, or the INSERT's conflict) orders concurrent appends
    # until the transaction ends: gapless, never repeated.
    async with conn.transaction():
        seq = await conn.fetchval(
            "UPDATE kv SET value = jsonb_build_object('seq', (value->>'seq')::bigint + 1),"
            " updated_at = $2 WHERE namespace = $1 AND key = '' RETURNING (value->>'seq')::bigint",
            namespace,
            now,
        )
        if seq is None:
            seq = await conn.fetchval(
                "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
                " VALUES ($1, '', '{\"seq\": 1}', NULL, $2)"
                " ON CONFLICT (namespace, key) DO UPDATE SET updated_at = $2,"
                " value = jsonb_build_object('seq', (kv.value->>'seq')::bigint + 1)"
                " RETURNING (value->>'seq')::bigint",
                namespace,
                now,
            )
        await conn.execute(
            "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
            " VALUES ($1, $2, $3::jsonb, $4, $5)",
            namespace,
            f"{seq:020d}",
            value,
            expires,
            now,
        )
        if keep is not None:
            await conn.execute(
                "DELETE FROM kv WHERE namespace = $1 AND key IN (SELECT key FROM kv"
                " WHERE namespace = $1 AND key <> '' ORDER BY key DESC OFFSET $2)",
                namespace,
                keep,
            )
    return seq


async def kv_purge(conn: Conn, now: datetime) -> int:
    return await conn.fetchval(
        "WITH gone AS (DELETE FROM kv WHERE expires_at IS NOT NULL AND expires_at <= $1"
        " RETURNING 1) SELECT count(*) FROM gone",
        now,
    )
