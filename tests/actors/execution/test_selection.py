"""What the model sees per turn (``execution.selection``): the default selection's size, every tool
reachable, groups, modes, profiles, the discovery tools, and the node wiring them into turns."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest
import trio

from turnstile.actors.config import ChannelSettings, Config, ExecutionConfig
from turnstile.actors.execution.selection import (
    DISCOVERY,
    GROUPS,
    ExecutionSettings,
    TurnShaper,
    register_discovery_tools,
    schema_chars,
    select_tools,
)
from turnstile.actors.node import open_node
from turnstile.actors.scheduling.heartbeat import HEARTBEAT_PROFILES
from turnstile.actors.sessions.agents.base import HistoryEntry, ToolSpec, TurnContext, TurnInput
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.registry import ToolRegistry

#: The issue's target: a plain chat turn carries at most this many characters of schemas.
SCHEMA_BUDGET = 6000
TOKEN = "selection-token-0123456789"


class RecordingAgent:
    """Keeps each turn's context; runs the tool calls a test queues for the next turn."""

    name = "recording"

    def __init__(self) -> None:
        self.turns: list[TurnContext] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.results: list[Any] = []
        self.done = trio.Condition()

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn: TurnContext) -> str:
        for name, arguments in self.calls:
            self.results.append(await turn.call_tool(name, arguments))
        self.calls = []
        self.turns.append(turn)
        async with self.done:
            self.done.notify_all()
        return "ok"


@asynccontextmanager
async def node(tmp_path, agent: RecordingAgent, **config: Any):
    settings = Config(port=0, store=f"sqlite:///{tmp_path}/node.db", **config)
    async with open_node(settings, tokens={TOKEN: "ada"}, agent=agent) as running:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=running.url, headers=headers) as http:
            yield http


async def turn_of(
    http: httpx.AsyncClient, agent: RecordingAgent, session: str, content: str = "hi", **body: Any
):
    """Create ``session`` (if new), send one message, and return the turn the agent got."""
    created = await http.post("/sessions", json={"id": session, **body})
    assert created.status_code == 201 or "already_exists" in created.text, created.text
    seen = len(agent.turns)
    sent = await http.post(f"/sessions/{session}/messages", json={"content": content})
    assert sent.status_code == 202, sent.text
    async with agent.done:
        while len(agent.turns) == seen:
            await agent.done.wait()
    return agent.turns[-1]


def indexed_names(turn: TurnContext) -> set[str]:
    """The names in ``tool_search``'s index (its description after ``Index:``)."""
    (search,) = [s for s in turn.tools if s.name == "tool_search"]
    index = search.description.split("Index: ", 1)[1].removesuffix(".")
    return {name for group in index.split("; ") for name in group.split(": ", 1)[1].split(", ")}


async def test_a_plain_turn_is_under_budget_and_every_tool_stays_reachable(tmp_path):
    agent = RecordingAgent()
    async with node(tmp_path, agent) as http:
        full = await turn_of(http, agent, "all", metadata={"execution": {"tool_mode": "direct"}})
        every = {s.name for s in full.tools} | set(DISCOVERY)
        plain = await turn_of(http, agent, "plain")
        carried = {s.name for s in plain.tools}
        chars = schema_chars(plain.tools)
        assert chars <= SCHEMA_BUDGET, f"{chars} characters of schemas"
        assert schema_chars(full.tools) > 4 * chars  # what compact mode is for
        assert GROUPS["primitives"] <= carried and set(DISCOVERY) <= carried
        index = indexed_names(plain)
        assert carried | index == every, sorted(every - carried - index)
        # Each indexed tool's schema is one tool_search call away, the same as direct mode's.
        agent.calls = [("tool_search", {"names": sorted(index)})]
        await turn_of(http, agent, "plain")
        answer = agent.results[-1]
        assert answer.ok, answer.error
        given = {t["name"]: t for t in answer.data["tools"]}
        assert set(given) == index
        for spec in full.tools:
            if spec.name in index:
                assert msgspec.convert(given[spec.name], ToolSpec) == spec


