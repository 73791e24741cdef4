"""The demo agent (``turnstile serve``'s default without a model) through the real gateway.

The first tests talk to it over a real WebSocket, on a real node on loopback, with a tiny
HTTP site on 127.0.0.1 for the watcher and the background fetch: each request is carried out
by the tool call a model would make (a ``tool_call`` frame with its arguments and result), and
what comes back by itself (the watcher's first look and a change 5 seconds later, the fetch's
end, a recall two seconds later) is answered in a turn of its own; tool policies and the http
module's guard apply to its calls. The last ones run the node on trio's ``MockClock``
and drive it through the gateway's app over an ASGI transport, so that "in 2 minutes" and
"every weekday at 9am" fire when they say, in milliseconds.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial

import httpx
import pytest
import trio
import trio.testing

from tests.support.http import read_request_head
from tests.support.node import connect, new_session, running_node
from turnstile.actors.config import Config, HttpModuleConfig, ModulesConfig
from turnstile.actors.demo import HELP, DemoAgent
from turnstile.actors.node import open_node
from turnstile.runtime.clock import MockWallClock


class Site:
    """A loopback HTTP site answering ``version N`` (``N`` set by the test)."""

    def __init__(self) -> None:
        self.version = 1
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/status"

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    async def _handle(self, stream: trio.SocketStream) -> None:
        if await read_request_head(stream) is None:
            return
        body = f"version {self.version}".encode()
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        await stream.send_all(head.encode() + body)
        await stream.aclose()


@asynccontextmanager
async def demo_node(tmp_path):
    modules = ModulesConfig(http=HttpModuleConfig(allowed_networks=["127.0.0.0/8"]))
    async with trio.open_nursery() as nursery:
        site = Site()
        await site.serve(nursery)
        async with running_node(tmp_path, agent=DemoAgent(), modules=modules) as node:
            await new_session(node, "demo")
            async with connect(node) as client:
                await client.send(type="attach", session_id="demo")
                await client.expect("session_sync")
                yield client, site
        nursery.cancel_scope.cancel()


async def say(client, text: str) -> dict:
    """Send ``text`` and return its turn's ``stream_end``."""
    await client.send(type="send", session_id="demo", content=text)
    ack = await client.expect("ack")
    return await client.expect("stream_end", input_id=ack["input_id"])


async def test_the_demo_carries_requests_out_through_tool_calls(tmp_path):
    async with demo_node(tmp_path) as (client, site):
        url = site.url
        end = await say(client, "remember that I like dark roast")
        saved = await client.expect("tool_call", tool="memory")
        assert saved["arguments"] == {
            "action": "save",
            "category": "notes",
            "key": "i_like_dark_roast",
            "value": "I like dark roast",
            "source": "user_explicit",
        }
        assert saved["ok"] is True, saved
        assert end["text"] == "🧠 Noted: “I like dark roast”."
        end = await say(client, "What do you remember about me?")
        assert (await client.expect("tool_call", tool="memory"))["arguments"] == {"action": "list"}
        assert end["text"] == "What I remember about you:\n- I like dark roast"

        end = await say(client, "every weekday at 9am say standup")
        cron = await client.expect("tool_call", tool="schedule_cron")
        assert cron["arguments"] == {
            "cron": "every weekday at 9am",  # the time as written, for the tool to read
            "action_type": "notification",
            "prompt": "standup",
            "label": "standup",
        }
        job = cron["result"]["job_id"]
        assert cron["result"]["cron"] == "0 9 * * 1-5"
        assert end["text"].startswith("📅 Scheduled: “standup”, every weekday at 09:00 UTC — next")
        assert f"(job {job}; “cancel {job}” stops it)" in end["text"]

        end = await say(client, f"watch {url} every 30 seconds and tell me when it changes")
        watch = await client.expect("tool_call", tool="watch_start")
        assert watch["arguments"] == {
            "tool": "http.get",
            "params": {"url": url},
            "interval": 30,
            "label": url,
            "notify_when": "on_change",
        }
        watcher = watch["result"]["watcher_id"]
        assert end["text"].startswith(f"👀 Watching {url} every 30 s;")
        # the watcher's first look is an escalation: a turn of its own, answered
        first = await client.expect(
            lambda f: f["type"] == "stream_end" and f["text"].startswith(f"👀 {url}")
        )
        assert first["text"] == (
            f"👀 {url}: first look taken (HTTP 200, 9 bytes); I will say when it changes."
        )

        end = await say(client, f"fetch {url} in the background")
        run = await client.expect("tool_call", tool="background_run")
        assert run["arguments"] == {"name": "http.get", "params": {"url": url}}
        task = run["result"]["task_id"]
        assert end["text"].startswith(f"📦 Fetching {url} in the background (task {task})")
        done = await client.expect(
            lambda f: f["type"] == "stream_end" and f["text"].startswith(f"📦 Task {task}")
        )
        assert done["text"].endswith(": HTTP 200, 9 bytes")

        end = await say(client, "what's scheduled?")
        for tool in ("schedule_list", "manage_recall", "watch_list"):
            assert (await client.expect("tool_call", tool=tool))["ok"] is True
        assert f"- 📅 {job}: “standup” — every weekday at 09:00 UTC" in end["text"]
        assert f"- 👀 {watcher}: {url} every 30 s (running)" in end["text"]

        end = await say(client, f"cancel {job}")
        cancelled = await client.expect("tool_call", tool="schedule_cancel")
        assert (cancelled["arguments"], cancelled["ok"]) == ({"job_id": job}, True)
        assert end["text"] == f"Cancelled {job}."
        end = await say(client, f"annule {watcher}")
        assert (await client.expect("tool_call", tool="schedule_cancel"))["ok"] is False
        stopped = await client.expect("tool_call", tool="watch_stop")
        assert (stopped["arguments"], stopped["ok"]) == ({"watcher_id": watcher}, True)
        assert end["text"] == f"Annulé : {watcher}."


