"""Notifications through the real node: buffered while nobody watches, in order on attach."""

from __future__ import annotations

import json

from tests.support.node import BOB, connect, new_session, running_node
from turnstile.actors.config import ChannelSettings


async def test_notifications_are_buffered_while_detached_and_delivered_in_order_on_attach(
    tmp_path,
):
    log_path = tmp_path / "audit.jsonl"
    channels = {"audit": ChannelSettings(type="log", path=str(log_path))}
    async with running_node(tmp_path, channels=channels) as node:
        await new_session(node, "n")
        async with connect(node) as caller:  # calls tools without attaching
            for i in range(3):
                await caller.send(
                    type="call",
                    id=str(i),
                    session_id="n",
                    tool="send_notification",
                    arguments={"message": f"deploy step {i}", "title": "deploy"},
                )
                result = await caller.expect("result", id=str(i))
                assert result["ok"] is True, result
                assert result["data"]["buffered"] is True, result
            await caller.send(
                type="call",
                id="log",
                session_id="n",
                tool="send_notification",
                arguments={"channel": "audit", "message": "to the audit log"},
            )
            logged = await caller.expect("result", id="log")
            assert logged["data"]["delivered"] is True and logged["data"]["fallback"] is False
            await caller.send(
                type="call", id="x", session_id="n", tool="send_notification",
                arguments={"channel": "slack", "message": "?"},
            )  # fmt: skip
            unknown = await caller.expect("result", id="x")
            assert unknown["error"]["code"] == "unknown_channel"
        async with node.http() as http, node.http(BOB) as bob:
            # what waits can be read (the console's view) without delivering it
            waiting = (await http.get("/sessions/n/notifications")).json()
            assert [n["message"] for n in waiting["notifications"]] == [
                f"deploy step {i}" for i in range(3)
            ]
            assert waiting["dropped"] == 0
            assert {(n["type"], n["buffered"]) for n in waiting["notifications"]} == {
                ("notification", True)
            }
            assert (await bob.get("/sessions/n/notifications")).status_code == 404
        async with connect(node) as watcher:
            await watcher.send(type="attach", session_id="n")
            for i in range(3):
                note = await watcher.expect("notification", buffered=True)
                assert note["message"] == f"deploy step {i}"
    (line,) = log_path.read_text().splitlines()
    assert json.loads(line)["message"] == "to the audit log"
