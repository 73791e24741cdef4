"""The migration runner: named sets after the kernel's, on both backends."""

from __future__ import annotations

import pytest

from tests.runtime.store._support import T0, ManualClock
from turnstile.runtime.errors import MigrationError
from turnstile.runtime.store import SCHEMA_VERSION, Migration, MigrationSet, open_store

# Each step notes that it ran in notes_log, so a test can see which steps ran, and how often.
STEP_1 = Migration(
    1,
    "notes",
    (
        "CREATE TABLE notes_log (step TEXT NOT NULL)",
        "INSERT INTO notes_log (step) VALUES ('one')",
    ),
)
STEP_2 = Migration(  # a step whose SQL differs per backend
    2,
    "note_bodies",
    sqlite=(
        "CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT NOT NULL) STRICT",
        "INSERT INTO notes_log (step) VALUES ('two')",
    ),
    postgres=(
        'CREATE TABLE notes (id text COLLATE "C" PRIMARY KEY, body text NOT NULL)',
        "INSERT INTO notes_log (step) VALUES ('two')",
    ),
)
NOTES_V1 = MigrationSet("notes", [STEP_1])
NOTES_V2 = MigrationSet("notes", [STEP_1, STEP_2])


def table(store) -> list[tuple[str, int, str]]:
    return [(m.set_name, m.version, m.name) for m in store]


def kernel_rows() -> list[tuple[str, int, str]]:
    return [
        ("kernel", 1, "initial"),
        ("kernel", 2, "one_pending_recall"),
        ("kernel", 3, "kv"),
        ("kernel", 4, "inbox_idempotency_key"),
        ("kernel", 5, "nodes"),
        ("kernel", 6, "session_leases"),
    ]


async def test_a_set_runs_once_and_a_new_step_runs_alone(backend):
    clock = ManualClock()
    async with open_store(backend.url, clock=clock, migrations=[NOTES_V1]) as store:
        first = await store.migrations()
    assert table(first) == [*kernel_rows(), ("notes", 1, "notes")]
    assert await backend.sql("SELECT step FROM notes_log") == [("one",)]

    clock.advance(days=1)
    async with open_store(backend.url, clock=clock, migrations=[NOTES_V1]) as store:
        assert await store.migrations() == first  # idempotent: nothing ran again
    assert await backend.sql("SELECT step FROM notes_log") == [("one",)]

    clock.advance(days=1)
    async with open_store(backend.url, clock=clock, migrations=[NOTES_V2]) as store:
        after = await store.migrations()
    assert table(after) == [*kernel_rows(), ("notes", 1, "notes"), ("notes", 2, "note_bodies")]
    assert after[:-1] == first  # the earlier steps keep their rows and times
    assert after[-1].applied_at == T0.replace(day=3)
    assert sorted(await backend.sql("SELECT step FROM notes_log")) == [("one",), ("two",)]
    assert await backend.count("notes") == 0
    assert await backend.count("schema_migrations") == SCHEMA_VERSION + 2

    # A start-up without the set leaves its rows alone; the kernel is still first.
    async with open_store(backend.url) as store:
        assert table(await store.migrations()) == table(after)


async def test_sets_run_in_the_order_given_after_the_kernel(backend):
    later = MigrationSet("a_later", [Migration(1, "uses_notes", ("DELETE FROM notes_log",))])
    async with open_store(backend.url, migrations=[NOTES_V2, later]) as store:
        rows = table(await store.migrations())
    # listed kernel first, then by set name; "a_later" ran after "notes", whose table it needs
    kernel = len(kernel_rows())
    assert rows[:kernel] == kernel_rows()
    assert rows[kernel:] == [
        ("a_later", 1, "uses_notes"),
        ("notes", 1, "notes"),
        ("notes", 2, "note_bodies"),
    ]
    assert await backend.count("notes_log") == 0


async def test_a_newer_set_or_a_renamed_step_is_refused(backend):
    async with open_store(backend.url, migrations=[NOTES_V2]):
        pass
    with pytest.raises(
        MigrationError, match=r"^schema version 2 of set 'notes' is newer than this code \(1\)$"
    ):
        async with open_store(backend.url, migrations=[NOTES_V1]):
            pass
    renamed = MigrationSet("notes", [Migration(1, "other", STEP_1.statements), STEP_2])
    with pytest.raises(MigrationError, match=r"^migration notes 1 is recorded as 'notes', but"):
        async with open_store(backend.url, migrations=[renamed]):
            pass


async def test_a_failing_step_applies_nothing(backend):
    broken = MigrationSet("notes", [STEP_1, Migration(2, "broken", ("CREATE TABLE (",))])
    with pytest.raises(MigrationError, match=f"^{backend.kind}: migration failed: "):
        async with open_store(backend.url, migrations=[broken]):
            pass
    async with open_store(backend.url) as store:  # the kernel alone opens fine
        assert table(await store.migrations()) == kernel_rows()
    rows = await backend.sql("SELECT count(*) FROM schema_migrations WHERE set_name = 'notes'")
    assert rows == [(0,)]


async def test_a_table_from_before_sets_is_upgraded(backend, clock):
    async with backend.open(clock) as store:
        first = await store.migrations()
    # Put schema_migrations back the way earlier releases made it: version alone is the key.
    if backend.kind == "sqlite":
        legacy = "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL"
        statements = [f"CREATE TABLE legacy ({legacy}) STRICT"]
    else:
        legacy = "version integer NOT NULL, name text NOT NULL, applied_at timestamptz NOT NULL"
        statements = [f"CREATE TABLE legacy ({legacy})"]
    statements += [
        "INSERT INTO legacy SELECT version, name, applied_at FROM schema_migrations",
        "DROP TABLE schema_migrations",
        "ALTER TABLE legacy RENAME TO schema_migrations",
    ]
    if backend.kind == "postgres":
        statements.append(
            "ALTER TABLE schema_migrations ADD CONSTRAINT schema_migrations_pkey"
            " PRIMARY KEY (version)"
        )
    for sql in statements:
        await backend.sql(sql)
    async with backend.open(clock) as store:
        assert await store.migrations() == first  # kept as the kernel's, nothing re-applied
    async with open_store(backend.url, clock=clock, migrations=[NOTES_V1]) as store:
        assert table(await store.migrations()) == [*kernel_rows(), ("notes", 1, "notes")]


def test_sets_are_checked_when_made():
    with pytest.raises(ValueError, match="consecutive from 1"):
        MigrationSet("x", [Migration(2, "two", ("SELECT 1",))])
    with pytest.raises(ValueError, match="non-empty"):
        MigrationSet("", [])
    with pytest.raises(TypeError, match="not a str"):
        Migration(1, "one", "SELECT 1")  # type: ignore[arg-type]
    assert Migration(1, "one", ("a",), sqlite=("b",)).statements_for("postgres") == ("a",)
    assert Migration(1, "one", ("a",), sqlite=("b",)).statements_for("sqlite") == ("b",)


@pytest.mark.parametrize(
    ("migrations", "error", "message"),
    [
        ([MigrationSet("kernel")], ValueError, "'kernel' given twice"),
        ([NOTES_V1, NOTES_V2], ValueError, "'notes' given twice"),
        (NOTES_V1, TypeError, "not one MigrationSet"),
        (["notes"], TypeError, "not str"),
    ],
)
async def test_bad_sets_are_refused_before_opening(tmp_path, migrations, error, message):
    with pytest.raises(error, match=message):
        async with open_store(f"sqlite:///{tmp_path}/s.db", migrations=migrations):
            pass
    assert not (tmp_path / "s.db").exists()
