"""A throw-away PostgreSQL 16 with pgvector, from the ``pgserver`` package (the machine's own
PostgreSQL has no pgvector). One server per test run; each test gets a database of its own,
so the memory migration creates the ``vector`` extension itself, as it would in production."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

import trio

from tests.runtime.store._support import pg_run

__all__ = ["PgVectorServer", "pgvector_server"]


class PgVectorServer:
    """A running pgserver: ``admin_url`` reaches its ``postgres`` database over the socket."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self.admin_url = self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql://postgres:@/{database}?host={quote(str(self.pgdata), safe='/')}"

    @asynccontextmanager
    async def database(self) -> AsyncIterator[str]:
        """A fresh database's URL, dropped afterwards."""
        name = f"t_{secrets.token_hex(6)}"
        await pg_run(self.admin_url, f"CREATE DATABASE {name}")
        try:
            yield self.url(name)
        finally:
            with trio.CancelScope(shield=True):
                await pg_run(self.admin_url, f"DROP DATABASE {name} WITH (FORCE)")


def pgvector_server() -> Iterator[PgVectorServer]:
    """Start pgserver in a temporary directory of its own (blocking, under a second); stop it
    and delete the directory after.

    Not under pytest's ``tmp_path_factory``: pytest deletes all but its three newest base
    directories when a run starts, so a second pytest run would pull the data directory from
    under a running server.
    """
    directory = Path(tempfile.mkdtemp(prefix="turnstile-pgvector-"))
    pgdata = directory / "pgdata"
    with warnings.catch_warnings():
        # platformdirs, asked for a runtime directory where XDG_RUNTIME_DIR is unset (CI)
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import pgserver

        server = pgserver.get_server(pgdata, cleanup_mode="delete")
    try:
        yield PgVectorServer(pgdata)
    finally:
        server.cleanup()
        shutil.rmtree(directory, ignore_errors=True)
