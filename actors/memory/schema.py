"""The memory feature's tables: its own migration set, ``"memory"``.

=========================  ==============================================================
``memory_facts``           one fact of one user: ``(owner, category, key)`` is unique
``memory_summary``         one narrative summary per user
``memory_session_state``   when a session was last processed by extraction (``extracted_at``)
=========================  ==============================================================

Lexical search (migration 5, ``docs/memory.md``, "Search at scale") indexes tokens made in
Python (``tokens.py``): each word of a fact glued to its owner's tag, so that the index's list
for a word holds only one user's facts and a search never reads another user's matches. Every
write of category, key or value also writes the tokens (``queries.search_columns``,
``queries.search_lexemes``):

* **SQLite**: three columns of ``memory_facts`` (``search_category``, ``search_key``,
  ``search_value``: three, so bm25 keeps weighing the key double) and :data:`SEARCH_TABLE`, an
  FTS5 table over them (external content: it stores only the index), kept in step by three
  triggers in SQL, whichever process writes. It replaces migration 1's ``memory_facts_fts``
  (an index of the words themselves, every user's matches in one list).
* **PostgreSQL**: ``search_tokens tsvector`` with :data:`SEARCH_INDEX`, a GIN index: core
  PostgreSQL, so every server has it. The owner's recency btree of migration 3,
  :data:`RECENT_INDEX`, serves the newest-first stages; migration 3's trigram index on the
  whole text (:data:`TEXT_INDEX`) is dropped. pg_trgm stays optional: with it, the
  per-column trigram indexes of migration 1 serve the list's substring search
  (``account_queries.LIST``) and ``word_similarity`` the search's similar-words stage. The reference
  says pg_trgm "may require superuser privileges", so nothing may fail without it:
  :data:`ENSURE_TRIGRAM` is one ``DO`` block that creates the extension only if the server
  offers it, inside a sub-block whose ``EXCEPTION`` clause turns "not allowed" into a notice
  (the sub-block is a savepoint, so the migration's transaction survives), and then creates
  each missing index, schema-qualifying the operator class with the extension's own schema.
  The feature runs it again at start-up (``queries.DETECT``).

A database from before migration 5 has no tokens: the new columns are NULL, so
:data:`UNINDEXED_INDEX` (a partial index of such rows by owner) lets a search read its user's
unindexed facts, and the feature's start-up writes their tokens in batches
(``Memory.index_unindexed``); then the partial index is empty.

Embeddings (migration 2, ``docs/memory.md``):

* **SQLite**: an ``embedding`` BLOB column (float32, little-endian, L2-normalised); the vector
  stage compares in numpy (``vector_queries.VECTOR_SEARCH``), over a per-user matrix kept in memory
  (``vector_cache``): migration 4's ``memory_vector_version`` and its triggers tell it when a
  kept matrix is out of date.
* **PostgreSQL**: :data:`ENSURE_VECTOR` creates the ``vector`` extension if the server offers it
  and this role may, as ``ENSURE_TRIGRAM`` does for pg_trgm (never failing without it). The
  ``embedding vector(N)`` column and its HNSW cosine index are not created here: ``N`` is the
  embedder's dimension, known only at start-up, so ``vector_queries.VECTOR_SETUP`` adds them
  then (and replaces the column when the dimension changed).

Facts have no foreign key to a users table: users live in the config file. Deleting a user's
data is ``queries.DELETE_USER``.
"""

from __future__ import annotations

from turnstile.runtime.store import Migration, MigrationSet

__all__ = [
    "ENSURE_SEARCH_INDEXES",
    "ENSURE_TRIGRAM",
    "ENSURE_VECTOR",
    "MEMORY",
    "RECENT_INDEX",
    "SEARCH_INDEX",
    "SEARCH_TABLE",
    "SEARCH_TEXT",
    "TEXT_INDEX",
    "TRIGRAM_INDEXES",
    "UNINDEXED_INDEX",
    "VECTOR_INDEX",
]

#: The HNSW cosine index on ``memory_facts.embedding`` (PostgreSQL with pgvector).
VECTOR_INDEX = "memory_facts_embedding_hnsw"


