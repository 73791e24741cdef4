"""Scheduling's tables moved from the kernel's migration set to scheduling's own
(``actors/scheduling/schema.py``) without a data migration: a store an earlier release migrated
opens unchanged, and its schema is then the same as a fresh store's, on both backends.

"Earlier release" is checked two ways: a database migrated by the kernel set as it was
(``tests/fixtures/release_kernel.py``, applied alone, on SQLite and PostgreSQL), and the store
the release before issue 22 wrote (``tests/fixtures/release-f7b1e2e.sqlite``). The schemas are
compared object by object: SQLite's ``sqlite_master`` (the SQL of each table and index,
whitespace and ``IF NOT EXISTS`` aside), PostgreSQL's columns, constraints and indexes.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.fixtures import release_kernel
from tests.runtime.store._support import T0, ManualClock, pg_run, pg_schema
from turnstile.actors.scheduling.schema import SCHEDULING
from turnstile.actors.scheduling.store import JobStore
from turnstile.runtime.store import SCHEMA_VERSION, open_store

FIXTURE = Path(__file__).parents[2] / "fixtures" / "release-f7b1e2e.sqlite"
#: What the kernel and scheduling record once a store is up to date.
RECORDED = [*(("kernel", v) for v in range(1, SCHEMA_VERSION + 1)), ("scheduling", 1)]


def sqlite_schema(path: str, tables: set[str] | None = None) -> dict[tuple[str, str], str]:
    """``(type, name) -> SQL`` of every table and index (of ``tables`` only, if given)."""
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master"
            " WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
    return {
        (kind, name): re.sub(r"\s+", " ", (sql or "").replace("IF NOT EXISTS ", "")).strip()
        for kind, name, table, sql in rows
        if tables is None or table in tables
    }


async def pg_schema_of(dsn: str, schema: str) -> dict[str, list[tuple]]:
    """The columns, constraints and indexes of ``schema``'s tables (``schema.`` dropped)."""
    columns = await pg_run(
        dsn,
        "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
        " column_default, collation_name, is_identity, identity_generation"
        " FROM information_schema.columns WHERE table_schema = $1 ORDER BY 1, 2",
        schema,
    )
    constraints = await pg_run(
        dsn,
        "SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k"
        " JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 ORDER BY 1, 2",
        schema,
    )
    indexes = await pg_run(
        dsn,
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1, 2",
        schema,
    )
    return {
        "columns": [tuple(r) for r in columns],
        "constraints": [(t, c, d.replace(f"{schema}.", "")) for t, c, d in constraints],
        "indexes": [(t, i, d.replace(f"{schema}.", "")) for t, i, d in indexes],
    }


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


async def test_a_store_the_old_kernel_migrated_opens_unchanged_with_a_fresh_stores_schema(
    kind, tmp_path, request
):
    if kind == "sqlite":
        old_url, new_url = f"sqlite:///{tmp_path}/old.db", f"sqlite:///{tmp_path}/new.db"
        await _old_then_new(old_url)
        async with open_store(new_url, migrations=[SCHEDULING]):
            pass
        old = sqlite_schema(old_url.removeprefix("sqlite:///"))
        new = sqlite_schema(new_url.removeprefix("sqlite:///"))
        assert ("table", "jobs") in new and ("index", "jobs_one_pending_recall_idx") in new
        assert old == new
        return
    dsn = request.getfixturevalue("pg_dsn")
    async with pg_schema(dsn) as (old_url, old_name), pg_schema(dsn) as (new_url, new_name):
        await _old_then_new(old_url)
        async with open_store(new_url, migrations=[SCHEDULING]):
            pass
        old, new = await pg_schema_of(dsn, old_name), await pg_schema_of(dsn, new_name)
        assert any(index[1] == "jobs_one_pending_recall_idx" for index in new["indexes"])
        assert old == new


async def _old_then_new(url: str) -> None:
    """A database the old kernel set migrated, with a job fired in it, opened by this code:
    nothing is lost, scheduling's step is recorded, and the job fires on."""
    # a fresh database: the old kernel alone makes every table, jobs included
    if url.startswith("sqlite"):
        from turnstile.runtime.store.sqlite import SQLiteBackend

        backend = SQLiteBackend(url.removeprefix("sqlite:///"), synchronous="FULL")
        await backend.open([release_kernel.KERNEL], T0)
        await backend.aclose()
    else:
        from turnstile.runtime.store.postgres import open_postgres_backend

        async with open_postgres_backend(url, [release_kernel.KERNEL], T0):
            pass
    clock = ManualClock()
    # this code's first open records scheduling's step, which finds the tables (IF NOT EXISTS);
    # the rows the release wrote are kept (test_the_release_store_opens_unchanged_...)
    async with open_store(url, clock=clock, migrations=[SCHEDULING]) as store:
        assert [(m.set_name, m.version) for m in await store.migrations()] == RECORDED
        jobs = JobStore(store)
        await store.create_session("s", "ada")
        await jobs.create_job("j", kind="once", spec={}, session_id="s", next_fire_at=T0)
        fired = await jobs.fire_job("j", T0, None, input=("once", {}))
        assert fired is not None and fired.run.input_id == fired.input.id
    async with open_store(url, clock=clock, migrations=[SCHEDULING]) as store:
        assert [(m.set_name, m.version) for m in await store.migrations()] == RECORDED
        assert (await JobStore(store).list_runs("j"))[0].id == fired.run.id


async def test_the_release_store_opens_unchanged_with_a_fresh_stores_schema(tmp_path):
    # tests/fixtures/release-f7b1e2e.sqlite: the kernel's old steps made its jobs tables
    old_path, new_path = tmp_path / "release.sqlite", tmp_path / "new.db"
    shutil.copy(FIXTURE, old_path)
    with closing(sqlite3.connect(old_path)) as conn:
        jobs_before = conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()
        runs_before = conn.execute("SELECT * FROM job_runs ORDER BY id").fetchall()
        assert jobs_before and runs_before
        assert conn.execute("SELECT count(*) FROM schema_migrations WHERE set_name = 'scheduling'"
                            ).fetchone() == (0,)  # fmt: skip
    async with open_store(f"sqlite:///{old_path}", migrations=[SCHEDULING]) as store:
        recorded = [(m.set_name, m.version) for m in await store.migrations()]
        assert [r for r in recorded if r[0] in ("kernel", "scheduling")] == RECORDED
        assert sorted(job.id for job in await JobStore(store).list_jobs()) == sorted(
            row[0] for row in jobs_before
        )
    async with open_store(f"sqlite:///{new_path}", migrations=[SCHEDULING]):
        pass
    new = sqlite_schema(str(new_path))
    tables = {name for kind, name in new if kind == "table"}
    assert sqlite_schema(str(old_path), tables) == new
    with closing(sqlite3.connect(old_path)) as conn:
        assert conn.execute("SELECT * FROM jobs ORDER BY id").fetchall() == jobs_before
        assert conn.execute("SELECT * FROM job_runs ORDER BY id").fetchall() == runs_before
