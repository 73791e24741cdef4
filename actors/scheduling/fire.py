"""Firing a job occurrence: exactly once, in one transaction, with its input and its run.

The operations are scheduling's; the inbox's row is the kernel's, inserted with the kernel's
own statement (``INSERT_INPUT``) in the fire's transaction, or, in the one-statement forms
below, by an ``INSERT`` whose answer is split by the kernel's ``INPUT_COLUMNS``.

A fire is a compare-and-set on the job (``active`` and ``next_fire_at`` as read), which
advances it (or completes it), counts the run, records the run and enqueues the turn input in
the session's inbox, all or nothing; the input's payload carries its run's id, and the run
names its input. A lost compare-and-set writes nothing. On PostgreSQL the conditional
``UPDATE``'s row lock makes a second firer re-check the condition once the first commits, and
lose, so two nodes never fire one occurrence twice.

On PostgreSQL an occurrence fired on time is one statement (a data-modifying ``WITH``: the
``UPDATE``, the run's id drawn with ``nextval``, the inbox ``INSERT`` whose payload carries
it, the run's ``INSERT`` naming the input), one round trip instead of six; a batch of them
(:data:`FIRE_JOBS`) is the same over arrays. Both are served before the operations waiting
for a connection (``first``). The rows come back as one, column by column (not as whole-row
composites: asyncpg caches a composite's layout per connection, and a column added while a
node runs would make it raise after the statement had committed).

It is over 400 lines because a fire's statements for both backends, the one-statement forms and the
transaction they fall back to, are long, and each is explained where it stands; they are kept
together since they must give the same answers and errors.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from turnstile.actors.scheduling.queries import (
    job_record,
    require_job_postgres,
    require_job_sqlite,
    run_record,
)
from turnstile.actors.scheduling.records import FireResult
from turnstile.runtime.errors import ConflictError
from turnstile.runtime.store import INPUT_COLUMNS, INSERT_INPUT, input_record, ops

__all__ = ["FIRE_JOB", "FIRE_JOBS"]

# -- the statements both backends run -----------------------------------------------------------

_ADVANCE = (
    "UPDATE jobs SET next_fire_at = :new::timestamptz,"
    " state = CASE WHEN :new::timestamptz IS NULL THEN 'completed' ELSE state END,"
    " run_count = run_count + :count, updated_at = :now"
    " WHERE id = :job_id AND state = 'active' AND next_fire_at = :expected{condition}"
    " RETURNING *"
)
_ADVANCE_ARGS = ("new", "now", "job_id", "expected", "count")
#: the compare-and-set: the job advanced, or nothing
_ADVANCE_JOB = ops.Statement(_ADVANCE.format(condition=""), params=_ADVANCE_ARGS)
#: the same for a fire that enqueues: a job without a session does not match
_ADVANCE_SESSION_JOB = ops.Statement(
    _ADVANCE.format(condition=" AND session_id IS NOT NULL"), params=_ADVANCE_ARGS
)
_INSERT_RUN = ops.Statement(
    "INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail, created_at,"
    " updated_at) VALUES (:job_id, :scheduled_for, :state, :input_id, :detail::jsonb, :now,"
    " :now) RETURNING *",
    params=("job_id", "scheduled_for", "state", "input_id", "detail", "now"),
)
_INSERT_EXTRA_RUN = ops.Statement(
    "INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail, created_at,"
    " updated_at) VALUES (:job_id, :scheduled_for, :state, NULL, :detail::jsonb, :now, :now)",
    params=("job_id", "scheduled_for", "state", "detail", "now"),
)
# the input names its run, so its turn finds it without a search
_NAME_RUN_SQLITE = ops.Statement(
    "UPDATE inbox SET payload = json_set(payload, '$.run_id', :run_id) WHERE id = :input_id"
    " RETURNING *",
    params=("run_id", "input_id"),
)
_NAME_RUN_PG = ops.Statement(
    "UPDATE inbox SET payload = payload || jsonb_build_object('run_id', :run_id::bigint)"
    " WHERE id = :input_id RETURNING *"
)


# -- SQLite: one writer at a time, so the transaction is the statements in a row ----------------


def _record_run_sqlite(
    conn: sqlite3.Connection,
    job_id: str,
    expected: str,
    state: str,
    item: Any,
    detail: str | None,
    now: str,
) -> tuple[Any, Any]:
    """A fired occurrence's run record, naming its input; the input then names its run.
    Returns the run and the input as updated."""
    input_id = None if item is None else item["id"]
    run = conn.execute(
        _INSERT_RUN.sqlite, (job_id, expected, state, input_id, detail, now)
    ).fetchone()
    if item is not None:
        item = conn.execute(_NAME_RUN_SQLITE.sqlite, (run["id"], item["id"])).fetchone()
    return run, item


def _fire_sqlite(
    conn: sqlite3.Connection,
    job_id: str,
    expected: str,
    new: str | None,
    run_state: str,
    input: tuple[str, str] | None,
    detail: str | None,
    now: str,
    counts: bool,
    extra_runs: list[tuple[str, str, str | None]],
) -> tuple[Any, Any, Any] | None:
    count = 1 if counts else 0
    job = conn.execute(_ADVANCE_JOB.sqlite, (new, now, job_id, expected, count)).fetchone()
    if job is None:
        require_job_sqlite(conn, job_id)
        return None
    item = None
    if input is not None:
        if job["session_id"] is None:
            raise ConflictError(f"job {job_id!r} has no session")
        values = (job["session_id"], input[0], input[1], now)
        item = conn.execute(INSERT_INPUT.sqlite, values).fetchone()
    run, item = _record_run_sqlite(conn, job_id, expected, run_state, item, detail, now)
    if extra_runs:
        conn.executemany(
            _INSERT_EXTRA_RUN.sqlite,
            [(job_id, when, state, data, now) for when, state, data in extra_runs],
        )
    return job, run, item


def _fire_many_sqlite(
    conn: sqlite3.Connection,
    fires: list[tuple[str, str, str | None, str, tuple[str, str], str | None]],
    now: str,
) -> list[tuple[Any, Any, Any] | None]:
    # A loop in the one transaction is the batch. A job that does not match (lost, no such
    # job, no session) is None and writes nothing, and stops no other.
    out: list[tuple[Any, Any, Any] | None] = []
    for job_id, expected, new, run_state, (source, payload), detail in fires:
        values = (new, now, job_id, expected, 1)
        job = conn.execute(_ADVANCE_SESSION_JOB.sqlite, values).fetchone()
        if job is None:
            out.append(None)
            continue
        item = conn.execute(
            INSERT_INPUT.sqlite, (job["session_id"], source, payload, now)
        ).fetchone()
        run, item = _record_run_sqlite(conn, job_id, expected, run_state, item, detail, now)
        out.append((job, run, item))
    return out


# -- PostgreSQL: one statement for an occurrence on time, or a batch of them --------------------

_JOB_COLUMNS = (
    "id", "session_id", "kind", "spec", "state", "next_fire_at", "created_at", "updated_at",
    "run_count",
)  # fmt: skip
_RUN_COLUMNS = (
    "id", "job_id", "scheduled_for", "state", "input_id", "detail", "created_at", "updated_at",
)  # fmt: skip
_INPUT_COLUMNS = INPUT_COLUMNS


def _select(*tables: tuple[str, tuple[str, ...]]) -> str:
    return "SELECT " + ", ".join(f"{name}.{col}" for name, cols in tables for col in cols)


def _split(row: Any, *tables: tuple[str, ...]) -> list[dict[str, Any]]:
    out, at = [], 0
    for cols in tables:
        out.append(dict(zip(cols, row[at : at + len(cols)], strict=True)))
        at += len(cols)
    return out


_FIRE_UPDATE = """
WITH job AS (
    UPDATE jobs SET next_fire_at = :new::timestamptz,
        state = CASE WHEN :new::timestamptz IS NULL THEN 'completed' ELSE state END,
        run_count = run_count + :count, updated_at = :now
    WHERE id = :job_id AND state = 'active' AND next_fire_at = :expected{condition}
    RETURNING *
)"""

# The run's id is drawn first, so the input's payload carries it and the run names the
# input, without the UPDATE of the input the transaction needs.
_FIRE = ops.Statement(
    _FIRE_UPDATE.format(condition=" AND session_id IS NOT NULL")
    + """, run_id AS (
    SELECT nextval(pg_get_serial_sequence('job_runs', 'id')) AS id FROM job
), item AS (
    INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at)
    SELECT job.session_id, :source, :payload::jsonb || jsonb_build_object('run_id', run_id.id),
        'queued', :now, :now
    FROM job, run_id
    RETURNING *
), run AS (
    INSERT INTO job_runs (id, job_id, scheduled_for, state, input_id, detail, created_at,
        updated_at) OVERRIDING SYSTEM VALUE
    SELECT run_id.id, :job_id, :expected, :run_state, item.id, :detail::jsonb, :now, :now
    FROM run_id, item
    RETURNING *
)
"""
    + _select(("job", _JOB_COLUMNS), ("run", _RUN_COLUMNS), ("item", _INPUT_COLUMNS))
    + " FROM job, run, item",
    params=(*_ADVANCE_ARGS, "source", "payload", "run_state", "detail"),
)

# The same without an input (a skipped or missed occurrence, a job that delivers nothing).
_FIRE_NO_INPUT = ops.Statement(
    _FIRE_UPDATE.format(condition="")
    + """, run AS (
    INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail, created_at,
        updated_at)
    SELECT :job_id, :expected, :run_state, NULL, :detail::jsonb, :now, :now FROM job
    RETURNING *
)
"""
    + _select(("job", _JOB_COLUMNS), ("run", _RUN_COLUMNS))
    + " FROM job, run",
    params=(*_ADVANCE_ARGS, "run_state", "detail"),
)


async def _fire_postgres(
    conn: Any,
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
    count = 1 if counts else 0
    if not extra_runs:
        if input is None:
            row = await conn.fetchrow(
                _FIRE_NO_INPUT.postgres, new, now, job_id, expected, count, run_state, detail
            )
            if row is not None:
                job, run = _split(row, _JOB_COLUMNS, _RUN_COLUMNS)
                return job, run, None
        else:
            row = await conn.fetchrow(
                _FIRE.postgres, new, now, job_id, expected, count, *input, run_state, detail
            )
            if row is not None:
                job, run, item = _split(row, _JOB_COLUMNS, _RUN_COLUMNS, _INPUT_COLUMNS)
                return job, run, item
    return await _fire_transaction_postgres(
        conn, job_id, expected, new, run_state, input, detail, now, count, extra_runs
    )


async def _fire_transaction_postgres(
    conn: Any,
    job_id: str,
    expected: datetime,
    new: datetime | None,
    run_state: str,
    input: tuple[str, str] | None,
    detail: str | None,
    now: datetime,
    count: int,
    extra_runs: list[tuple[datetime, str, str | None]],
) -> tuple[Any, Any, Any] | None:
    async with conn.transaction():
        job = await conn.fetchrow(_ADVANCE_JOB.postgres, new, now, job_id, expected, count)
        if job is None:
            await require_job_postgres(conn, job_id)
            return None
        item = None
        if input is not None:
            if job["session_id"] is None:
                raise ConflictError(f"job {job_id!r} has no session")
            item = await conn.fetchrow(INSERT_INPUT.postgres, job["session_id"], *input, now)
        input_id = None if item is None else item["id"]
        run = await conn.fetchrow(
            _INSERT_RUN.postgres, job_id, expected, run_state, input_id, detail, now
        )
        if item is not None:
            item = await conn.fetchrow(_NAME_RUN_PG.postgres, run["id"], item["id"])
        if extra_runs:
            await conn.executemany(
                _INSERT_EXTRA_RUN.postgres,
                [(job_id, when, state, data, now) for when, state, data in extra_runs],
            )
    return job, run, item


# Both ids of each fired occurrence (its run's and its input's) are drawn first, so the input
# and the run are inserted from the UPDATE's rows without reading each other's. The
# compare-and-set of each job is fire_job's: a row another statement holds is waited for and
# its condition checked again once that commits, so two batches over the same jobs fire each
# occurrence once in total. Rows are locked in the order of the job ids (the arguments sorted
# as the primary key is, which the UPDATE scans in order or probes from the sorted
# arguments), so batches that overlap wait for each other instead of deadlocking. Every array
# is text[] (times in ISO form, cast in the statement): a timestamptz[] parameter made asyncpg
# introspect its type on each connection's first use, 8 ms instead of 1.
_FIRE_MANY = ops.Statement(
    """
