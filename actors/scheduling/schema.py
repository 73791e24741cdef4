"""Scheduling's migration set: its jobs, their runs, and the one-pending-recall index.

Step 1 takes the tables over from the kernel, which made them (its steps 1 ``initial`` and 2
``one_pending_recall``) until scheduling owned them: a store an earlier release migrated has
them already, and every statement here is ``IF NOT EXISTS``, so it finds them and changes
nothing; a new store gets them here, after the kernel's set (their references to ``sessions``
and ``inbox`` resolve). The statements are the kernel's as they were, so the schema is the
same either way (``tests/actors/scheduling/test_schema.py`` compares both, on both backends).

* ``jobs``: one row per job (kind, spec, state, ``next_fire_at``, ``run_count``), its
  session's by ``ON DELETE CASCADE``: deleting a session deletes its jobs.
* ``job_runs``: one per occurrence, its job's by ``ON DELETE CASCADE``; the input it enqueued
  (``input_id``) is set to NULL if that input goes first.
* ``jobs_one_pending_recall_idx``: at most one pending (active or paused) recall per session,
  enforced by the database itself, so that two concurrent ``schedule_recall`` calls (even on
  two nodes sharing one PostgreSQL) cannot both succeed. Same statement on both backends: both
  have partial indexes.

SQLite: STRICT tables, times as fixed-width ISO-8601 UTC text, JSON as text, AUTOINCREMENT run
ids (never reused after a delete). PostgreSQL: ids ``COLLATE "C"`` (SQLite's byte order),
``timestamptz``, ``jsonb``.
"""

from __future__ import annotations

from turnstile.runtime.store import Migration, MigrationSet

__all__ = ["SCHEDULING"]

_JOB_STATES_SQL = "('active', 'paused', 'completed', 'cancelled')"

_ONE_PENDING_RECALL_SQL = """
CREATE UNIQUE INDEX IF NOT EXISTS jobs_one_pending_recall_idx ON jobs (session_id)
    WHERE kind = 'recall' AND state IN ('active', 'paused')
"""

_SQLITE_JOBS = (
    f"""
    CREATE TABLE IF NOT EXISTS jobs (
        id TEXT PRIMARY KEY,
        session_id TEXT REFERENCES sessions (id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        spec TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN {_JOB_STATES_SQL}),
        next_fire_at TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        run_count INTEGER NOT NULL DEFAULT 0
    ) STRICT
    """,
    "CREATE INDEX IF NOT EXISTS jobs_due_idx ON jobs (state, next_fire_at)",
    "CREATE INDEX IF NOT EXISTS jobs_session_idx ON jobs (session_id)",
    """
    CREATE TABLE IF NOT EXISTS job_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        scheduled_for TEXT NOT NULL,
        state TEXT NOT NULL,
        input_id INTEGER REFERENCES inbox (id) ON DELETE SET NULL,
        detail TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) STRICT
    """,
    "CREATE INDEX IF NOT EXISTS job_runs_job_idx ON job_runs (job_id, id)",
    "CREATE INDEX IF NOT EXISTS job_runs_input_idx ON job_runs (input_id)",
    _ONE_PENDING_RECALL_SQL,
)

_POSTGRES_JOBS = (
    f"""
    CREATE TABLE IF NOT EXISTS jobs (
        id text COLLATE "C" PRIMARY KEY,
        session_id text COLLATE "C" REFERENCES sessions (id) ON DELETE CASCADE,
        kind text NOT NULL,
        spec jsonb NOT NULL,
        state text NOT NULL CHECK (state IN {_JOB_STATES_SQL}),
        next_fire_at timestamptz,
        created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL,
        run_count bigint NOT NULL DEFAULT 0
    )
    """,
    "CREATE INDEX IF NOT EXISTS jobs_due_idx ON jobs (next_fire_at) WHERE state = 'active'",
    "CREATE INDEX IF NOT EXISTS jobs_session_idx ON jobs (session_id)",
    """
    CREATE TABLE IF NOT EXISTS job_runs (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        job_id text COLLATE "C" NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        scheduled_for timestamptz NOT NULL,
        state text NOT NULL,
        input_id bigint REFERENCES inbox (id) ON DELETE SET NULL,
        detail jsonb,
        created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS job_runs_job_idx ON job_runs (job_id, id)",
    "CREATE INDEX IF NOT EXISTS job_runs_input_idx ON job_runs (input_id)",
    _ONE_PENDING_RECALL_SQL,
)

#: Scheduling's tables (``open_node`` applies it after the kernel's set).
SCHEDULING = MigrationSet(
    "scheduling",
    (Migration(1, "jobs", sqlite=_SQLITE_JOBS, postgres=_POSTGRES_JOBS),),
)
