"""Background tasks outlive nothing: a task whose node ends before it does is closed as
``lost``, once, and its session is told (issue 14: "background tasks of a dead node are
closed as lost and notified").

* One node on a SQLite file: the node stops while a task runs; at its next start the task
  reads ``lost`` and the session has been told. (A real ``kill -9`` of ``turnstile serve`` is
  tests/e2e/test_background_lost.py.)
* Two nodes in-process on PostgreSQL (as tests/actors/sessions/test_placement.py): a task runs on
  ``a``; ``a``'s lease is made to run out behind its back (what a node paused or killed looks
  like to the others); ``b``'s sweep declares it dead, closes the task as lost once, and tells
  the session, which ``b`` then holds. Nothing here is an event of the test's own: the nodes
  sweep on their own clocks, so the test looks at the store with a deadline.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx
import msgspec
import pytest
import trio

from tests.actors.sessions.test_placement import expire_lease
from tests.runtime.store._support import Backend
from tests.support.polling import eventually
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.execution.queries import LIST
from turnstile.actors.feature import NodeContext
from turnstile.actors.node import default_features, make_agent, open_node
from turnstile.runtime.errors import StoreError

TOKEN = "background-lost-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class NoArgs(msgspec.Struct, forbid_unknown_fields=True):
    pass


class Hang:
    """A feature with one tool, ``test.hang``, that never ends."""

    name = "hang"

    def __init__(self) -> None:
        self.running = trio.Event()

    async def start(self, node: NodeContext) -> None:
        async def hang(call, args: NoArgs):
            self.running.set()
            await trio.sleep_forever()

        node.tools.register("test.hang", NoArgs, hang, "Never ends.")

    def routes(self, node: NodeContext) -> list:
        return []


def features(config: Config, hang: Hang) -> list:
    chosen = default_features(make_agent(config))
    return [*chosen[:-1], hang, chosen[-1]]


async def notices(node, key: str) -> list[str]:
    """The contents of the notices the session was told (each an input of its own, or folded
    into a turn)."""
    items = await node.store.list_inputs(key)
    return [i.payload["content"] for i in items if i.source == "notification"]


async def call(node, key: str, tool: str, **arguments):
    return await node.tools.call(key, key.split("/")[0], tool, arguments)


async def test_a_task_its_node_stopped_before_it_ended_is_lost_at_the_next_start(tmp_path):
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    hang = Hang()
    async with open_node(config, features=features(config, hang), serve=False) as node:
        await node.directory.create_session("ada", session_id="s")
        await node.directory.create_session("ada", session_id="t")
        started = await call(node, "ada/s", "background_run", name="test.hang")
        task_id = started.data["task_id"]
        await hang.running.wait()
        # the row says which incarnation runs it
        (row,) = await node.store.run(LIST, session_key="ada/s", limit=10)
        assert (row.id, row.state, row.node_id, row.node_epoch) == (task_id, "running", "local", 1)
    # the node stopped: its task was cancelled with it, and nobody was told yet
    again = Hang()
    async with open_node(config, features=features(config, again), serve=False) as node:
        told = await eventually(lambda: notices(node, "ada/s"))
        assert told == [
            f"[BACKGROUND TASK FAILED] task_id={task_id}, tool=test.hang, elapsed="
            + told[0].split("elapsed=")[1].split("s\n")[0]
            + "s\nError: lost: node 'local' epoch 1 ended before the task finished (the node"
            " started again as epoch 2)"
        ]
        status = await call(node, "ada/s", "background_status", task_id=task_id)
        assert status.data["status"] == "lost"
        result = await call(node, "ada/s", "background_result", task_id=task_id)
        assert result.data["result"]["success"] is False
        assert result.data["result"]["error"]["code"] == "lost"
        listed = await call(node, "ada/s", "background_list")
        assert [(t["task_id"], t["status"]) for t in listed.data["tasks"]] == [(task_id, "lost")]
        # another session's task is not found, stored or not
        other = await call(node, "ada/t", "background_status", task_id=task_id)
        assert other.ok is False and other.error["code"] == "not_found"
        # told once: a later pass finds nothing to close or tell
        lost = node.features["execution"].lost
        assert await lost.close(await node.store.list_nodes()) == []
        assert len(await notices(node, "ada/s")) == 1


def cluster_config(url: str, node_id: str, lease: float) -> Config:
    return Config(store=url, node=NodeConfig(id=node_id, lease_seconds=lease, placement="leases"))


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_dead_nodes_task_is_closed_as_lost_once_and_its_session_told(store_url):
    hang_a, hang_b = Hang(), Hang()
    # a heartbeats rarely (its lease is made to run out below); b sweeps every third of a second
    config_a = cluster_config(store_url, "a", 600)
    config_b = cluster_config(store_url, "b", 1)
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            open_node(
                config_a, tokens={TOKEN: "ada"}, features=features(config_a, hang_a), serve=False
            )
        )
        b = await stack.enter_async_context(
            open_node(
                config_b, tokens={TOKEN: "ada"}, features=features(config_b, hang_b), serve=False
            )
        )
        http_b = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=b.app), base_url="http://b")
        )
        await a.directory.create_session("ada", session_id="s")
        await a.directory.create_session("ada", session_id="t")
        await a.directory.submit("ada", "s", "hello")  # a holds s
        assert (await a.context.sessions.resolve("session:ada/s")) is not None
        started = await call(a, "ada/s", "background_run", name="test.hang")
        task_id = started.data["task_id"]
        await hang_a.running.wait()

        # through b, the task is read from the store: running, on a
        async def running_on_a():
            status = await call(b, "ada/s", "background_status", task_id=task_id)
            return status.ok and status.data["status"] == "running"

        await eventually(running_on_a)
        # b's sweeps leave a live node's task alone
        await b.membership.sweep()
        assert (await call(b, "ada/s", "background_status", task_id=task_id)).data[
            "status"
        ] == "running"

        backend = Backend("postgres", store_url)
        await expire_lease(backend, "a")  # a is dead for everyone: b's next sweep says so
        told = await eventually(lambda: notices(b, "ada/s"))
        # b's periodic passes and these two at once: still one closure, one notice
        lost = b.features["execution"].lost
        view = await b.store.list_nodes()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lost.close, view)
            nursery.start_soon(lost.close, view)
        assert len(told) == 1
        assert told[0].startswith(f"[BACKGROUND TASK FAILED] task_id={task_id}, tool=test.hang")
        assert told[0].endswith("\nError: lost: node 'a' stopped before the task finished")
        assert b.metrics.value("turnstile_nodes_declared_dead_total") == 1
        # the session is b's now: the notice ran as a turn there
        assert (await b.context.sessions.resolve("session:ada/s")) is not None

        async def notice_ran():
            items = await b.store.list_inputs("ada/s")
            return [i.state for i in items if i.source == "notification"] == ["done"]

        await eventually(notice_ran)
        assert len(await notices(b, "ada/s")) == 1

        # reading it through b says lost, for its session only
        status = await call(b, "ada/s", "background_status", task_id=task_id)
        assert status.data["status"] == "lost"
        result = await call(b, "ada/s", "background_result", task_id=task_id)
        assert result.data["result"]["error"] == {
            "code": "lost",
            "message": "lost: node 'a' stopped before the task finished",
        }
        routed = await http_b.get(f"/sessions/s/tasks/{task_id}", headers=AUTH)
        assert routed.status_code == 200 and routed.json()["status"] == "lost"
        other = await http_b.get(f"/sessions/t/tasks/{task_id}", headers=AUTH)
        assert other.status_code == 404
        assert (await call(b, "ada/t", "background_status", task_id=task_id)).ok is False


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_node_that_stops_cleanly_leaves_its_tasks_to_the_next_sweep(store_url):
    hang_a, hang_b = Hang(), Hang()
    config_a = cluster_config(store_url, "a", 600)
    config_b = cluster_config(store_url, "b", 1)
    async with AsyncExitStack() as stack:
        b = await stack.enter_async_context(
            open_node(config_b, features=features(config_b, hang_b), serve=False)
        )
        async with open_node(config_a, features=features(config_a, hang_a), serve=False) as a:
            await a.directory.create_session("ada", session_id="s")
            started = await call(a, "ada/s", "background_run", name="test.hang")
            task_id = started.data["task_id"]
            await hang_a.running.wait()
        # a stopped: its task was cancelled with it; b's next sweep finds it and tells s
        told = await eventually(lambda: notices(b, "ada/s"))
        assert told[0].startswith(f"[BACKGROUND TASK FAILED] task_id={task_id}, tool=test.hang")
        assert told[0].endswith("\nError: lost: node 'a' stopped before the task finished")
        status = await call(b, "ada/s", "background_status", task_id=task_id)
        assert status.data["status"] == "lost"
        assert len(await notices(b, "ada/s")) == 1


class Quick:
    """A feature with one tool, ``test.quick``, that answers at once."""

    name = "quick"

    async def start(self, node: NodeContext) -> None:
        async def quick(call, args: NoArgs):
            return {"done": True}

        node.tools.register("test.quick", NoArgs, quick, "Answers at once.")

    def routes(self, node: NodeContext) -> list:
        return []


async def test_a_notice_whose_commit_is_refused_is_asked_again_while_the_node_lives(tmp_path):
    """Found by the crash harness's ``--fault fail`` (issue 23, scenario ``background``): the
    commit that stores a task's notice in its session was refused once; the node lived on and
    never asked again (only the sweep after a node's end tells what a node did not), so the
    session was never told. It is now asked again within the task's write grace, under the
    same key: told once."""
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    chosen = default_features(make_agent(config))
    async with open_node(config, features=[*chosen[:-1], Quick(), chosen[-1]], serve=False) as node:
        await node.directory.create_session("ada", session_id="s")
        real, real_announced = node.store.enqueue_keyed, node.store.enqueue_announced
        refused: list[str] = []

        def refusing(source: str, key: str) -> None:
            if source == "notification" and not refused:
                refused.append(key)
                raise StoreError("sqlite: transaction failed: refused by the test")

        async def refuse_once(session_id, source, payload, key, *args, **kwargs):
            refusing(source, key)
            return await real(session_id, source, payload, key, *args, **kwargs)

        async def refuse_once_announced(session_id, source, payload, event, **kwargs):
            # (a session between turns stores an input with its turn_queued in one commit)
            refusing(source, kwargs["idempotency_key"])
            return await real_announced(session_id, source, payload, event, **kwargs)

        node.store.enqueue_keyed = refuse_once
        node.store.enqueue_announced = refuse_once_announced
        started = await call(node, "ada/s", "background_run", name="test.quick")
        task_id = started.data["task_id"]
        told = await eventually(lambda: notices(node, "ada/s"))
        assert refused == [f"background:{task_id}"]
        assert len(told) == 1 and told[0].startswith(
            f"[BACKGROUND TASK COMPLETED] task_id={task_id}"
        )

        async def marked_told() -> bool:
            (row,) = await node.store.run(LIST, session_key="ada/s", limit=10)
            return row.notified_at is not None

        await eventually(marked_told)
        assert len(await notices(node, "ada/s")) == 1