async def test_tool_run_answers_as_a_direct_call(tmp_path):
    agent = RecordingAgent()
    async with node(tmp_path, agent) as http:
        agent.calls = [
            ("tool_run", {"name": "echo", "params": {"text": "hi"}}),
            ("echo", {"text": "hi"}),
            ("tool_run", {"name": "echo", "params": {"text": 5}}),
            ("echo", {"text": 5}),
            ("tool_run", {"name": "no.such"}),
            ("tool_run", {"name": "tool_run", "params": {"name": "echo"}}),
        ]
        await turn_of(http, agent, "s")
        via, direct, bad_via, bad_direct, unknown, nested = agent.results
        assert via == direct and via.ok and via.data == {"text": "hi"}
        assert bad_via == bad_direct and bad_via.error["code"] == "bad_arguments"
        assert unknown.error == {"code": "unknown_tool", "message": "no tool named 'no.such'"}
        assert nested.error == {
            "code": "invalid_argument",
            "message": "tool_run cannot be run through tool_run",
            "field": "name",
        }


async def test_the_turn_gets_the_default_prompt_with_the_sessions_time(tmp_path):
    agent = RecordingAgent()
    async with node(tmp_path, agent) as http:
        turn = await turn_of(http, agent, "paris", metadata={"timezone": "Europe/Paris"})
        prompt = turn.input.system_prompt
        assert prompt.startswith("EXECUTION PRIMITIVES\n")
        assert "Do not poll" in prompt and "tool_search" in prompt
        assert "Session time zone: Europe/Paris. Current time: " in prompt


async def test_the_session_hands_the_agent_its_history_within_the_budget(tmp_path):
    agent = RecordingAgent()
    execution = ExecutionConfig(max_context_tokens=3000)
    async with node(tmp_path, agent, execution=execution) as http:
        await turn_of(http, agent, "s", content="x" * 8000)  # ~2,000 tokens: more than is left
        await turn_of(http, agent, "s", content="second")
        third = await turn_of(http, agent, "s", content="third")
        assert [(e.role, e.content) for e in third.history] == [
            ("user", "second"),
            ("assistant", "ok"),
        ]
        # the agent gets the budget too, for what the turn adds while it runs (its tool results)
        assert third.input.context_tokens == 3000


def log_channels(tmp_path, *names: str) -> dict[str, ChannelSettings]:
    return {name: ChannelSettings(type="log", path=str(tmp_path / f"{name}.log")) for name in names}


async def test_groups_and_profiles_from_the_config(tmp_path):
    agent = RecordingAgent()
    execution = ExecutionConfig(watchers=True, default_channel="ops", direct_tools=["http.get"])
    channels = log_channels(tmp_path, "ops")
    async with node(tmp_path, agent, execution=execution, channels=channels) as http:
        turn = await turn_of(http, agent, "s")
        carried = {s.name for s in turn.tools}
        assert GROUPS["watchers"] | {"send_notification", "http.get"} <= carried
        assert not GROUPS["scheduler"] & carried
        assert "watch_start:" in turn.input.system_prompt
        assert "The default channel is 'ops'" in turn.input.system_prompt
        # A session may choose a restricted profile: its tools only, every other one refused.
        agent.calls = [("filesystem.write", {"path": "a.txt", "content": "x"})]
        meta = {"execution": {"tool_profile": "heartbeat"}}
        turn = await turn_of(http, agent, "quiet", metadata=meta)
        carried = {s.name for s in turn.tools}
        assert "clock.now" in carried and carried <= HEARTBEAT_PROFILES["heartbeat"]
        assert "filesystem.write" not in carried and "tool_search" not in carried
        assert agent.results[-1].error["code"] == "not_allowed"