async def test_a_reminder_fires_into_the_session_over_the_websocket(tmp_path):
    async with demo_node(tmp_path) as (client, _):
        end = await say(client, "remind me in 2 seconds to stretch")
        recall = await client.expect("tool_call", tool="schedule_recall")
        assert recall["arguments"] == {
            "call_type": "once",
            "when": "in 2 seconds",
            "internal_comment": "stretch",
            "additional_context_message": "Remind the user: stretch",
        }
        rid = recall["result"]["recall_id"]
        assert end["text"].startswith("⏰ Reminder set: “stretch”, in 2s — ")
        fired = await client.expect(
            lambda f: f["type"] == "stream_start" and f["source"] == "recall"
        )
        assert fired["is_recall"] is True
        reminder = await client.expect("stream_end", input_id=fired["input_id"])
        assert reminder["text"] == "⏰ Reminder: stretch"
        assert rid in fired["content"]


async def test_a_watcher_tells_when_the_page_changes(tmp_path):
    """On the real clock: the shortest interval a watcher takes, 5 seconds."""
    async with demo_node(tmp_path) as (client, site):
        url = site.url
        await say(client, f"surveille {url} toutes les 5 secondes et préviens-moi quand ça change")
        assert (await client.expect("tool_call", tool="watch_start"))["arguments"]["interval"] == 5
        await client.expect(lambda f: f["type"] == "stream_end" and "first look" in f["text"])
        site.version = 22  # "version 22": one byte more
        changed = await client.expect(
            lambda f: f["type"] == "stream_end" and "changed" in f["text"]
        )
        assert changed["text"].startswith(f"👀 {url} changed (check #")
        assert changed["text"].endswith("): HTTP 200, 10 bytes")


async def test_anything_else_is_echoed_with_what_the_demo_can_do(tmp_path):
    async with demo_node(tmp_path) as (client, _):
        end = await say(client, "hello")
        assert end["text"] == f"You said: hello\n{HELP}"
        assert 'agent = "openai"' in HELP and "remind me in 2 minutes to stretch" in HELP
        end = await say(client, '/call echo {"text": "hi"}')  # the scripted agent's commands
        assert end["text"] == 'echo returned {"text": "hi"}'
        end = await say(client, "remind me in 7 parsecs to stretch")
        assert end["text"].startswith("You said: remind me in 7 parsecs to stretch\n")
        # a time the tool understands but refuses: its reason comes back
        end = await say(client, "every 7 minutes say hi")
        assert end["text"] == (
            "schedule_cron failed: 'every 7 minutes' would drift at the hour: 7 does not divide"
            " 60; use a cron expression (e.g. '*/7 * * * *') if that is what you want"
        )


async def test_tool_policies_apply_to_the_demos_calls(tmp_path):
    policies = {"schedule_cron": "APPROVE", "memory.save": "BLOCK"}
    async with running_node(tmp_path, agent=DemoAgent(), policies=policies) as node:
        await new_session(node, "demo")
        async with connect(node) as client:
            await client.send(type="attach", session_id="demo")
            await client.expect("session_sync")
            await client.send(
                type="send", session_id="demo", content="every weekday at 9am say standup"
            )
            ack = await client.expect("ack")
            asked = await client.expect("approval_required", tool="schedule_cron")
            assert asked["arguments"]["cron"] == "every weekday at 9am"
            await client.send(type="approve", session_id="demo", approval_id=asked["approval_id"])
            end = await client.expect("stream_end", input_id=ack["input_id"])
            assert end["text"].startswith("📅 Scheduled: “standup”, every weekday at 09:00 UTC")
            end = await say(client, "remember that I like dark roast")
            assert end["text"] == (
                "memory failed: memory.save is blocked by policy (a tool policy: see [policies]"
                " in the config, docs/tools.md)"
            )


