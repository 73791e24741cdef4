"""Versioned schema, one list of migrations per backend.

Rules:

* Versions start at 1 and are consecutive; both backends have the same versions and names.
* A migration is a tuple of single SQL statements (no ``executescript``: it would commit).
* Migrations are applied at start-up, all pending ones in one transaction, each recorded in
  ``schema_migrations(version, name, applied_at)``; running them again changes nothing.
* A database whose highest recorded version is newer than the code's is refused with
  :class:`~runtime.errors.MigrationError` rather than touched.
* Never edit a released migration: add a new one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from turnstile.runtime.errors import MigrationError

__all__ = [
    "Migration",
    "SCHEMA_VERSION",
    "SQLITE_MIGRATIONS",
    "POSTGRES_MIGRATIONS",
    "pending",
]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


_INPUT_STATES_SQL = "('queued', 'running', 'done', 'failed', 'interrupted')"
_JOB_STATES_SQL = "('active', 'paused', 'completed', 'cancelled')"

# v2: at most one pending (active or paused) recall per session, enforced by the database
# itself, so that two concurrent ``schedule_recall`` calls (even on two nodes sharing one
# PostgreSQL) cannot both succeed. Same statement on both backends: both have partial indexes.
_ONE_PENDING_RECALL_SQL = """
CREATE UNIQUE INDEX jobs_one_pending_recall_idx ON jobs (session_id)
    WHERE kind = 'recall' AND state IN ('active', 'paused')
"""

# SQLite: STRICT tables; times are fixed-width ISO-8601 UTC text (text order == time order);
# JSON is text. AUTOINCREMENT keeps inbox/run ids monotonic (never reused after a delete).
SQLITE_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL
) STRICT
"""

SQLITE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial",
        (
            """
            CREATE TABLE sessions (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                metadata TEXT NOT NULL,
                policy TEXT NOT NULL,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                last_seq INTEGER NOT NULL DEFAULT 0
            ) STRICT
            """,
            "CREATE INDEX sessions_owner_idx ON sessions (owner, id)",
            f"""
            CREATE TABLE inbox (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
                source TEXT NOT NULL,
                payload TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN {_INPUT_STATES_SQL}),
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                detail TEXT
            ) STRICT
            """,
            "CREATE INDEX inbox_session_idx ON inbox (session_id, state, id)",
            "CREATE INDEX inbox_state_idx ON inbox (state)",
            """
            CREATE TABLE events (
                session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
                seq INTEGER NOT NULL,
                type TEXT NOT NULL,
                payload TEXT NOT NULL,
                ts TEXT NOT NULL,
                PRIMARY KEY (session_id, seq)
            ) STRICT, WITHOUT ROWID
            """,
            f"""
            CREATE TABLE jobs (
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
            "CREATE INDEX jobs_due_idx ON jobs (state, next_fire_at)",
            "CREATE INDEX jobs_session_idx ON jobs (session_id)",
            """
            CREATE TABLE job_runs (
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
            "CREATE INDEX job_runs_job_idx ON job_runs (job_id, id)",
            "CREATE INDEX job_runs_input_idx ON job_runs (input_id)",
        ),
    ),
    Migration(2, "one_pending_recall", (_ONE_PENDING_RECALL_SQL,)),
    Migration(
        3,
        "kv",
        (
            """
            CREATE TABLE kv (
                namespace TEXT NOT NULL,
                key TEXT NOT NULL,
                value TEXT NOT NULL,
                expires_at TEXT,
                updated_at TEXT NOT NULL,
                PRIMARY KEY (namespace, key)
            ) STRICT, WITHOUT ROWID
            """,
            "CREATE INDEX kv_expires_idx ON kv (expires_at) WHERE expires_at IS NOT NULL",
        ),
    ),
)

# PostgreSQL: ids are COLLATE "C" so that ordering and keyset pagination match SQLite's byte
# order; times are timestamptz; JSON is jsonb.
POSTGRES_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL
)
"""

POSTGRES_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial",
        (
            """
            CREATE TABLE sessions (
                id text COLLATE "C" PRIMARY KEY,
                owner text NOT NULL,
                metadata jsonb NOT NULL,
                policy text NOT NULL,
                created_at timestamptz NOT NULL,
                updated_at timestamptz NOT NULL,
                last_seq bigint NOT NULL DEFAULT 0
            )
            """,
            "CREATE INDEX sessions_owner_idx ON sessions (owner, id)",
            f"""
            CREATE TABLE inbox (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                session_id text COLLATE "C" NOT NULL
                    REFERENCES sessions (id) ON DELETE CASCADE,
                source text NOT NULL,
                payload jsonb NOT NULL,
                state text NOT NULL CHECK (state IN {_INPUT_STATES_SQL}),
                created_at timestamptz NOT NULL,
                updated_at timestamptz NOT NULL,
                detail jsonb
            )
            """,
            "CREATE INDEX inbox_session_idx ON inbox (session_id, state, id)",
            "CREATE INDEX inbox_state_idx ON inbox (state)",
            """
            CREATE TABLE events (
                session_id text COLLATE "C" NOT NULL
                    REFERENCES sessions (id) ON DELETE CASCADE,
                seq bigint NOT NULL,
                type text NOT NULL,
                payload jsonb NOT NULL,
                ts timestamptz NOT NULL,
                PRIMARY KEY (session_id, seq)
            )
            """,
            f"""
            CREATE TABLE jobs (
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
            "CREATE INDEX jobs_due_idx ON jobs (next_fire_at) WHERE state = 'active'",
            "CREATE INDEX jobs_session_idx ON jobs (session_id)",
            """
            CREATE TABLE job_runs (
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
            "CREATE INDEX job_runs_job_idx ON job_runs (job_id, id)",
            "CREATE INDEX job_runs_input_idx ON job_runs (input_id)",
        ),
    ),
    Migration(2, "one_pending_recall", (_ONE_PENDING_RECALL_SQL,)),
    Migration(
        3,
        "kv",
        (
            """
            CREATE TABLE kv (
                namespace text COLLATE "C" NOT NULL,
                key text COLLATE "C" NOT NULL,
                value jsonb NOT NULL,
                expires_at timestamptz,
                updated_at timestamptz NOT NULL,
                PRIMARY KEY (namespace, key)
            )
            """,
            "CREATE INDEX kv_expires_idx ON kv (expires_at) WHERE expires_at IS NOT NULL",
        ),
    ),
)


def _check(migrations: tuple[Migration, ...]) -> int:
    for expected, m in enumerate(migrations, start=1):
        if m.version != expected:
            raise AssertionError(f"migration versions must be consecutive from 1 ({m.version})")
    return len(migrations)


SCHEMA_VERSION = _check(SQLITE_MIGRATIONS)
if _check(POSTGRES_MIGRATIONS) != SCHEMA_VERSION or [m.name for m in SQLITE_MIGRATIONS] != [
    m.name for m in POSTGRES_MIGRATIONS
]:
    raise AssertionError("sqlite and postgres migrations must have the same versions and names")


def pending(applied: Iterable[int], migrations: tuple[Migration, ...]) -> list[Migration]:
    """The migrations not yet in ``applied``, in order.

    Raises:
        MigrationError: the database knows a version newer than the code.
    """
    applied = set(applied)
    latest = migrations[-1].version if migrations else 0
    if applied and max(applied) > latest:
        raise MigrationError(f"schema version {max(applied)} is newer than this code ({latest})")
    return [m for m in migrations if m.version not in applied]
