"""Tool policies over the real gateway: BLOCK refuses, APPROVE waits for a person."""

from __future__ import annotations

from tests.support.node import BOB, connect, new_session, running_node

POLICIES = {"echo": "APPROVE", "clock.*": "BLOCK"}


async def test_approve_and_deny_over_the_websocket_and_block(tmp_path):
    async with running_node(tmp_path, policies=POLICIES) as node:
        await new_session(node, "p")
        async with connect(node) as client:
            await client.send(type="attach", session_id="p")
            await client.send(type="send", session_id="p", content='/call echo {"text": "hi"}')
            asked = await client.expect("approval_required", tool="echo")
            assert asked["arguments"] == {"text": "hi"} and asked["expires_at"].endswith("Z")
            await client.send(type="approve", session_id="p", approval_id=asked["approval_id"])
            decided = await client.expect("approval", approval_id=asked["approval_id"])
            assert decided["decision"] == "approved"
            await client.expect("approval_resolved", decision="approved", by="alice")
            end = await client.expect("stream_end")
            assert end["text"] == 'echo returned {"text": "hi"}'

            await client.send(type="send", session_id="p", content='/call echo {"text": "no"}')
            asked = await client.expect("approval_required", tool="echo")
            async with node.http() as http, node.http(BOB) as bob:
                pending = (await http.get("/sessions/p/approvals")).json()["approvals"]
                assert [a["approval_id"] for a in pending] == [asked["approval_id"]]
                stranger = await bob.post(f"/approvals/{asked['approval_id']}/deny")
                assert stranger.status_code == 404  # not bob's to decide
                denied = await http.post(f"/approvals/{asked['approval_id']}/deny")
                assert denied.json()["decision"] == "denied"
            end = await client.expect("stream_end", text="echo failed: echo was not approved")

            await client.send(type="call", id="b", session_id="p", tool="clock.now")
            blocked = await client.expect("result", id="b")
            assert blocked["error"] == {
                "code": "blocked",
                "message": "clock.now is blocked by policy",
            }
