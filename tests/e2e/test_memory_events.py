"""Memory changes live over the real gateway: two users' WebSocket clients subscribe to the
``memory`` topic; each sees the changes to their own memory as they happen, made over HTTP or
by a tool called from a session, and never the other's; a client that was away catches up
with ``after_seq``, and ``GET /memory/changes`` says the same."""

from __future__ import annotations

from tests.support.node import ALICE, BOB, connect, new_session, running_node


def topic_events(client) -> list[dict]:
    """The memory events a client received (not the subscription's own frames)."""
    own = ("subscribed", "topic_sync", "unsubscribed")
    return [f for f in client.frames if f.get("topic") == "memory" and f["type"] not in own]


async def test_each_user_sees_their_own_memory_change_live_and_catches_up(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "main")
        async with connect(node, ALICE) as alice, connect(node, BOB) as bob:
            for client in (alice, bob):
                await client.send(type="subscribe", topic="memory")
                assert await client.expect("subscribed") == {
                    "type": "subscribed",
                    "topic": "memory",
                    "last_seq": 0,
                }
                await client.expect("topic_sync", seq=0)

            async with node.http(ALICE) as http:
                body = {"category": "drinks", "key": "coffee", "value": "dark roast"}
                assert (await http.put("/memory/facts", json=body)).is_success
            saved = await alice.expect("fact_saved")
            assert saved["seq"] == 1 and saved["created"] is True
            assert saved["fact"]["value"] == "dark roast" and "owner" not in saved["fact"]

            # a tool the agent (here: a call frame) runs in one of her sessions
            args = {"category": "home", "key": "city", "value": "Porto"}
            await alice.send(
                type="call", id="c1", session_id="main", tool="memory.save", arguments=args
            )
            assert (await alice.expect("result", id="c1"))["ok"] is True
            city = await alice.expect("fact_saved", seq=2)
            assert city["fact"]["source"] == "conversation"

            async with node.http(BOB) as http:
                body = {"category": "drinks", "key": "coffee", "value": "black"}
                assert (await http.put("/memory/facts", json=body)).is_success
            bobs = await bob.expect("fact_saved")
            assert (bobs["seq"], bobs["fact"]["value"]) == (1, "black")
            # bob got exactly his own event, alice none of his
            assert [e["seq"] for e in topic_events(bob)] == [1]
            assert "black" not in str(alice.frames) and "Porto" not in str(bob.frames)
            last_seen = city["seq"]

        # alice is away while her memory changes
        async with node.http(ALICE) as http:
            assert (
                await http.put("/memory/summary", json={"content": "Drinks coffee."})
            ).is_success
            gone = await http.request("DELETE", "/memory/facts", params={"key": "coffee"})
            assert gone.json() == {"deleted": 1}
            log = (await http.get("/memory/changes", params={"after_seq": last_seen})).json()
        assert [(c["seq"], c["type"]) for c in log["changes"]] == [
            (3, "summary_changed"),
            (4, "fact_forgotten"),
        ]

        async with connect(node, ALICE) as alice:
            await alice.send(type="subscribe", topic="memory", after_seq=last_seen)
            await alice.expect("subscribed", last_seq=4)
            summary = await alice.expect("summary_changed", seq=3)
            assert summary["summary"] == "Drinks coffee."
            forgotten = await alice.expect("fact_forgotten", seq=4)
            assert (forgotten["category"], forgotten["key"]) == ("drinks", "coffee")
            assert forgotten == log["changes"][1]  # the route and the socket say the same
            await alice.expect("topic_sync", seq=4)
            async with node.http(ALICE) as http:
                assert (await http.delete("/memory")).is_success
            deleted = await alice.expect("memory_deleted", seq=5)
            assert deleted["deleted"] == {"facts": 1, "summary": 1, "sessions": 0}
            await alice.send(type="unsubscribe", topic="memory")
            await alice.expect("unsubscribed", topic="memory")
