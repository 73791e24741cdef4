"""A session deleted through one node is gone on every node (two nodes in-process on one
PostgreSQL schema, session leases): each node caches which sessions exist
(``actors/sessions/owners.py``), and a delete through another node must not leave a copy that
lets requests through, nor rows that reach a later session of the same name.

Node ``a`` knows ada's session ``s`` (created through it, so cached there); nobody holds it,
so ``b`` activates and deletes it itself when asked: nothing of the delete passes through ``a``
except ``b``'s announcement (``g <key>``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import pytest
import trio

from tests.support.polling import eventually
from tests.support.sessions import Recorder
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import Node, open_node
from turnstile.runtime.errors import NotFound

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

ADA = "sessions-cluster-ada-token-0123456789"
PR3 = "github:acme/app#3"
#: how long the tests wait for an announcement: a hang guard (real clock), generous for a
#: 2-core box at load 8. What they see is the announcement's work, not an entry running out:
#: the nodes keep what they cache for ``KEPT_SECONDS``, far longer than any test here runs
#: (``owners.OWNER_CACHE_SECONDS`` is 10 s, which a loaded box could reach before the
#: announcement: the test would then pass for the wrong reason, or fail with a shorter wait)
HEARD_SECONDS = 60.0
KEPT_SECONDS = 3600.0


def config(url: str, node_id: str) -> Config:
    return Config(store=url, node=NodeConfig(id=node_id, lease_seconds=600, placement="leases"))


class Pair:
    """Nodes ``a`` and ``b`` on one store and an HTTP client of each, as ada."""

    a: Node
    b: Node
    on_a: httpx.AsyncClient
    on_b: httpx.AsyncClient


@asynccontextmanager
async def two_nodes(store_url: str) -> AsyncIterator[Pair]:
    async with AsyncExitStack() as stack:
        pair = Pair()
        for name in ("a", "b"):
            node = await stack.enter_async_context(
                open_node(config(store_url, name), tokens={ADA: "ada"}, serve=False)
            )
            http = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=node.app),
                    base_url=f"http://{name}",
                    headers={"Authorization": f"Bearer {ADA}"},
                )
            )
            node.directory.owners.seconds = KEPT_SECONDS  # before anything is cached
            setattr(pair, name, node)
            setattr(pair, f"on_{name}", http)
        await pair.a.directory.create_session("ada", session_id="s")
        assert (await pair.on_a.get("/sessions/s/jobs")).json() == {"jobs": []}  # a knows s
        yield pair


def silence(node: Node) -> list[str]:
    """``node`` sends no notification from now on; returns what it would have sent."""
    dropped: list[str] = []

    async def notify(channel: str, payload: str) -> None:
        dropped.append(payload)

    node.store.notify = notify  # type: ignore[method-assign]
    return dropped


async def test_a_session_deleted_through_another_node_is_gone_there_and_its_name_starts_afresh(
    store_url,
):
    async with two_nodes(store_url) as nodes:
        assert (await nodes.on_b.delete("/sessions/s")).status_code == 204
        assert not nodes.a.directory.registry.is_active("session:ada/s")  # b deleted it itself

        async def jobs_gone_on_a() -> bool:
            return (await nodes.on_a.get("/sessions/s/jobs")).status_code == 404

        await eventually(jobs_gone_on_a, seconds=HEARD_SECONDS)
        bound = await nodes.on_a.post("/sessions/s/bindings", json={"source": PR3})
        assert bound.status_code == 404, bound.text
        assert (await nodes.on_a.get("/sessions/s")).status_code == 404

        assert (await nodes.on_a.post("/sessions", json={"id": "s"})).status_code == 201
        for http in (nodes.on_a, nodes.on_b):  # the new s has nothing of the old one
            assert (await http.get("/sessions/s/bindings")).json() == {"bindings": []}
            assert (await http.get("/sessions/s/jobs")).json() == {"jobs": []}


async def test_a_delete_through_another_node_deletes_once_the_dead_holder_s_lease_expired(
    store_url,
):
    """Found by the crash harness's survivor runs (``delete``): the session's holder died, and
    a client asked another node to delete the session before the dead node's lease expired.
    That node announced the delete, which nobody carried out, and answered ``409 busy`` after
    10 s. Now it takes the session once the lease expired and deletes it itself."""
    async with two_nodes(store_url) as nodes:
        store = nodes.b.store
        ghost, _ = await store.register_node("ghost", lease_seconds=2)  # it never beats again
        assert (await store.acquire_session("ada/s", ghost.ref)).acquired
        with trio.fail_after(HEARD_SECONDS):
            response = await nodes.on_b.delete("/sessions/s")
        assert response.status_code == 204, response.text
        with pytest.raises(NotFound):
            await store.get_session("ada/s")


async def test_a_lost_announcement_lets_nothing_create_rows_under_the_deleted_session(
    store_url,
):
    async with two_nodes(store_url) as nodes:
        silence(nodes.b)  # a never hears of the delete
        assert (await nodes.on_b.delete("/sessions/s")).status_code == 204

        # a request that creates rows under the session reads the store, not a's cache: a
        # route (bindings, watchers) or a tool
        bound = await nodes.on_a.post("/sessions/s/bindings", json={"source": PR3})
        assert bound.status_code == 404, bound.text
        with pytest.raises(NotFound, match="no session with id 's'"):
            await nodes.a.directory.call_tool("ada", "s", "bind_source", {"source": PR3})

        assert (await nodes.on_b.post("/sessions", json={"id": "s"})).status_code == 201
        assert (await nodes.on_a.get("/sessions/s/bindings")).json() == {"bindings": []}


async def test_a_reconnection_forgets_what_a_lost_announcement_would_have_said(store_url):
    async with two_nodes(store_url) as nodes:
        silence(nodes.b)
        assert (await nodes.on_b.delete("/sessions/s")).status_code == 204

        # a's listener reconnects, as after a lost connection: every session is read again
        nodes.a.directory.remote._hear(None)

        async def jobs_gone_on_a() -> bool:
            return (await nodes.on_a.get("/sessions/s/jobs")).status_code == 404

        await eventually(jobs_gone_on_a, seconds=HEARD_SECONDS)
        bound = await nodes.on_a.post("/sessions/s/bindings", json={"source": PR3})
        assert bound.status_code == 404, bound.text


async def test_a_follower_of_a_session_deleted_and_made_again_is_told_it_was_deleted(store_url):
    async with two_nodes(store_url) as nodes:
        await nodes.b.directory.attach("ada", "s", Recorder())  # b holds s
        follower = Recorder()
        await nodes.a.directory.attach("ada", "s", follower)  # a follows it from the store

        assert (await nodes.on_b.delete("/sessions/s")).status_code == 204
        assert (await nodes.on_b.post("/sessions", json={"id": "s"})).status_code == 201
        sent = await nodes.on_b.post("/sessions/s/messages", json={"content": "later"})
        assert sent.status_code == 202, sent.text
        with trio.move_on_after(HEARD_SECONDS):
            await follower.deleted_event.wait()
        assert follower.deleted_event.is_set()
        assert follower.count(b"later") == 0  # nothing of the later session reached it
