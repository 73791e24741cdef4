"""Any node serves any client, the rest of it: the session's policy and stop through a node
that does not hold the session (two nodes in-process on PostgreSQL, session leases); approvals
are ``test_anynode_approvals``.

Node ``a`` holds session ``ada/s`` (a client attached there first); every request of these tests
goes through node ``b``. Where a test says "without notifications", ``b``'s store sends none, so
only the store and the holder's polling carry the request.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import httpx
import pytest
import trio

from tests.support.polling import eventually
from tests.support.sessions import Recorder
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents.base import TurnContext
from turnstile.actors.sessions.remote import REQUESTS
from turnstile.runtime.errors import Busy

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

ADA, BOB = "anynode-ada-token-0123456789", "anynode-bob-token-0123456789"
TOKENS = {ADA: "ada", BOB: "bob"}
#: a hang guard (real clock: two nodes and PostgreSQL), not a promise: generous, so that a
#: 2-core box at load 8 passes; the waits end as soon as the frame arrives
WAIT = 60


class HeldAgent:
    """Answers at once, except ``long``: that turn waits for ``release``, then answers with the
    messages folded into it."""

    name = "held"

    def __init__(self) -> None:
        self.release = trio.Event()
        self.turns: list[str] = []

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn: TurnContext) -> str:
        self.turns.append(turn.input.content)
        await turn.emit("stream_delta", "thinking ")
        if turn.input.content == "long":
            await self.release.wait()
        folded = [entry.content for entry in turn.take_injections()]
        return " + ".join([f"done: {turn.input.content}", *folded])


def config(url: str, node_id: str) -> Config:
    node = NodeConfig(id=node_id, lease_seconds=600, placement="leases")
    return Config(store=url, node=node, policies={"echo": "APPROVE"})  # (for the approvals)


async def settled(node) -> bool:
    """No request for a session's holder is left in the store."""
    return await node.store.kv_list(REQUESTS) == []


async def idle(node, key: str) -> bool:
    """No input of the session is running, as the store says (what another node goes by)."""
    return not await node.store.list_inputs(key, ["running"])


def frames(recorder: Recorder, type_: str) -> list[dict]:
    decoded = [json.loads(frame) for frame in recorder.frames]
    return [frame for frame in decoded if frame["type"] == type_]


class Cluster:
    """Nodes ``a`` (holding ``ada/s``, its client ``on_a``) and ``b`` (``http_b``, ``bob_b``)."""

    async def start(self, stack: AsyncExitStack, url: str, agent=None) -> Cluster:
        self.a = await stack.enter_async_context(
            open_node(config(url, "a"), tokens=TOKENS, agent=agent, serve=False)
        )
        self.b = await stack.enter_async_context(
            open_node(config(url, "b"), tokens=TOKENS, agent=agent, serve=False)
        )
        self.http_b = await stack.enter_async_context(
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=self.b.app),
                base_url="http://b",
                headers={"Authorization": f"Bearer {ADA}"},
            )
        )
        self.bob_b = await stack.enter_async_context(
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=self.b.app),
                base_url="http://b",
                headers={"Authorization": f"Bearer {BOB}"},
            )
        )
        await self.a.directory.create_session("ada", session_id="s")
        self.on_a = Recorder()
        await self.a.directory.attach("ada", "s", self.on_a)  # a holds s
        return self

    def silence_b(self) -> list[str]:
        """``b`` sends no notification from now on; returns what it would have sent."""
        dropped: list[str] = []

        async def notify(channel: str, payload: str) -> None:
            dropped.append(payload)

        self.b.store.notify = notify
        return dropped


async def test_reject_through_another_node_answers_busy_while_a_turn_runs(store_url):
    agent = HeldAgent()
    async with AsyncExitStack() as stack:
        nodes = await Cluster().start(stack, store_url, agent)
        await nodes.b.directory.set_policy("ada", "s", "reject")
        long = await nodes.b.directory.submit("ada", "s", "long", idempotency_key="client:1")
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_delta"')
        with pytest.raises(Busy, match="session is busy with a turn and its policy is reject"):
            await nodes.b.directory.submit("ada", "s", "refused")
        refused = await nodes.http_b.post("/sessions/s/messages", json={"content": "refused"})
        assert refused.status_code == 409, refused.text
        # a resend of the message that keeps the session busy gets its first answer
        again = await nodes.b.directory.submit("ada", "s", "long", idempotency_key="client:1")
        assert again.replayed and again.input_id == long.input_id
        agent.release.set()
        await eventually(lambda: idle(nodes.b, "ada/s"))  # closed in the store, not only shown
        after = await nodes.b.directory.submit("ada", "s", "idle again")  # no turn: taken
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_end"', 2)
        inputs = await nodes.a.store.list_inputs("ada/s")
        assert [i.id for i in inputs] == [long.input_id, after.input_id]
        assert agent.turns == ["long", "idle again"]


