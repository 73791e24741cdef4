"""``[execution] unified_session`` (cron-session-binding.md): a user's sessions are one
conversation for the model, while inputs, events and cron jobs stay bound to the concrete
session; never another user's. On a MockClock, with an in-memory store."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime

import msgspec
import pytest
import trio
import trio.testing

from turnstile.actors.config import Config, ExecutionConfig
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents.base import TurnContext
from turnstile.runtime.clock import MockWallClock
from turnstile.runtime.errors import BlockedByAutomations

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


class RecordingAgent:
    """Answers ``ok:<content>`` and keeps each turn's context."""

    name = "recording"

    def __init__(self) -> None:
        self.turns: list[TurnContext] = []

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn: TurnContext) -> str:
        self.turns.append(turn)
        return f"ok:{turn.input.content.splitlines()[-1]}"


@asynccontextmanager
async def node_with(unified: bool):
    agent = RecordingAgent()
    config = Config(
        store="sqlite:///:memory:",  # never waits on a thread: the MockClock may autojump
        agent="scripted",
        execution=ExecutionConfig(unified_session=unified),
    )
    async with open_node(
        config, tokens={"t" * 20: "ada"}, agent=agent, clock=MockWallClock(T0), serve=False
    ) as node:
        for user, name in (("ada", "web"), ("ada", "phone"), ("bob", "web")):
            await node.directory.create_session(user, session_id=name)
        yield node, agent


async def say(node, agent, user: str, session: str, content: str) -> TurnContext:
    """Send a message, let its turn run, and a minute pass (events get distinct times)."""
    seen = len(agent.turns)
    await node.directory.submit(user, session, content)
    await trio.testing.wait_all_tasks_blocked()
    assert len(agent.turns) == seen + 1
    await trio.sleep(60)
    return agent.turns[-1]


def contents(turn: TurnContext) -> list[str]:
    return [entry.content for entry in turn.history]


@pytest.mark.guard(3 * 3600)
async def test_a_users_sessions_are_one_conversation_and_cron_stays_bound(autojump_clock):
    async with node_with(unified=True) as (node, agent):
        await say(node, agent, "ada", "web", "I am in Lisbon")
        await say(node, agent, "bob", "web", "bob's secret")
        turn = await say(node, agent, "ada", "phone", "where am I?")
        assert turn.session_id == "ada/phone"
        # phone's turn sees web's conversation, in order, without its own input; bob's never
        assert contents(turn) == ["I am in Lisbon", "ok:I am in Lisbon"]
        turn = await say(node, agent, "ada", "web", "and now?")
        assert contents(turn) == [
            "I am in Lisbon",
            "ok:I am in Lisbon",
            "where am I?",
            "ok:where am I?",
        ]
        # each session's own log and transcript stay its own
        phone = [e.content for e in await node.directory.history("ada", "phone")]
        assert phone == ["where am I?", "ok:where am I?"]
        # a cron job binds to the concrete session that made it; its turn runs there, with
        # the unified history
        added = await node.directory.call_tool(
            "ada", "web", "cron", {"action": "add", "schedule": "0 13 * * *", "prompt": "digest"}
        )
        assert added.ok, added.error
        await trio.sleep(3600)
        await trio.testing.wait_all_tasks_blocked()
        cron = agent.turns[-1]
        assert (cron.session_id, cron.input.source) == ("ada/web", "cron")
        assert "where am I?" in contents(cron) and "bob's secret" not in contents(cron)
        web = await node.directory.history("ada", "web")
        assert (web[-2].cron_turn, web[-1].source) == (True, "cron")
        # deleting the phone session does not touch web's job; deleting web is blocked by it
        await node.directory.delete_session("ada", "phone")
        with pytest.raises(BlockedByAutomations):
            await node.directory.delete_session("ada", "web")
        # bob's own turn sees only bob's session
        turn = await say(node, agent, "bob", "web", "hello")
        assert contents(turn) == ["bob's secret", "ok:bob's secret"]


@pytest.mark.guard(3600)
async def test_off_each_session_is_its_own_conversation(autojump_clock):
    async with node_with(unified=False) as (node, agent):
        await say(node, agent, "ada", "web", "I am in Lisbon")
        turn = await say(node, agent, "ada", "phone", "where am I?")
        assert contents(turn) == []


def test_the_setting_is_off_by_default_and_typed():
    assert ExecutionConfig().unified_session is False
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"unified_session": "yes"}, ExecutionConfig)