def _create_extension(name: str, without: str) -> str:
    """PL/pgSQL that creates extension ``name`` in ``public`` if the server offers it and this
    role may, else in the current schema, else raises a notice saying ``without``.

    An extension is one per database, wherever it lives, and goes with its schema: made in the
    schema a node's ``search_path`` names (one deployment's, or a test's), dropping that schema
    would drop it, and with it every other schema's indexes and queries that use it. So
    ``public`` first; the current schema only where ``public`` is missing or closed to this
    role. Queries name the extension's schema, wherever it is (``queries.DETECT``).
    """
    return f"""  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = '{name}')
     AND EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = '{name}') THEN
    BEGIN
      CREATE EXTENSION IF NOT EXISTS {name} WITH SCHEMA public;
    EXCEPTION WHEN OTHERS THEN
      BEGIN
        CREATE EXTENSION IF NOT EXISTS {name};
      EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'memory: cannot create {name} (%), {without}', SQLERRM;
      END;
    END;
  END IF;"""


#: Creates pgvector if the server offers it and this role may; never fails for want of it.
ENSURE_VECTOR = f"""DO $memory$
BEGIN
{_create_extension("vector", "search is lexical only")}
END
$memory$"""

#: The trigram indexes, by column.
TRIGRAM_INDEXES = {
    "category": "memory_facts_category_trgm",
    "key": "memory_facts_key_trgm",
    "value": "memory_facts_value_trgm",
}

_CREATE_INDEXES = "\n".join(
    f"""      IF to_regclass('{index}') IS NULL THEN
        EXECUTE format('CREATE INDEX {index} ON memory_facts USING gin ({column} %I.gin_trgm_ops)',
                       ext_schema);
      END IF;"""
    for column, index in TRIGRAM_INDEXES.items()
)

#: Creates pg_trgm if the server offers it and this role may, then the missing GIN indexes;
#: never fails for want of either (notices say why).
ENSURE_TRIGRAM = f"""DO $memory$
DECLARE
  ext_schema text;
BEGIN
{_create_extension("pg_trgm", "search uses plain ILIKE")}
  SELECT n.nspname INTO ext_schema
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
   WHERE e.extname = 'pg_trgm';
  IF ext_schema IS NOT NULL THEN
    BEGIN
{_CREATE_INDEXES}
    EXCEPTION WHEN OTHERS THEN
      RAISE NOTICE 'memory: cannot create trigram indexes (%)', SQLERRM;
    END;
  END IF;
END
$memory$"""

#: One text per fact (PostgreSQL): what migration 3's :data:`TEXT_INDEX` was on, and what the
#: similar-words stage compares with ``word_similarity``.
SEARCH_TEXT = "(category || ' ' || key || ' ' || value)"
#: The owner's facts newest first (btree), for a search that stops after ``limit`` matches.
RECENT_INDEX = "memory_facts_owner_recent"
#: The GIN trigram index on ``SEARCH_TEXT`` (pg_trgm only; migration 3, dropped by 5).
TEXT_INDEX = "memory_facts_text_trgm"

#: Migration 3's step, kept as it ran: creates :data:`TEXT_INDEX` when pg_trgm is installed
#: (in whatever schema) and the index is missing, then analyses the table; never fails for
#: want of it (a notice says why). Migration 5 drops the index; nothing runs this at start-up
#: any more.
ENSURE_SEARCH_INDEXES = f"""DO $memory$
DECLARE
  ext_schema text;
BEGIN
  SELECT n.nspname INTO ext_schema
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
   WHERE e.extname = 'pg_trgm';
  IF ext_schema IS NOT NULL AND to_regclass('{TEXT_INDEX}') IS NULL THEN
    BEGIN
      EXECUTE format('CREATE INDEX {TEXT_INDEX} ON memory_facts USING gin'
                     ' ({SEARCH_TEXT.replace("'", "''")} %I.gin_trgm_ops)', ext_schema);
      -- the expression's statistics come only from ANALYZE: without them the planner takes
      -- every word for a rare one and reads all its matches, whoever they belong to
      ANALYZE memory_facts;
    EXCEPTION WHEN OTHERS THEN
      RAISE NOTICE 'memory: cannot create {TEXT_INDEX} (%)', SQLERRM;
    END;
  END IF;
END
$memory$"""

_POSTGRES_V3 = (
    f"CREATE INDEX IF NOT EXISTS {RECENT_INDEX} ON memory_facts (owner, updated_at DESC, id DESC)",
    ENSURE_SEARCH_INDEXES,
)