async def test_interrupt_through_another_node_cuts_the_running_turn_short(store_url):
    agent = HeldAgent()
    async with AsyncExitStack() as stack:
        nodes = await Cluster().start(stack, store_url, agent)
        await nodes.b.directory.set_policy("ada", "s", "interrupt")
        long = await nodes.b.directory.submit("ada", "s", "long")
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_delta"')
        nodes.silence_b()  # the holder learns of the interrupt from the store alone
        nxt = await nodes.b.directory.submit("ada", "s", "next")
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_end"', 2)
        ends = [(f["input_id"], f["status"]) for f in frames(nodes.on_a, "stream_end")]
        assert ends == [(long.input_id, "interrupted"), (nxt.input_id, "completed")]
        assert agent.turns == ["long", "next"]
        await eventually(lambda: settled(nodes.a))


async def test_inject_through_another_node_folds_the_message_into_the_running_turn(store_url):
    agent = HeldAgent()
    async with AsyncExitStack() as stack:
        nodes = await Cluster().start(stack, store_url, agent)
        await nodes.b.directory.set_policy("ada", "s", "inject")
        long = await nodes.b.directory.submit("ada", "s", "long")
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_delta"')
        nodes.silence_b()
        more = await nodes.b.directory.submit("ada", "s", "more")
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"user_message"')  # the injected message, folded in
        (folded,) = frames(nodes.on_a, "user_message")
        assert (folded["content"], folded["injected_into"]) == ("more", long.input_id)
        agent.release.set()
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_end"')
        (end,) = frames(nodes.on_a, "stream_end")
        assert (end["input_id"], end["text"]) == (long.input_id, "done: long + more")
        inputs = {i.id: i for i in await nodes.a.store.list_inputs("ada/s")}
        assert inputs[more.input_id].state == "done"
        assert inputs[more.input_id].detail == {"injected_into": long.input_id}
        assert agent.turns == ["long"]  # it ran no turn of its own


async def test_a_stop_through_another_node_without_notifications_still_stops(store_url):
    agent = HeldAgent()
    async with AsyncExitStack() as stack:
        nodes = await Cluster().start(stack, store_url, agent)
        long = await nodes.b.directory.submit("ada", "s", "long")
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_delta"')
        dropped = nodes.silence_b()
        assert await nodes.b.directory.stop("ada", "s") is True
        assert dropped == ["r ada/s"]  # the announcement is lost
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_end"')
        (end,) = frames(nodes.on_a, "stream_end")
        assert (end["input_id"], end["status"]) == (long.input_id, "stopped")
        await eventually(lambda: settled(nodes.a))
        await eventually(lambda: idle(nodes.b, "ada/s"))
        assert await nodes.b.directory.stop("ada", "s") is False  # nothing runs now


async def test_a_stop_for_a_turn_that_ended_meanwhile_does_not_stop_the_next(store_url):
    """The stop was recorded for the turn running when it was asked; that turn ended before
    the holder read it, and the next turn runs: the stop is dropped, the next turn goes on."""
    agent = HeldAgent()
    async with AsyncExitStack() as stack:
        nodes = await Cluster().start(stack, store_url, agent)
        first = await nodes.b.directory.submit("ada", "s", "first")
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_end"')
        long = await nodes.b.directory.submit("ada", "s", "long")
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_delta"', 2)
        stale = {"input_id": first.input_id, "status": "stopped", "session": "ada/s"}
        await nodes.b.store.kv_put(REQUESTS, [(f"stop {first.input_id}", stale, None)])
        await eventually(lambda: settled(nodes.a))  # the holder reads it (its poll), drops it
        agent.release.set()
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_end"', 2)
        ends = [(f["input_id"], f["status"]) for f in frames(nodes.on_a, "stream_end")]
        assert ends == [(first.input_id, "completed"), (long.input_id, "completed")]