async def test_groups_turned_off_are_hidden_from_the_model(tmp_path):
    """The reference's ``execution.watchers: false`` / ``scheduler: false``: the model has no
    awareness of those tools. Not carried, not in tool_search's index or answers, not run by
    tool_run or called directly, not in the prompt; a session may turn a group back on (or
    off on a node that leaves it unset)."""
    agent = RecordingAgent()
    off = GROUPS["watchers"] | GROUPS["scheduler"]
    execution = ExecutionConfig(watchers=False, scheduler=False)
    async with node(tmp_path, agent, execution=execution) as http:
        agent.calls = [
            ("tool_search", {"names": ["watch_start", "remember", "clock.now"]}),
            ("tool_search", {"query": "watch"}),
            ("tool_search", {"query": "schedule"}),
            ("tool_run", {"name": "watch_list", "params": {}}),
            ("tool_run", {"name": "schedule_list", "params": {}}),
            ("watch_list", {}),
            ("tool_run", {"name": "clock.now", "params": {}}),
            ("run_parallel", {"actions": [{"name": "watch_list"}, {"name": "clock.now"}]}),
            ("background_run", {"name": "schedule_list"}),
        ]
        turn = await turn_of(http, agent, "s")
        carried = {s.name for s in turn.tools}
        assert not off & carried and not off & indexed_names(turn)
        assert "tool_search" in carried and "clock.now" in indexed_names(turn)
        prompt = turn.input.system_prompt
        for word in ("watch", "WATCHER", "SCHEDULED", "schedule", "remember"):
            assert word not in prompt, word
        (
            by_names,
            watch_query,
            schedule_query,
            run_watch,
            run_schedule,
            direct,
            clock,
            parallel,
            background,
        ) = agent.results
        assert [t["name"] for t in by_names.data["tools"]] == ["clock.now"]
        assert by_names.data["unknown"] == ["watch_start", "remember"]
        assert not off & {t["name"] for t in watch_query.data["tools"]}
        assert not off & {t["name"] for t in schedule_query.data["tools"]}
        assert run_watch.error == {"code": "unknown_tool", "message": "no tool named 'watch_list'"}
        assert run_schedule.error["code"] == "unknown_tool"
        assert direct.error["code"] == "not_allowed"
        assert clock.ok, clock.error
        hidden_action, clock_action = parallel.data["results"]
        assert hidden_action["error"] == {
            "code": "unknown_tool",
            "message": "no tool named 'watch_list'",
        }
        assert clock_action["success"] is True
        assert background.error == {
            "code": "invalid_argument",
            "message": "no tool named 'schedule_list'",
            "field": "name",
        }

        # a session of its own: watchers on, for it only
        meta = {"execution": {"watchers": True}}
        agent.calls = [("tool_run", {"name": "watch_list", "params": {}})]
        turn = await turn_of(http, agent, "watching", metadata=meta)
        assert GROUPS["watchers"] <= {s.name for s in turn.tools}
        assert not GROUPS["scheduler"] & ({s.name for s in turn.tools} | indexed_names(turn))
        assert "[WATCHER UPDATE]" in turn.input.system_prompt
        assert agent.results[-1].ok, agent.results[-1].error

    agent = RecordingAgent()
    (tmp_path / "default").mkdir()
    async with node(tmp_path / "default", agent) as http:  # unset: indexed like any tool
        turn = await turn_of(http, agent, "s")
        assert off <= indexed_names(turn)
        meta = {"execution": {"scheduler": False}}
        agent.calls = [("tool_search", {"names": ["schedule_once", "watch_start"]})]
        turn = await turn_of(http, agent, "quiet", metadata=meta)
        assert not GROUPS["scheduler"] & indexed_names(turn)
        assert GROUPS["watchers"] <= indexed_names(turn)
        assert agent.results[-1].data["unknown"] == ["schedule_once"]


