"""The memory feature's tables: its own migration set, ``"memory"``.

=========================  ==============================================================
``memory_facts``           one fact of one user: ``(owner, category, key)`` is unique
``memory_summary``         one narrative summary per user
``memory_session_state``   when a session was last processed by extraction (``extracted_at``)
=========================  ==============================================================

Lexical search needs an index of its own on each backend:

* **SQLite**: ``memory_facts_fts``, an FTS5 table over category, key and value (external
  content: it stores only the index), kept in step by three triggers; ranked with ``bm25``.
* **PostgreSQL**: GIN trigram indexes on category, key and value when the ``pg_trgm``
  extension exists or can be created; otherwise none, and search is plain ``ILIKE``. The
  reference says pg_trgm "may require superuser privileges", so the migration must not fail
  without it: :data:`ENSURE_TRIGRAM` is one ``DO`` block that creates the extension only if
  the server offers it, inside a sub-block whose ``EXCEPTION`` clause turns "not allowed" into
  a notice (the sub-block is a savepoint, so the migration's transaction survives), and then
  creates each missing index, schema-qualifying the operator class with the extension's own
  schema (it need not be on the ``search_path``). The feature runs the same block again at
  start-up, so an extension a DBA installs later gets its indexes at the next start, and then
  decides the search path from what exists (``queries.DETECT``).

Search at scale (migration 3, ``docs/memory.md``): the lexical search on PostgreSQL
(``queries.SEARCH``) matches one text per fact, :data:`SEARCH_TEXT` (category, key and value
joined by spaces), newest first within a stage, so it needs two indexes: :data:`RECENT_INDEX`,
a btree on ``(owner, updated_at DESC, id DESC)`` that lets a search of a common word walk the
owner's facts newest first and stop after ``limit`` matches (created on every server), and
:data:`TEXT_INDEX`, a GIN trigram index on exactly the expression the search filters on, which
finds a rare word without reading the owner's other facts (only with pg_trgm:
:data:`ENSURE_SEARCH_INDEXES`, run by the migration and again at every start, as
``ENSURE_TRIGRAM`` is). The per-column trigram indexes of migration 1 stay: the list's
substring search (``queries.LIST``) uses them.

Embeddings (migration 2, ``docs/memory.md``):

* **SQLite**: an ``embedding`` BLOB column (float32, little-endian, L2-normalised); the vector
  stage compares in numpy (``queries.VECTOR_SEARCH``), over a per-user matrix kept in memory
  (``vector_cache``): migration 4's ``memory_vector_version`` and its triggers tell it when a
  kept matrix is out of date.
* **PostgreSQL**: :data:`ENSURE_VECTOR` creates the ``vector`` extension if the server offers it
  and this role may, as ``ENSURE_TRIGRAM`` does for pg_trgm (never failing without it). The
  ``embedding vector(N)`` column and its HNSW cosine index are not created here: ``N`` is the
  embedder's dimension, known only at start-up, so ``queries.VECTOR_SETUP`` adds them then (and
  replaces the column when the dimension changed).

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
    "SEARCH_TEXT",
    "TEXT_INDEX",
    "TRIGRAM_INDEXES",
    "VECTOR_INDEX",
]

#: The HNSW cosine index on ``memory_facts.embedding`` (PostgreSQL with pgvector).
VECTOR_INDEX = "memory_facts_embedding_hnsw"

#: Creates pgvector if the server offers it and this role may; never fails for want of it.
ENSURE_VECTOR = """DO $memory$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')
     AND EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
    BEGIN
      CREATE EXTENSION IF NOT EXISTS vector;
    EXCEPTION WHEN OTHERS THEN
      RAISE NOTICE 'memory: cannot create vector (%), search is lexical only', SQLERRM;
    END;
  END IF;
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
  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm')
     AND EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
    BEGIN
      CREATE EXTENSION IF NOT EXISTS pg_trgm;
    EXCEPTION WHEN OTHERS THEN
      RAISE NOTICE 'memory: cannot create pg_trgm (%), search uses plain ILIKE', SQLERRM;
    END;
  END IF;
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

#: What the lexical search matches on PostgreSQL: one text per fact. ``TEXT_INDEX`` is on exactly
#: this expression (the planner uses an expression index only for the same expression), so the
#: queries write it with this text and no table alias.
SEARCH_TEXT = "(category || ' ' || key || ' ' || value)"
#: The owner's facts newest first (btree), for a search that stops after ``limit`` matches.
RECENT_INDEX = "memory_facts_owner_recent"
#: The GIN trigram index on ``SEARCH_TEXT`` (pg_trgm only).
TEXT_INDEX = "memory_facts_text_trgm"

#: Creates :data:`TEXT_INDEX` when pg_trgm is installed (in whatever schema) and the index is
#: missing, then analyses the table (the planner needs the expression's statistics to tell a
#: common word from a rare one); never fails for want of it (a notice says why; the start-up
#: log names what is missing, ``queries.DETECT``).
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
    ),
)
