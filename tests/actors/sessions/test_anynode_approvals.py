"""Approvals through any node (two nodes in-process on PostgreSQL, session leases): a tool call
of a turn running on node ``a`` waits for a person, who lists and answers it through node ``b``;
of two answers through the two nodes at once exactly one wins. The nodes, the clients and
"without notifications" are ``test_anynode``'s.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from tests.actors.sessions.test_anynode import WAIT, Cluster, eventually, frames

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)


async def test_an_approval_is_listed_and_answered_through_another_node(store_url):
    async with AsyncExitStack() as stack:
        nodes = await Cluster().start(stack, store_url)
        sent = await nodes.b.directory.submit("ada", "s", '/call echo {"text": "hi"}')
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"approval_required"')
        (asked,) = frames(nodes.on_a, "approval_required")
        approval_id = asked["approval_id"]
        listed = await nodes.http_b.get("/sessions/s/approvals")
        assert listed.json() == {"approvals": [{"approval_id": approval_id, "tool": "echo"}]}
        # another user's, through b as through a: not there
        assert (await nodes.bob_b.post(f"/approvals/{approval_id}/approve")).status_code == 404
        decided = await nodes.http_b.post(f"/approvals/{approval_id}/approve")
        assert decided.status_code == 200, decided.text
        assert decided.json() == {
            "approval_id": approval_id,
            "decision": "approved",
            "session_id": "s",
        }
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_end"')
        (resolved,) = frames(nodes.on_a, "approval_resolved")
        assert (resolved["decision"], resolved["by"]) == ("approved", "ada")
        (end,) = frames(nodes.on_a, "stream_end")
        assert (end["input_id"], end["text"]) == (sent.input_id, 'echo returned {"text": "hi"}')
        assert (await nodes.http_b.get("/sessions/s/approvals")).json() == {"approvals": []}
        again = await nodes.http_b.post(f"/approvals/{approval_id}/deny")
        assert again.status_code == 404  # answered and closed: gone, as on one node


async def test_the_first_of_two_answers_through_two_nodes_wins_without_notifications(store_url):
    async with AsyncExitStack() as stack:
        nodes = await Cluster().start(stack, store_url)
        await nodes.b.directory.submit("ada", "s", '/call echo {"text": "hi"}')
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"approval_required"')
        nodes.silence_b()  # a hears of an answer through b only by reading its row
        (asked,) = frames(nodes.on_a, "approval_required")
        approval_id = asked["approval_id"]
        answers: dict[str, object] = {}

        async def answer(node, name: str, approved: bool) -> None:
            try:
                answers[name] = await node.directory.resolve_approval("ada", approval_id, approved)
            except Exception as exc:
                answers[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer, nodes.b, "b", False)
            nursery.start_soon(answer, nodes.a, "a", True)
        won = [name for name, outcome in answers.items() if isinstance(outcome, dict)]
        assert len(won) == 1, answers
        (lost,) = {"a", "b"} - set(won)
        # refused as on one node: decided, or gone once the call has read the answer
        assert str(answers[lost]) in (
            f"approval {approval_id!r} is already decided",
            f"no pending approval with id {approval_id!r}",
        )
        decision = answers[won[0]]["decision"]
        with trio.fail_after(WAIT):
            await nodes.on_a.until(b'"stream_end"')
        (resolved,) = frames(nodes.on_a, "approval_resolved")
        assert resolved["decision"] == decision
        (end,) = frames(nodes.on_a, "stream_end")
        expected = {
            "approved": 'echo returned {"text": "hi"}',
            "denied": "echo failed: echo was not approved",
        }
        assert end["text"] == expected[decision]


async def test_a_call_waiting_on_another_node_is_denied_when_its_session_is_deleted(store_url):
    """A client's ``call`` through ``b`` waits on ``b`` for an approval of session ``s`` (which
    ``a`` holds); deleting ``s`` ends it there too, and a new ``s`` has nothing pending."""
    async with AsyncExitStack() as stack:
        nodes = await Cluster().start(stack, store_url)
        result = []

        async def call() -> None:
            result.append(await nodes.b.directory.call_tool("ada", "s", "echo", {"text": "x"}))

        async def listed() -> bool:
            got = await nodes.http_b.get("/sessions/s/approvals")
            return [a["tool"] for a in got.json()["approvals"]] == ["echo"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await eventually(listed)
            await nodes.a.directory.delete_session("ada", "s")
        (denied,) = result
        assert denied.error == {"code": "denied", "message": "echo was not approved"}
        await nodes.a.directory.create_session("ada", session_id="s")
        assert (await nodes.http_b.get("/sessions/s/approvals")).json() == {"approvals": []}