_SQLITE_V1 = (
    """CREATE TABLE memory_facts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        owner TEXT NOT NULL,
        category TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        source TEXT NOT NULL,
        confidence INTEGER NOT NULL CHECK (confidence BETWEEN 0 AND 100),
        expires_at TEXT,
        last_verified_at TEXT,
        source_context TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (owner, category, key)
    )""",
    "CREATE INDEX memory_facts_expires ON memory_facts (expires_at) WHERE expires_at IS NOT NULL",
    """CREATE VIRTUAL TABLE memory_facts_fts USING fts5(
        category, key, value,
        content='memory_facts', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
    )""",
    """CREATE TRIGGER memory_facts_fts_insert AFTER INSERT ON memory_facts BEGIN
        INSERT INTO memory_facts_fts (rowid, category, key, value)
        VALUES (new.id, new.category, new.key, new.value);
    END""",
    """CREATE TRIGGER memory_facts_fts_delete AFTER DELETE ON memory_facts BEGIN
        INSERT INTO memory_facts_fts (memory_facts_fts, rowid, category, key, value)
        VALUES ('delete', old.id, old.category, old.key, old.value);
    END""",
    """CREATE TRIGGER memory_facts_fts_update AFTER UPDATE OF category, key, value
    ON memory_facts BEGIN
        INSERT INTO memory_facts_fts (memory_facts_fts, rowid, category, key, value)
        VALUES ('delete', old.id, old.category, old.key, old.value);
        INSERT INTO memory_facts_fts (rowid, category, key, value)
        VALUES (new.id, new.category, new.key, new.value);
    END""",
    """CREATE TABLE memory_summary (
        owner TEXT PRIMARY KEY,
        content TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE memory_session_state (
        session_key TEXT PRIMARY KEY,
        extracted_at TEXT NOT NULL
    )""",
)

_POSTGRES_V1 = (
    """CREATE TABLE memory_facts (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        owner TEXT NOT NULL,
        category TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        source TEXT NOT NULL,
        confidence SMALLINT NOT NULL CHECK (confidence BETWEEN 0 AND 100),
        expires_at TIMESTAMPTZ,
        last_verified_at TIMESTAMPTZ,
        source_context TEXT,
        created_at TIMESTAMPTZ NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL,
        UNIQUE (owner, category, key)
    )""",
    "CREATE INDEX memory_facts_expires ON memory_facts (expires_at) WHERE expires_at IS NOT NULL",
    ENSURE_TRIGRAM,
    """CREATE TABLE memory_summary (
        owner TEXT PRIMARY KEY,
        content TEXT NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL
    )""",
    """CREATE TABLE memory_session_state (
        session_key TEXT PRIMARY KEY,
        extracted_at TIMESTAMPTZ NOT NULL
    )""",
)

_BUMP = """INSERT INTO memory_vector_version (owner, version) VALUES ({row}.owner, 1)
        ON CONFLICT (owner) DO UPDATE SET version = version + 1"""

#: SQLite's vector stage keeps each user's embedding matrix in memory (``vector_cache``); these
#: triggers raise the user's version in the same transaction as every write that changes what
#: the matrix holds, whichever process makes it, so a kept matrix is used only while current.
_SQLITE_V4 = (
    """CREATE TABLE memory_vector_version (
        owner TEXT PRIMARY KEY,
        version INTEGER NOT NULL
    )""",
    f"""CREATE TRIGGER memory_vector_insert AFTER INSERT ON memory_facts
    WHEN new.embedding IS NOT NULL BEGIN
        {_BUMP.format(row="new")};
    END""",
    f"""CREATE TRIGGER memory_vector_delete AFTER DELETE ON memory_facts
    WHEN old.embedding IS NOT NULL BEGIN
        {_BUMP.format(row="old")};
    END""",
    f"""CREATE TRIGGER memory_vector_update AFTER UPDATE OF owner, embedding, expires_at
    ON memory_facts BEGIN
        {_BUMP.format(row="old")};
        {_BUMP.format(row="new")};
    END""",
)

#: The FTS5 table of migration 5 (SQLite): the tokens of ``tokens.fact_tokens``, per column.
SEARCH_TABLE = "memory_facts_search"
#: The GIN index on ``search_tokens`` (PostgreSQL, migration 5).
SEARCH_INDEX = "memory_facts_search_gin"
#: The owner's facts whose tokens are not written yet (both backends, migration 5): empty once
#: the start-up backfill is done, so a search asks it for nothing in a few microseconds.
UNINDEXED_INDEX = "memory_facts_unindexed"

_SEARCH_COLUMNS = "search_category, search_key, search_value"


def _fts(row: str) -> str:
    return ", ".join(f"{row}.{c.strip()}" for c in _SEARCH_COLUMNS.split(","))


