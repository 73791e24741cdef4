"""The reference's composition (scheduling-heartbeats.md §5), end to end on the mock clock: the
agent pushes a fix to PR #3 and schedules a 7-minute fallback ``schedule_check``; the failing
``check_run`` GitHub sends first wakes the same session, and the agent cancels the fallback. And
the other way: no webhook ever comes, and the check fires at minute 7.

The node is real (every default feature, the gateway's app); requests go through the gateway
with a real HTTP client over an ASGI transport, signed as GitHub signs them; the store is
in-memory SQLite so that ``MockClock(autojump_threshold=0)`` stays exact (no thread waits)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import trio

from tests.support.github import GITHUB_SECRET, check_run_event, deliver
from turnstile.actors.config import Config
from turnstile.actors.node import open_node
from turnstile.actors.webhooks.settings import GitHubConfig, RepoConfig, WebhooksConfig
from turnstile.runtime.clock import MockWallClock

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
TOKEN = "alice-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class CiAgent:
    """A scripted agent playing the reference's scenario: on "push" it binds its session to
    PR #3 and schedules the fallback check; woken by a CI failure it cancels the fallback;
    woken by the check it looks at CI by hand."""

    name = "ci"

    def __init__(self, clock: MockWallClock) -> None:
        self.clock = clock
        self.check_id: str | None = None
        self.turns: list[tuple[str, datetime, str]] = []
        self._turned = trio.Event()

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn) -> str:
        source = turn.input.source
        if source == "user":
            await turn.call_tool("bind_source", {"source": "github:acme/app#3"})
            scheduled = await turn.call_tool(
                "schedule_check",
                {
                    "delay_minutes": 7,
                    "instructions": "Check CI on PR #3; if it failed, read the logs and fix it.",
                    "reference": "https://github.com/Acme/App/pull/3",
                },
            )
            self.check_id = scheduled.data["scheduled_id"]
            reply = "Pushed the fix to PR #3; I will check CI in 7 minutes at the latest."
        elif source == "webhook":
            payload = turn.input.payload
            cancelled = await turn.call_tool("cancel_scheduled", {"scheduled_id": self.check_id})
            reply = (
                f"CI said {payload['name']}: {payload['conclusion']} on PR #{payload['pr_number']}"
                f" ({payload['output_title']}); fallback check {cancelled.data['status']}."
            )
        else:
            reply = "Checked CI by hand: no news from GitHub."
        self.turns.append((source, self.clock.now(), reply))
        self._turned.set()
        return reply

    async def wait_turns(self, count: int) -> None:
        while len(self.turns) < count:
            self._turned = trio.Event()
            await self._turned.wait()


@asynccontextmanager
async def ci_node():
    clock = MockWallClock(T0)
    agent = CiAgent(clock)
    config = Config(
        store="sqlite:///:memory:",
        webhooks=WebhooksConfig(
            github=GitHubConfig(secret=GITHUB_SECRET, repos={"acme/app": RepoConfig(user="alice")})
        ),
    )
    async with open_node(
        config, tokens={TOKEN: "alice"}, agent=agent, clock=clock, serve=False
    ) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            assert (await http.post("/sessions", json={"id": "pr3"}, headers=AUTH)).is_success
            sent = await http.post("/sessions/pr3/messages", json={"content": "push"}, headers=AUTH)
            assert sent.status_code == 202
            await agent.wait_turns(1)
            yield node, http, agent


async def check_state(http: httpx.AsyncClient, check_id: str) -> str:
    jobs = (await http.get("/sessions/pr3/jobs", headers=AUTH)).json()["jobs"]
    (job,) = [j for j in jobs if j["id"] == check_id]
    return job["state"]


@pytest.mark.guard(3600)
async def test_the_webhook_arrives_first_wakes_the_session_and_the_fallback_is_cancelled(
    autojump_clock,
):
    async with ci_node() as (node, http, agent):
        assert await check_state(http, agent.check_id) == "active"
        await trio.sleep(150)  # CI runs for two and a half minutes, then fails
        failed = check_run_event(conclusion="failure", pr=3, branch="fix-login")
        answer = await deliver(http, "check_run", failed)
        assert answer.status_code == 202
        await agent.wait_turns(2)
        source, at, reply = agent.turns[1]
        assert (source, at) == ("webhook", T0 + timedelta(seconds=150))
        assert reply == (
            "CI said tests: failure on PR #3 (2 tests failed); fallback check cancelled."
        )
        assert await check_state(http, agent.check_id) == "cancelled"
        await trio.sleep(20 * 60)  # long past minute 7: the check never fires
        assert [t[0] for t in agent.turns] == ["user", "webhook"]
        events = (await http.get("/sessions/pr3/events", headers=AUTH)).json()["events"]
        starts = [e["source"] for e in events if e["type"] == "stream_start"]
        assert starts == ["user", "webhook"]


@pytest.mark.guard(3600)
async def test_without_the_webhook_the_fallback_check_fires_at_minute_7(autojump_clock):
    async with ci_node() as (node, http, agent):
        await trio.sleep(20 * 60)  # GitHub never calls
        assert [(t[0], t[1]) for t in agent.turns] == [
            ("user", T0),
            ("check", T0 + timedelta(minutes=7)),
        ]
        assert await check_state(http, agent.check_id) == "completed"
        # CI passing later wakes nobody
        answer = await deliver(http, "check_run", check_run_event(conclusion="success"))
        assert answer.json()["ignored"] is True
        assert len(agent.turns) == 2
