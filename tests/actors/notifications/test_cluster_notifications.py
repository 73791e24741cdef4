"""Notifications and client events for a session another node holds (two nodes in-process
on PostgreSQL, with session leases): the agent gets the notification at once (stored as the
session's input and announced to the holder), the client-facing event is buffered with the
session's next gapless number and reaches the clients at their next attach through the
holder, a client attaching through the other node is served (the buffer waits for the
holder), and events another node publishes reach every client, in order."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from tests.support.polling import eventually
from tests.support.sessions import Recorder
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import Node, open_node
from turnstile.actors.sessions.event_types import HeartbeatSuppressed
from turnstile.actors.sessions.messages import Publish

TOKEN = "cluster-notify-token-0123456789"


def config(url: str, node_id: str) -> Config:
    return Config(store=url, node=NodeConfig(id=node_id, lease_seconds=600, placement="leases"))


@asynccontextmanager
async def two_nodes(store_url: str) -> AsyncIterator[tuple[Node, Node]]:
    """Nodes a and b on one store, and session ``s`` of ada's, created through a."""
    async with AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                open_node(config(store_url, name), tokens={TOKEN: "ada"}, serve=False)
            )
            for name in ("a", "b")
        ]
        await a.directory.create_session("ada", session_id="s")
        yield a, b


async def done_inputs(node) -> list:
    return [i for i in await node.store.list_inputs("ada/s") if i.state == "done"]


def published(recorder: Recorder) -> list[int]:
    decoded = [json.loads(frame) for frame in recorder.frames]
    return [f["input_id"] for f in decoded if f["type"] == "heartbeat_suppressed"]


def notifications(recorder: Recorder) -> list[str]:
    decoded = [json.loads(frame) for frame in recorder.frames]
    return [f["message"] for f in decoded if f["type"] == "notification"]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_notification_sent_through_another_node_reaches_the_agent_and_the_client(
    store_url,
):
    async with two_nodes(store_url) as (a, b):
        await a.context.sessions.resolve("session:ada/s")  # a holds s; nobody watches
        result = await b.context.notify("ada/s", "ada", "llm_notification", "build is green")
        assert (result["injected"], result["buffered"]) == (True, True)
        assert [key for key, _ in await b.store.kv_list("notify:ada/s")] == [f"{1:020d}"]
        # the agent got it on a, as a turn of its own
        await eventually(lambda: done_inputs(a))
        (item,) = await a.store.list_inputs("ada/s")
        assert item.source == "notification" and "build is green" in item.payload["content"]
        # a client attaching through b is served; the event waits for the holder
        on_b = Recorder()
        await b.directory.attach("ada", "s", on_b)
        assert notifications(on_b) == []
        # a client attaching through a gets it, once
        on_a = Recorder()
        await a.directory.attach("ada", "s", on_a)
        assert notifications(on_a) == ["build is green"]
        assert await a.store.kv_list("notify:ada/s") == []


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_an_event_published_through_another_node_reaches_every_client_in_order(
    store_url,
):
    """A feature on B publishes client events for a session A holds (a watcher B checks, a
    job B fires): A appends them to the log in the order B made them, and A's clients and
    B's followers see them, once each."""
    async with two_nodes(store_url) as (a, b):
        on_a, on_b = Recorder(), Recorder()
        await a.directory.attach("ada", "s", on_a)  # a holds s
        await b.directory.attach("ada", "s", on_b)  # followed from b
        for n in range(5):
            await b.context.tell_session(
                "ada/s", Publish(event=HeartbeatSuppressed(input_id=n, chars=n))
            )

        async def both_saw() -> bool:
            return all(len(published(r)) == 5 for r in (on_a, on_b))

        await eventually(both_saw)
        assert published(on_a) == published(on_b) == list(range(5))
        stored = [e for e in await a.store.read_events("ada/s") if e.type == "heartbeat_suppressed"]
        assert [e.payload["input_id"] for e in stored] == list(range(5))
        assert await a.store.kv_list("sessions.requests") == []  # carried out, settled
