"""Notifications between nodes: ``Store.notify`` / ``Store.listen``.

On PostgreSQL a listener holds a connection of its own; when that connection is cut (here:
``pg_terminate_backend``, as a proxy or a failover would) it reconnects and says so with
``None``, so that the caller looks for what it missed. On SQLite nobody else listens.
"""

from __future__ import annotations

import secrets

import pytest
import trio
import trio.testing

from tests.runtime.store._support import pg_schema
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.store import open_store

#: a hang guard (real clock: PostgreSQL's listener reconnects after a second's pause), not a
#: promise: generous, so that a 2-core box at load 8 passes
WAIT = 60


class Heard:
    def __init__(self) -> None:
        self.messages: list[str | None] = []
        self._changed = trio.Event()

    def __call__(self, payload: str | None) -> None:
        self.messages.append(payload)
        self._changed.set()

    async def until(self, count: int) -> None:
        with trio.fail_after(WAIT):
            while len(self.messages) < count:
                self._changed = trio.Event()
                await self._changed.wait()


async def test_bad_channels_and_payloads_are_refused(store):
    with pytest.raises(InvalidArgument) as bad:
        await store.notify("Bad-Channel", "x")
    assert bad.value.field == "channel"
    with pytest.raises(InvalidArgument) as long:
        await store.notify("turnstile", "x" * 8000)
    assert long.value.field == "payload"


async def test_a_listener_hears_and_on_postgres_reconnects_when_its_connection_is_cut(
    store, backend
):
    channel = f"t_{secrets.token_hex(4)}"
    heard = Heard()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.listen, channel, heard)
        await heard.until(1)  # connected: look for what is there
        await store.notify(channel, "one")
        if backend.kind == "sqlite":  # one file, one node: nobody else to hear
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
            assert heard.messages == [None]
            return
        await heard.until(2)
        terminated = await backend.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            f"turnstile listen {channel}",
        )
        assert terminated == [(True,)]
        await heard.until(3)  # reconnected: anything sent meanwhile may be lost
        await store.notify(channel, "two")
        await heard.until(4)
        nursery.cancel_scope.cancel()
    assert heard.messages == [None, "one", None, "two"]


@pytest.mark.postgres
async def test_two_schemas_of_one_database_do_not_hear_each_other(pg_dsn):
    """Notifications are per database in PostgreSQL, so two deployments in two schemas of one
    database (``?search_path=``) heard each other's under one channel name: a policy change in
    one made the other's holder of the same session id store its policy again (the flaky
    memory-sweep test saw the write), and a delete request reached the other's holder. Each
    schema has its own channel."""
    channel = f"t_{secrets.token_hex(4)}"
    heard_a, heard_b, heard_a2 = Heard(), Heard(), Heard()
    async with (
        pg_schema(pg_dsn) as (url_a, _),
        pg_schema(pg_dsn) as (url_b, _),
        open_store(url_a, name="a") as a,
        open_store(url_a, name="a2") as a2,
        open_store(url_b, name="b") as b,
        trio.open_nursery() as nursery,
    ):
        for store, heard in ((a, heard_a), (a2, heard_a2), (b, heard_b)):
            nursery.start_soon(store.listen, channel, heard)
            await heard.until(1)  # connected
        await b.notify(channel, "from b")
        await a.notify(channel, "from a")
        await heard_a2.until(2)
        await heard_b.until(2)
        await a2.notify(channel, "from a2")
        await heard_a.until(3)
        nursery.cancel_scope.cancel()
    # each heard its own schema's, in order, and nothing of the other's
    assert heard_a.messages == [None, "from a", "from a2"]
    assert heard_a2.messages == [None, "from a", "from a2"]
    assert heard_b.messages == [None, "from b"]