async def test_jobs_and_watchers_made_without_a_channel_deliver_to_the_default_one(tmp_path):
    """The reference's ``default_channel``: the output of jobs and watchers whose creator named
    no channel (a session may choose its own); a channel named in the call wins, and a recall
    (``remember``) is the agent's own note, into the session."""
    agent = RecordingAgent()
    execution = ExecutionConfig(watchers=True, scheduler=True, default_channel="ops")
    channels = log_channels(tmp_path, "ops", "audit")
    async with node(tmp_path, agent, execution=execution, channels=channels) as http:
        agent.calls = [
            ("schedule_once", {"when": "in 1h", "prompt": "check the build"}),
            (
                "schedule_cron",
                {"cron": "0 9 * * *", "prompt": "standup", "output_channel": "audit"},
            ),
            ("remember", {"what": "look at the deploy", "when": "in 2h"}),
            ("watch_start", {"tool": "clock.now", "interval": 60}),
        ]
        await turn_of(http, agent, "s")
        once, cron, recall, watcher = agent.results
        assert all(r.ok for r in agent.results), [r.error for r in agent.results]
        assert once.data["output_channel"] == "ops"
        assert cron.data["output_channel"] == "audit"
        assert recall.data["output_channel"] == "llm_notification"
        assert watcher.data["notify_config"]["output_channel"] == "ops"
        # a session of its own choosing; and one that wants its output in the session
        meta = {"execution": {"default_channel": "audit"}}
        agent.calls = [("schedule_once", {"when": "in 1h", "prompt": "p"})]
        await turn_of(http, agent, "audited", metadata=meta)
        assert agent.results[-1].data["output_channel"] == "audit"
        meta = {"execution": {"default_channel": ""}}
        agent.calls = [("schedule_once", {"when": "in 1h", "prompt": "p"})]
        await turn_of(http, agent, "inside", metadata=meta)
        assert agent.results[-1].data["output_channel"] == "llm_notification"
        # a watcher started over HTTP gets the default too
        started = await http.post("/sessions/s/watchers", json={"tool": "clock.now"})
        assert started.status_code == 201, started.text
        detail = await http.get(f"/watchers/{started.json()['watcher_id']}")
        assert detail.json()["notify_config"]["output_channel"] == "ops"


async def test_a_default_channel_that_is_not_configured_stops_the_node(tmp_path):
    agent = RecordingAgent()
    with pytest.raises(BaseExceptionGroup) as caught:
        async with node(tmp_path, agent, execution=ExecutionConfig(default_channel="slack")):
            pass  # pragma: no cover
    error, _ = caught.value.split(InvalidArgument)
    while isinstance(error, BaseExceptionGroup):  # the supervisors' nurseries wrap it
        (error,) = error.exceptions
    assert error.field == "$.execution.default_channel"
    assert str(error) == "no channel named 'slack'; configured channels: llm_notification"


async def test_a_config_naming_an_unknown_tool_stops_the_node(tmp_path):
    agent = RecordingAgent()
    with pytest.raises(BaseExceptionGroup) as caught:
        async with node(tmp_path, agent, execution=ExecutionConfig(direct_tools=["http.gett"])):
            pass  # pragma: no cover
    error, _ = caught.value.split(InvalidArgument)
    while isinstance(error, BaseExceptionGroup):  # the supervisors' nurseries wrap it
        (error,) = error.exceptions
    assert (str(error), error.field) == ("no tool named 'http.gett'", "$.execution.direct_tools")


# -- unit tests on a small registry --------------------------------------------------------


class Text(msgspec.Struct):
    text: str = ""


def registry(*names: str) -> ToolRegistry:
    tools = ToolRegistry()

    async def handler(call, params):
        return {"text": params.text}

    for name in names:
        tools.register(name, Text, handler, f"The {name} tool. More words here.")
    register_discovery_tools(tools)
    return tools


def test_direct_mode_carries_every_tool_but_the_discovery_ones():
    tools = registry("run_parallel", "watch_start", "http.get")
    chosen = select_tools(tools.specs(), ExecutionSettings(tool_mode="direct"), {"full": None})
    assert [s.name for s in chosen.tools] == ["http.get", "run_parallel", "watch_start"]
    assert chosen.indexed == ()