#: Migration 5 (SQLite): the FTS5 index holds the owner-tagged tokens of ``tokens.py``, made in
#: Python by every write into three columns of ``memory_facts`` (the FTS table's external
#: content, so its delete sees exactly what was inserted); the triggers copy them in SQL, so
#: every process's writes keep the index in step. A row whose ``search_value`` is NULL (every
#: row of an older database, until the start-up backfill reaches it) is not in the index: the
#: ``WHEN`` clauses keep it out, and the search reads such rows of the owner through
#: ``UNINDEXED_INDEX``. The ``ascii`` tokenizer cuts only at ASCII non-alphanumerics, and a
#: token holds none, so FTS5 keeps each as it was made. ``rank`` is bm25 with the key weighing
#: double, as before, so ``ORDER BY rank LIMIT n`` ranks inside FTS5.
_SQLITE_V5 = (
    "ALTER TABLE memory_facts ADD COLUMN search_category TEXT",
    "ALTER TABLE memory_facts ADD COLUMN search_key TEXT",
    "ALTER TABLE memory_facts ADD COLUMN search_value TEXT",
    "DROP TRIGGER memory_facts_fts_insert",
    "DROP TRIGGER memory_facts_fts_delete",
    "DROP TRIGGER memory_facts_fts_update",
    "DROP TABLE memory_facts_fts",
    f"""CREATE VIRTUAL TABLE {SEARCH_TABLE} USING fts5(
        {_SEARCH_COLUMNS},
        content='memory_facts', content_rowid='id', tokenize='ascii'
    )""",
    f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rank) VALUES ('rank', 'bm25(1.0, 2.0, 1.0)')",
    f"""CREATE TRIGGER memory_facts_search_insert AFTER INSERT ON memory_facts
    WHEN new.search_value IS NOT NULL BEGIN
        INSERT INTO {SEARCH_TABLE} (rowid, {_SEARCH_COLUMNS}) VALUES (new.id, {_fts("new")});
    END""",
    f"""CREATE TRIGGER memory_facts_search_delete AFTER DELETE ON memory_facts
    WHEN old.search_value IS NOT NULL BEGIN
        INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rowid, {_SEARCH_COLUMNS})
        VALUES ('delete', old.id, {_fts("old")});
    END""",
    f"""CREATE TRIGGER memory_facts_search_update AFTER UPDATE OF {_SEARCH_COLUMNS}
    ON memory_facts BEGIN
        INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rowid, {_SEARCH_COLUMNS})
        SELECT 'delete', old.id, {_fts("old")} WHERE old.search_value IS NOT NULL;
        INSERT INTO {SEARCH_TABLE} (rowid, {_SEARCH_COLUMNS})
        SELECT new.id, {_fts("new")} WHERE new.search_value IS NOT NULL;
    END""",
    f"CREATE INDEX {UNINDEXED_INDEX} ON memory_facts (owner) WHERE search_value IS NULL",
)

#: Migration 5 (PostgreSQL): the same tokens as a ``tsvector`` (``array_to_tsvector`` of the
#: tokens made in Python: no parser, no dictionary, so PostgreSQL keeps each as it was made),
#: with a GIN index: core PostgreSQL, so every server has it, pgserver too. ``fastupdate`` is
#: off: a search never scans a pending list of recent inserts, at some cost to writes. The
#: trigram index on the whole text (migration 3) served the regex search this replaces: it
#: goes (the per-column ones stay, for the list's substring search). The new column is NULL
#: in every existing row, so the index is built empty; the start-up backfill fills it.
_POSTGRES_V5 = (
    "ALTER TABLE memory_facts ADD COLUMN search_tokens tsvector",
    f"CREATE INDEX {SEARCH_INDEX} ON memory_facts USING gin (search_tokens)"
    " WITH (fastupdate = off)",
    f"CREATE INDEX {UNINDEXED_INDEX} ON memory_facts (owner) WHERE search_tokens IS NULL",
    f"DROP INDEX IF EXISTS {TEXT_INDEX}",
)

#: The feature's migration set.
MEMORY = MigrationSet(
    "memory",
    (
        Migration(1, "facts, summary, session state", sqlite=_SQLITE_V1, postgres=_POSTGRES_V1),
        Migration(
            2,
            "embeddings",
            sqlite=("ALTER TABLE memory_facts ADD COLUMN embedding BLOB",),
            postgres=(ENSURE_VECTOR,),
        ),
        Migration(3, "search indexes", sqlite=(), postgres=_POSTGRES_V3),
        Migration(4, "vector versions", sqlite=_SQLITE_V4, postgres=()),
        Migration(5, "search tokens per user", sqlite=_SQLITE_V5, postgres=_POSTGRES_V5),
    ),
)
