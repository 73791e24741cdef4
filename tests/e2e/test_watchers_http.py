"""Watchers and background tasks over the real gateway: CRUD, ownership, escalation reaching
the session (through ``turnstile.client``: its REST methods and a stream)."""

from __future__ import annotations

import pytest
import trio

from tests.support.node import ALICE, BOB, new_session, running_node
from turnstile.actors.config import WatchersConfig
from turnstile.client import (
    LimitExceeded,
    NotFound,
    SessionStream,
    StreamStart,
    TurnstileClientError,
    WatcherUpdate,
    open_client,
)

WAIT = 60


async def first(stream: SessionStream, kind: type, predicate=lambda data: True):
    """The data of the stream's next event that is a ``kind`` and matches ``predicate``."""
    async for event in stream:
        if isinstance(event.data, kind) and predicate(event.data):
            return event.data
    raise AssertionError(f"the stream ended before a {kind.__name__}")


async def test_watcher_crud_and_its_baseline_escalation(tmp_path):
    with trio.fail_after(WAIT):
        async with (
            running_node(tmp_path) as node,
            open_client(node.url, ALICE) as client,
            open_client(node.url, BOB) as bob,
        ):
            await new_session(node, "w")
            async with client.attach("w") as stream:
                spec = {
                    "tool": "echo",
                    "params": {"text": "steady"},
                    "interval": 60,
                    "label": "steady echo",
                    "notify_when": "on_change",
                }
                wid = (await client.create_watcher("w", spec))["watcher_id"]
                # the first check sets the baseline and escalates: an event and a turn
                update = await first(stream, WatcherUpdate, lambda u: u.watcher_id == wid)
                assert update.watcher_id == wid
                start = await first(stream, StreamStart, lambda s: "[WATCHER UPDATE]" in s.content)
                assert f"watcher_id={wid}" in start.content and start.source == "notification"

                listed = await client.watchers("w")
                assert [w["watcher_id"] for w in listed["watchers"]] == [wid]
                every = await client.watchers()  # all of Ann's, every session's
                assert [(w["watcher_id"], w["session_id"]) for w in every["watchers"]] == [
                    (wid, "w")
                ]
                assert (every["total"], every["running"], every["paused"]) == (1, 1, 0)
                assert (await bob.watchers())["watchers"] == []
                with pytest.raises(NotFound):
                    await bob.get_watcher(wid)
                with pytest.raises(NotFound):
                    await bob.watchers("w")
                assert (await client.pause_watcher(wid))["status"] == "paused"
                assert (await client.resume_watcher(wid))["status"] == "running"
                assert (await client.get_watcher(wid))["check_count"] >= 1
                await client.stop_watcher(wid)  # raises unless the node accepted it
                with pytest.raises(NotFound):
                    await client.get_watcher(wid)

                with pytest.raises(TurnstileClientError) as refused:
                    await client.create_watcher(
                        "w",
                        {**spec, "notify_when": "on_threshold",
                         "notify_config": {"expression": "result.text =="}},
                    )  # fmt: skip
                assert (refused.value.status, refused.value.code) == (400, "bad_expression")


async def test_background_tasks_over_http(tmp_path):
    with trio.fail_after(WAIT):
        async with (
            running_node(tmp_path) as node,
            open_client(node.url, ALICE) as client,
            open_client(node.url, BOB) as bob,
        ):
            await new_session(node, "b")
            started = await client.call(
                "b", "background_run", {"name": "echo", "params": {"text": "later"}}
            )
            task_id = started["task_id"]
            tasks = (await client.tasks("b"))["tasks"]
            assert [t["task_id"] for t in tasks] == [task_id]
            status = await client.get_task("b", task_id)
            assert status["tool_name"] == "echo"
            with pytest.raises(NotFound):
                await bob.get_task("b", task_id)
            cancelled = await client.cancel_task("b", task_id)
            assert "cancelled" in cancelled


async def test_the_watchers_section_of_the_config_bounds_a_session(tmp_path):
    """``[watchers] max_per_session`` reaches the watcher actor: the third watcher of a session
    that may have two is refused with a 4xx naming the limit, and another session may still
    start its own."""
    with trio.fail_after(WAIT):
        async with (
            running_node(tmp_path, watchers=WatchersConfig(max_per_session=2)) as node,
            open_client(node.url, ALICE) as client,
        ):
            await new_session(node, "w")
            await new_session(node, "v")
            spec = {"tool": "echo", "params": {"text": "x"}, "interval": 60}
            for _ in range(2):
                await client.create_watcher("w", spec)  # raises unless the node accepted it
            with pytest.raises(LimitExceeded) as refused:
                await client.create_watcher("w", spec)
            assert refused.value.status == 429
            assert refused.value.code == "limit_exceeded" and "2" in refused.value.message
            await client.create_watcher("v", spec)