def test_compact_mode_indexes_what_it_leaves_out():
    tools = registry("run_parallel", "watch_start", "http.get")
    chosen = select_tools(tools.specs(), ExecutionSettings(), {"full": None})
    assert [s.name for s in chosen.tools] == ["run_parallel", "tool_run", "tool_search"]
    assert chosen.indexed == ("http.get", "watch_start")
    search = chosen.tools[-1]
    assert search.description.endswith(
        "Index: watchers (check a tool periodically, hear only of changes): watch_start; "
        "more: http.get."
    )
    assert "Index" not in tools.specs()[-1].description  # the registered spec is untouched


def test_a_group_turned_off_is_neither_carried_nor_indexed():
    tools = registry("run_parallel", "watch_start", "schedule_once", "http.get")
    off = ExecutionSettings(watchers=False)
    chosen = select_tools(tools.specs(), off, {"full": None})
    assert [s.name for s in chosen.tools] == ["run_parallel", "tool_run", "tool_search"]
    assert chosen.indexed == ("http.get", "schedule_once")
    assert chosen.hidden == GROUPS["watchers"]
    assert "watch" not in chosen.tools[-1].description
    direct = select_tools(
        tools.specs(), ExecutionSettings(tool_mode="direct", scheduler=False), {"full": None}
    )
    assert [s.name for s in direct.tools] == ["http.get", "run_parallel", "watch_start"]
    profile = frozenset({"watch_start", "http.get"})
    restricted = select_tools(tools.specs(), off, {"full": None}, allowed=profile)
    assert restricted.allowed == {"http.get"}


def test_nothing_left_out_means_no_discovery_tools():
    tools = registry("run_parallel", "watch_start")
    chosen = select_tools(tools.specs(), ExecutionSettings(watchers=True), {"full": None})
    assert [s.name for s in chosen.tools] == ["run_parallel", "watch_start"]


def test_an_unknown_profile_is_refused():
    with pytest.raises(InvalidArgument, match=r"^tool_profile must be one of full, got 'x'$"):
        select_tools([], ExecutionSettings(tool_profile="x"), {"full": None})


class FixedClock(Clock):
    def __init__(self) -> None:
        super().__init__(lambda: datetime(2026, 3, 13, 14, 35, tzinfo=UTC))


def test_the_shaper_fits_history_into_what_prompt_and_tools_leave():
    tools = registry("run_parallel", "http.get")
    config = ExecutionConfig(max_context_tokens=1000)
    shaper = TurnShaper(tools, FixedClock(), config, {"full": None})
    old = [
        HistoryEntry(role="user", content="x" * 2000),
        HistoryEntry(role="assistant", content="a"),
    ]
    new = [HistoryEntry(role="user", content="hello"), HistoryEntry(role="assistant", content="hi")]
    shaped = shaper.shape({}, TurnInput(input_id=1, source="user", content="q"), old + new, None)
    assert shaped.history == new
    assert shaped.context_tokens == 1000
    assert shaped.system_prompt.endswith("Current time: 2026-03-13 14:35 (Friday).")
    assert shaped.allowed is None


def test_bad_session_overrides_fall_back_to_the_nodes_settings(caplog):
    tools = registry("run_parallel", "http.get")
    shaper = TurnShaper(tools, FixedClock(), ExecutionConfig(), {"full": None})
    assert shaper.settings_for({"execution": {"tool_mode": "all"}}) == shaper.settings
    assert shaper.settings_for({"execution": {"direct_tools": ["nope"]}}) == shaper.settings
    assert shaper.settings_for({"execution": {"watchers": True}}).watchers is True
    assert "ignoring a session's metadata.execution" in caplog.text


def test_the_config_is_checked_when_the_node_starts():
    tools = registry("run_parallel")
    with pytest.raises(InvalidArgument, match=r"^tool_profile must be one of full, got 'x'$"):
        TurnShaper(tools, FixedClock(), ExecutionConfig(tool_profile="x"), {"full": None})
    with pytest.raises(InvalidArgument, match=r"^timezone 'Mars/Base' is not a time zone$"):
        TurnShaper(tools, FixedClock(), ExecutionConfig(timezone="Mars/Base"), {"full": None})
