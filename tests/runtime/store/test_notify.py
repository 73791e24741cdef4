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

from turnstile.runtime.errors import InvalidArgument

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
