"""``send_notification`` through the tool registry, with a real notifier and session."""

from __future__ import annotations

import json

import pytest
import trio.testing

from tests.support.mock_node import DAY, node
from tests.support.notifier import NoSockets, events, make_notifier
from turnstile.actors.notifications.actor import ChannelConfig
from turnstile.actors.notifications.tools import register_notify_tools
from turnstile.tools.registry import ToolRegistry


class Tools:
    """A node, a notifier with a log and an (unreachable) webhook channel, and the tool."""

    def __init__(self, tmp_path) -> None:
        self.log = tmp_path / "notes.jsonl"

    async def __aenter__(self):
        self._node = node()
        n = await self._node.__aenter__()
        self.notifier = make_notifier(
            n,
            ChannelConfig(name="audit", type="log", path=str(self.log)),
            ChannelConfig(name="ops", type="webhook", url="http://10.1.2.3/hook"),
            backend=NoSockets(),
        )
        self.registry = ToolRegistry()
        register_notify_tools(self.registry, self.notifier)

        async def call(**arguments):
            return await self.registry.call("s", "ada", "send_notification", arguments)

        return n, call

    async def __aexit__(self, *exc):
        return await self._node.__aexit__(*exc)


@pytest.mark.guard(DAY)
async def test_send_notification_to_the_session(autojump_clock, tmp_path):
    async with Tools(tmp_path) as (n, call):
        result = await call(
            channel="llm_notification",
            message="report ready",
            title="Report",
            priority="urgent",
            tags=["daily"],
            structured_data={"rows": 3},
        )
        assert result.ok, result.error
        assert (result.data["channel"], result.data["delivered"], result.data["fallback"]) == (
            "llm_notification",
            True,
            False,
        )
        await n.seen.until(b'"stream_end"')
        (event,) = events(n.seen, "notification")
        assert (event["message"], event["priority"], event["source"]) == (
            "report ready",
            "urgent",
            "tool",
        )


# The log channel writes from a worker thread: these run on the real clock, since an autojumping
# MockClock would jump to the next deadline while the thread works.


async def test_send_notification_to_a_log(tmp_path):
    async with Tools(tmp_path) as (n, call):
        result = await call(channel="audit", message="m", priority="critical")
        assert result.ok and result.data["path"] == str(tmp_path / "notes.jsonl")
    (record,) = [json.loads(line) for line in (tmp_path / "notes.jsonl").read_text().splitlines()]
    assert (record["message"], record["priority"], record["session_id"]) == ("m", "urgent", "s")


async def test_a_failed_channel_says_it_fell_back(autojump_clock, tmp_path):
    async with Tools(tmp_path) as (n, call):
        result = await call(channel="ops", message="deploy done")
        assert result.ok
        assert result.data["fallback"] is True
        assert result.data["requested_channel"] == "ops"
        assert result.data["fallback_reason"] == (
            "refusing 10.1.2.3 (private address) for host '10.1.2.3'"
        )
        await trio.testing.wait_all_tasks_blocked()
        (start,) = events(n.seen, "stream_start")
        assert "delivery via webhook failed: refusing 10.1.2.3" in start["content"]
        assert "; delivered here instead (channel 'ops')." in start["content"]


async def test_unknown_channel_lists_the_configured_ones(autojump_clock, tmp_path):
    async with Tools(tmp_path) as (n, call):
        result = await call(channel="slack", message="hi")
        assert result.error == {
            "code": "unknown_channel",
            "message": "no channel named 'slack'; configured channels: audit, "
            "llm_notification, ops",
            "field": "channel",
        }


async def test_bounds(tmp_path):
    async with Tools(tmp_path) as (n, call):
        assert (await call(channel="audit", message="x" * 10_000)).ok
        too_long = await call(channel="audit", message="x" * 10_001)
        assert too_long.error["code"] == "bad_arguments"
        assert too_long.error["field"] == "$.message"
        for bad, field in (
            ({"message": ""}, "$.message"),
            ({"priority": "meh"}, "$.priority"),
            ({"tags": ["t"] * 21}, "$.tags"),
            ({"tags": ["x" * 65]}, "$.tags[0]"),
            ({"title": "x" * 201}, "$.title"),
            ({"colour": "red"}, None),
        ):
            result = await call(**{"channel": "audit", "message": "m", **bad})
            assert result.error["code"] == "bad_arguments", bad
            assert result.error.get("field") == field or field is None, (bad, result.error)
        big = await call(channel="audit", message="m", structured_data={"x": "y" * 17_000})
        assert big.error["code"] == "limit_exceeded" and big.error["field"] == "structured_data"
        refused = await call(channel="ops", message="m", output_config={"url": "http://x"})
        assert refused.error == {
            "code": "invalid_argument",
            "message": "output_config key 'url' is not supported by webhook channels "
            "(supported: none)",
            "field": "output_config",
        }


def test_the_description_lists_the_channels(tmp_path):
    registry = ToolRegistry()

    class Stub:
        channels = {
            "llm_notification": ChannelConfig(name="llm_notification", type="llm_notification")
        }

    register_notify_tools(registry, Stub())
    (spec,) = registry.specs()
    assert spec.name == "send_notification"
    assert spec.description.endswith("Channels: llm_notification (llm_notification).")
    assert spec.parameters["properties"]["message"]["maxLength"] == 10_000
    assert spec.parameters["required"] == ["message"]  # channel defaults to llm_notification
    assert spec.parameters["properties"]["channel"]["default"] == "llm_notification"
