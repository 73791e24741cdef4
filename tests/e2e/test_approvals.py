"""Tool policies over the real gateway: BLOCK refuses, APPROVE waits for a person (through
``turnstile.client``: the stream's approve, the REST routes' deny)."""

from __future__ import annotations

import pytest
import trio

from tests.support.node import ALICE, BOB, new_session, running_node
from turnstile.client import (
    ApprovalRequired,
    ApprovalResolved,
    Event,
    NotFound,
    SessionStream,
    StreamEnd,
    ToolError,
    open_client,
)

POLICIES = {"echo": "APPROVE", "clock.*": "BLOCK"}
WAIT = 60


async def next_of(stream: SessionStream, kind: type) -> Event:
    """The stream's next event whose data is a ``kind``."""
    async for event in stream:
        if isinstance(event.data, kind):
            return event
    raise AssertionError(f"the stream ended before a {kind.__name__}")


async def test_approve_and_deny_over_the_websocket_and_block(tmp_path):
    with trio.fail_after(WAIT):
        async with (
            running_node(tmp_path, policies=POLICIES) as node,
            open_client(node.url, ALICE) as alice,
            open_client(node.url, BOB) as bob,
        ):
            await new_session(node, "p")
            async with alice.attach("p") as stream:
                await stream.send('/call echo {"text": "hi"}')
                asked = (await next_of(stream, ApprovalRequired)).data
                assert asked.tool == "echo"
                assert asked.arguments == {"text": "hi"} and asked.expires_at.endswith("Z")
                decided = await stream.approve(asked.approval_id)
                assert (decided.approval_id, decided.decision) == (asked.approval_id, "approved")
                resolved = (await next_of(stream, ApprovalResolved)).data
                assert (resolved.decision, resolved.by) == ("approved", "alice")
                end = (await next_of(stream, StreamEnd)).data
                assert end.text == 'echo returned {"text": "hi"}'

                await stream.send('/call echo {"text": "no"}')
                asked = (await next_of(stream, ApprovalRequired)).data
                assert asked.tool == "echo"
                pending = await alice.approvals("p")
                assert [a["approval_id"] for a in pending] == [asked.approval_id]
                with pytest.raises(NotFound) as stranger:
                    await bob.deny(asked.approval_id)  # not bob's to decide
                assert stranger.value.status == 404
                denied = await alice.deny(asked.approval_id)
                assert denied["decision"] == "denied"
                end = (await next_of(stream, StreamEnd)).data
                assert end.text == "echo failed: echo was not approved"

                with pytest.raises(ToolError) as blocked:
                    await stream.call("clock.now")
                assert (blocked.value.code, blocked.value.message) == (
                    "blocked",
                    "clock.now is blocked by policy",
                )
