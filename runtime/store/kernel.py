"""The kernel's migration set: the store's own tables, as they stand today.

Sessions, inbox and events (v1), the key-value table (v3), the inbox's idempotency keys (v4),
the nodes that share the store with the claimer of each running input (v5), and the sessions'
leases (v6). Steps 1 and 2 once also made tables and an index that a feature owns now; they
keep their recorded names (the runner compares a recorded step's name, not its statements), so
a store migrated by an earlier release opens unchanged, the feature's own set finding its
tables there. Step 2 makes nothing any more. Each backend has its own DDL where the types
differ:

* SQLite: STRICT tables; times are fixed-width ISO-8601 UTC text (text order == time order);
  JSON is text. AUTOINCREMENT keeps inbox/run ids monotonic (never reused after a delete).
* PostgreSQL: ids are COLLATE "C" so that ordering and keyset pagination match SQLite's byte
  order; times are timestamptz; JSON is jsonb.
"""

from __future__ import annotations

from turnstile.runtime.store.migrations import KERNEL_SET, Migration, MigrationSet

__all__ = ["KERNEL", "SCHEMA_VERSION"]

_INPUT_STATES_SQL = "('queued', 'running', 'done', 'failed', 'interrupted')"

_SQLITE_INITIAL = (
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
)

_SQLITE_KV = (
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
)

_POSTGRES_INITIAL = (
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
)

_POSTGRES_KV = (
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
)

# v4: an input may carry an idempotency key, unique per session, so that an input sent twice
# (a client resending after a reconnect, a webhook redelivered) is stored once. The database
# enforces it: concurrent duplicates insert ``ON CONFLICT DO NOTHING`` and read the row that won.
# The key lives as long as its inbox row (rows go only with their session). Partial, so that
# the inputs without a key (most of them) cost the index nothing.
_INBOX_KEY_INDEX_SQL = """
CREATE UNIQUE INDEX inbox_idempotency_idx ON inbox (session_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL
"""
_SQLITE_INBOX_KEYS = ("ALTER TABLE inbox ADD COLUMN idempotency_key TEXT", _INBOX_KEY_INDEX_SQL)
_POSTGRES_INBOX_KEYS = (
    'ALTER TABLE inbox ADD COLUMN idempotency_key text COLLATE "C"',
    _INBOX_KEY_INDEX_SQL,
)

# v5: membership. One row per node id: its current epoch (a new one each start, strictly
# increasing), its lease (renewed by its heartbeat; on PostgreSQL the database clock sets it),
# and its state. An input that goes ``running`` records which node (id and epoch) claimed it,
# so that recovery moves only the work of nodes that are dead (runtime/membership.py).
_NODE_STATES_SQL = "('running', 'draining', 'stopped')"
_SQLITE_NODES = (
    f"""
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        epoch INTEGER NOT NULL CHECK (epoch > 0),
        state TEXT NOT NULL CHECK (state IN {_NODE_STATES_SQL}),
        address TEXT,
        started_at TEXT NOT NULL,
        heartbeat_at TEXT NOT NULL,
        lease_expires_at TEXT NOT NULL
    ) STRICT
    """,
    "ALTER TABLE inbox ADD COLUMN claimed_by TEXT",
    "ALTER TABLE inbox ADD COLUMN claimed_epoch INTEGER",
)
_POSTGRES_NODES = (
    f"""
    CREATE TABLE nodes (
        id text COLLATE "C" PRIMARY KEY,
        epoch bigint NOT NULL CHECK (epoch > 0),
        state text NOT NULL CHECK (state IN {_NODE_STATES_SQL}),
        address text,
        started_at timestamptz NOT NULL,
        heartbeat_at timestamptz NOT NULL,
        lease_expires_at timestamptz NOT NULL
    )
    """,
    'ALTER TABLE inbox ADD COLUMN claimed_by text COLLATE "C"',
    "ALTER TABLE inbox ADD COLUMN claimed_epoch bigint",
)

# v6: session leases (runtime/placement.py). With several nodes a session is activated on one
# node at a time: the node that holds its lease (``lease_node`` at ``lease_node_epoch``, the
# node's incarnation), acquired only while the previous holder is not live. ``lease_epoch``
# counts the acquisitions and is never reset (a release only clears the holder): it is the
# fencing token every write of an activation carries, checked in the same statement or
# transaction as the write, so an activation whose lease moved (its node paused past its lease)
# can write nothing.
_SQLITE_SESSION_LEASES = (
    "ALTER TABLE sessions ADD COLUMN lease_node TEXT",
    "ALTER TABLE sessions ADD COLUMN lease_node_epoch INTEGER",
    "ALTER TABLE sessions ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0",
)
_POSTGRES_SESSION_LEASES = (
    'ALTER TABLE sessions ADD COLUMN lease_node text COLLATE "C"',
    "ALTER TABLE sessions ADD COLUMN lease_node_epoch bigint",
    "ALTER TABLE sessions ADD COLUMN lease_epoch bigint NOT NULL DEFAULT 0",
)

KERNEL = MigrationSet(
    KERNEL_SET,
    (
        Migration(1, "initial", sqlite=_SQLITE_INITIAL, postgres=_POSTGRES_INITIAL),
        Migration(2, "one_pending_recall", ()),
        Migration(3, "kv", sqlite=_SQLITE_KV, postgres=_POSTGRES_KV),
        Migration(
            4, "inbox_idempotency_key", sqlite=_SQLITE_INBOX_KEYS, postgres=_POSTGRES_INBOX_KEYS
        ),
        Migration(5, "nodes", sqlite=_SQLITE_NODES, postgres=_POSTGRES_NODES),
        Migration(
            6, "session_leases", sqlite=_SQLITE_SESSION_LEASES, postgres=_POSTGRES_SESSION_LEASES
        ),
    ),
)

#: The kernel's latest version.
SCHEMA_VERSION = KERNEL.version