WITH args AS (
    SELECT job_id, expected::timestamptz, new::timestamptz, run_state, source, payload, detail
    FROM unnest(:job_ids::text[], :expected::text[], :new::text[], :run_states::text[],
        :sources::text[], :payloads::text[],
        :details::text[]) AS a(job_id, expected, new, run_state, source, payload, detail)
    ORDER BY job_id
), job AS (
    UPDATE jobs SET next_fire_at = args.new,
        state = CASE WHEN args.new IS NULL THEN 'completed' ELSE jobs.state END,
        run_count = jobs.run_count + 1, updated_at = :now
    FROM args
    WHERE jobs.id = ANY(:job_ids::text[]) AND jobs.id = args.job_id AND jobs.state = 'active'
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
        job.a_payload::jsonb || jsonb_build_object('run_id', ids.run_id), 'queued', :now, :now
    FROM job JOIN ids ON ids.job_id = job.id
    RETURNING *
), run AS (
    INSERT INTO job_runs (id, job_id, scheduled_for, state, input_id, detail, created_at,
        updated_at) OVERRIDING SYSTEM VALUE
    SELECT ids.run_id, job.id, job.a_expected, job.a_run_state, ids.input_id,
        job.a_detail::jsonb, :now, :now
    FROM job JOIN ids ON ids.job_id = job.id
    RETURNING *
)
"""
    + _select(("job", _JOB_COLUMNS), ("run", _RUN_COLUMNS), ("item", _INPUT_COLUMNS))
    + " FROM job JOIN run ON run.job_id = job.id JOIN item ON item.id = run.input_id",
    params=("now", "job_ids", "expected", "new", "run_states", "sources", "payloads", "details"),
)


async def _fire_many_postgres(
    conn: Any,
    fires: list[tuple[str, datetime, datetime | None, str, tuple[str, str], str | None]],
    now: datetime,
) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None]:
    """One statement, one round trip, for the whole batch (see ``_FIRE_MANY``)."""
    rows = await conn.fetch(
        _FIRE_MANY.postgres,
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


# -- the operations -----------------------------------------------------------------------------


def _fired(rows: tuple[Any, Any, Any] | None) -> FireResult | None:
    if rows is None:
        return None
    job, run, item = rows
    return FireResult(
        job=job_record(job), run=run_record(run), input=None if item is None else input_record(item)
    )


def _all_fired(answers: list[tuple[Any, Any, Any] | None]) -> list[FireResult | None]:
    return [_fired(rows) for rows in answers]


#: ``(job_id, expected, new, run_state, input, detail, now, counts, extra_runs)``: what was
#: written, or None when the compare-and-set lost; ``NotFound`` for no job,
#: ``ConflictError`` for an input to a job without a session.
FIRE_JOB = ops.procedure(
    "fire_job",
    sqlite=_fire_sqlite,
    postgres=_fire_postgres,
    decode=_fired,
    writes=True,
    first=True,
)
#: ``(fires: [(job_id, expected, new, run_state, input, detail)], now)``: per fire, in order,
#: what was written, or None when it was not fired (lost, no such job, no session).
FIRE_JOBS = ops.procedure(
    "fire_jobs",
    sqlite=_fire_many_sqlite,
    postgres=_fire_many_postgres,
    decode=_all_fired,
    writes=True,
    first=True,
)