async def test_a_loopback_url_is_refused_with_how_to_allow_it(tmp_path):
    async with running_node(tmp_path, agent=DemoAgent()) as node:  # default http settings
        await new_session(node, "demo")
        async with connect(node) as client:
            await client.send(type="attach", session_id="demo")
            await client.expect("session_sync")
            end = await say(client, "fetch http://127.0.0.1:9/status in the background")
            assert end["text"].startswith("📦 Fetching http://127.0.0.1:9/status")
            failed = await client.expect(
                lambda f: f["type"] == "stream_end" and "failed" in f["text"]
            )
            assert failed["text"].endswith(
                "failed: refusing 127.0.0.1 (loopback address) for host '127.0.0.1' (loopback"
                " and private addresses are refused unless [modules.http] allowed_hosts or"
                " allowed_networks allows them, docs/tools.md)"
            )


# -- on the mock clock ---------------------------------------------------------------------------

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)  # a Saturday
TOKEN = "alice-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class CountedDemo(DemoAgent):
    """The demo agent, counting the turns it ran (for the test to wait on, not to poll)."""

    def __init__(self) -> None:
        super().__init__()
        self.ran = 0
        self._ran = trio.Event()

    async def run_turn(self, turn) -> str:
        try:
            return await super().run_turn(turn)
        finally:
            self.ran += 1
            self._ran.set()

    async def wait_turns(self, count: int) -> None:
        while self.ran < count:
            self._ran = trio.Event()
            await self._ran.wait()
        # the turn's end is stored once the runner is done with it (no thread: in-memory)
        await trio.testing.wait_all_tasks_blocked()


@asynccontextmanager
async def mock_clock_node():
    """Every default feature and the demo agent on ``MockWallClock``, over the gateway's
    app; in-memory SQLite, so that nothing waits on a thread and the clock jumps exactly."""
    clock = MockWallClock(T0)
    agent = CountedDemo()
    config = Config(store="sqlite:///:memory:")
    async with open_node(
        config, tokens={TOKEN: "alice"}, agent=agent, clock=clock, serve=False
    ) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            yield http, clock, agent


async def turns(http: httpx.AsyncClient, session: str) -> list[tuple[str, str, str]]:
    """``(source, started at, text)`` of each finished turn of ``session``."""
    events = (await http.get(f"/sessions/{session}/events", headers=AUTH)).json()["events"]
    starts = {e["input_id"]: e for e in events if e["type"] == "stream_start"}
    return [
        (starts[e["input_id"]]["source"], starts[e["input_id"]]["ts"], e["text"])
        for e in events
        if e["type"] == "stream_end"
    ]


async def told(http, agent: CountedDemo, session: str, text: str) -> None:
    """Send ``text`` to ``session`` and wait until the agent has answered it."""
    before = agent.ran
    sent = await http.post(f"/sessions/{session}/messages", json={"content": text}, headers=AUTH)
    assert sent.status_code == 202, sent.text
    await agent.wait_turns(before + 1)


def at(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


@pytest.mark.guard(3600 * 24 * 7)
async def test_remind_me_in_2_minutes_fires_two_minutes_later_in_both_languages(autojump_clock):
    async with mock_clock_node() as (http, clock, agent):
        for session in ("en", "fr"):
            made = await http.post("/sessions", json={"id": session}, headers=AUTH)
            assert made.status_code == 201, made.text
        await told(http, agent, "en", "remind me in 2 minutes to stretch")
        await told(http, agent, "fr", "rappelle-moi dans 2 minutes de m'étirer")
        await trio.sleep(119)
        assert [t[0] for t in await turns(http, "en")] == ["user"]
        await agent.wait_turns(4)  # both reminders
        (_, (source, started, text)) = await turns(http, "en")
        assert (source, text) == ("recall", "⏰ Reminder: stretch")
        assert at(started) - T0 < timedelta(minutes=2, seconds=1)
        assert at(started) >= T0 + timedelta(minutes=2)
        (_, (source, _, text)) = await turns(http, "fr")
        assert (source, text) == ("recall", "⏰ Rappel : m'étirer")


@pytest.mark.guard(3600 * 24 * 7)
async def test_every_weekday_at_9am_says_standup_on_monday_at_nine(autojump_clock):
    async with mock_clock_node() as (http, clock, agent):
        made = await http.post("/sessions", json={"id": "team"}, headers=AUTH)
        assert made.status_code == 201, made.text
        await told(http, agent, "team", "tous les jours de semaine à 9h dis standup")
        ((_, _, text),) = await turns(http, "team")
        assert text.startswith(
            "📅 Prévu : « standup », every weekday at 09:00 UTC — next 2026-11-23T09:00:00Z"
        )
        monday_nine = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
        await agent.wait_turns(2)
        assert clock.now() >= monday_nine
        (_, (source, started, text)) = await turns(http, "team")
        assert (source, text) == ("cron", "🔔 standup")
        assert monday_nine <= at(started) < monday_nine + timedelta(seconds=1)
