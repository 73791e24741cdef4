"""Notifications through the real node: buffered while nobody watches, in order on attach
(through ``turnstile.client``: calls without attaching, then a stream)."""

from __future__ import annotations

import json

import pytest

from tests.support.node import ALICE, BOB, new_session, running_node
from turnstile.actors.config import ChannelSettings
from turnstile.client import Notification, ToolError, open_client


async def test_notifications_are_buffered_while_detached_and_delivered_in_order_on_attach(
    tmp_path,
):
    log_path = tmp_path / "audit.jsonl"
    channels = {"audit": ChannelSettings(type="log", path=str(log_path))}
    async with running_node(tmp_path, channels=channels) as node:
        await new_session(node, "n")
        async with open_client(node.url, ALICE) as client:  # calls tools without attaching
            for i in range(3):
                result = await client.call(
                    "n",
                    "send_notification",
                    {"message": f"deploy step {i}", "title": "deploy"},
                )
                assert result["buffered"] is True, result
            logged = await client.call(
                "n", "send_notification", {"channel": "audit", "message": "to the audit log"}
            )
            assert logged["delivered"] is True and logged["fallback"] is False
            with pytest.raises(ToolError) as unknown:
                await client.call("n", "send_notification", {"channel": "slack", "message": "?"})
            assert unknown.value.code == "unknown_channel"
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
        async with open_client(node.url, ALICE) as client, client.attach("n") as watcher:
            for i in range(3):
                note = (await watcher.receive()).data
                assert isinstance(note, Notification) and note.buffered is True
                assert note.message == f"deploy step {i}"
    (line,) = log_path.read_text().splitlines()
    assert json.loads(line)["message"] == "to the audit log"
