"""Extraction on a MockClock: idle sessions are swept, their transcript (tool output cut at 500)
goes to the stand-in model server, facts are saved with the reference's confidences, the
summary is rendered from them and injected; a session is not extracted twice for the same
activity; extraction holds a scheduled-turn slot; off without a model server. Both backends."""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import msgspec
import openai._base_client as openai_base_client
import pytest
import trio
import trio.testing

from tests.support.fake_openai import OpenAIStandIn, text_stream
from tests.support.sessions import Recorder
from turnstile.actors.config import Config, Limits, MemoryConfig
from turnstile.actors.memory.extraction import (
    EXTRACTION_PROMPT,
    Extractor,
    parse_facts,
    render_summary,
    render_transcript,
)
from turnstile.actors.memory.injection import memory_message
from turnstile.actors.memory.queries import Fact
from turnstile.actors.node import default_features, open_node
from turnstile.actors.sessions.agents import OpenAIAgent, ScriptedAgent
from turnstile.actors.sessions.agents.base import HistoryEntry
from turnstile.runtime.clock import MockWallClock

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
MINUTE = 60
FACTS = [
    {
        "category": "preferences",
        "key": "coffee",
        "value": "dark roast, no sugar",
        "source": "user_explicit",
        "source_context": "I drink dark roast",
    },
    {"category": "setup", "key": "timezone", "value": "UTC", "source": "tool_call"},
    {"category": "personal", "key": "city", "value": "Lisbon", "source": "rumour"},
]


def model_for(standin: OpenAIStandIn) -> OpenAIAgent:
    """The openai agent on the stand-in, in-process (no socket: a MockClock may run)."""
    agent = OpenAIAgent(
        base_url="http://standin/v1", model="m", max_retries=0, transport=standin.transport()
    )
    # The openai client looks up the platform in a worker thread on its first request; a
    # MockClock jumps ahead while a thread runs, so look it up here (test_openai_streaming.py).
    agent._openai()._platform = openai_base_client.get_platform()
    return agent


def answer(facts) -> object:
    return text_stream(f"```json\n{json.dumps(facts)}\n```")


@asynccontextmanager
async def node_with(store_url, standin, *, slots: int = 3, mock: bool = True, **memory):
    """A node with sessions s1 and s2 of ada. ``mock``: on the MockClock, whose autojump needs
    a store that never waits on a thread or a socket: in-memory SQLite."""
    config = Config(
        store=store_url,
        memory=MemoryConfig(**memory),
        limits=Limits(max_concurrent_scheduled_turns=slots),
    )
    agent = ScriptedAgent(token_delay=0)
    features = default_features(agent)
    (feature,) = [f for f in features if f.name == "memory"]
    if standin is not None:
        feature.extraction_model = model_for(standin)
    clock = MockWallClock(T0) if mock else None
    if mock:
        config = msgspec.structs.replace(config, store="sqlite:///:memory:")
    async with open_node(
        config, tokens={"t" * 20: "ada"}, agent=agent, clock=clock, features=features, serve=False
    ) as node:
        for name in ("s1", "s2"):
            await node.directory.create_session("ada", session_id=name)
        yield node, feature


async def chat(node, session: str, *lines: str) -> None:
    for line in lines:
        await node.directory.submit("ada", session, line)


@pytest.mark.guard(6 * 3600)
async def test_an_idle_session_is_extracted_once_per_activity(autojump_clock):
    standin = OpenAIStandIn()
    standin.script(answer(FACTS))
    async with node_with(None, standin, extraction_interval_seconds=60) as (node, feature):
        memory, extractor = feature.memory, feature.extractor
        await chat(node, "s1", "I drink dark roast, no sugar", "/call clock.now {}")
        await trio.sleep(29 * MINUTE)
        assert standin.requests == []  # not idle long enough yet
        await trio.sleep(3 * MINUTE)
        (seen,) = standin.requests
        messages = seen.body["messages"]
        assert messages[0] == {"role": "system", "content": EXTRACTION_PROMPT}
        transcript = messages[1]["content"]
        assert transcript.startswith("User: I drink dark roast, no sugar\nAssistant: You said:")
        assert (
            "[Tool call] clock.now({})\n[Tool result] clock.now (untrusted tool output):\n```\n{"
            in (transcript)
        )
        assert "tools" not in seen.body and len(messages) == 2
        facts, total = await memory.list_facts("ada", sort_by="key")
        assert total == 3
        got = {f.key: (f.value, f.source, f.confidence) for f in facts}
        assert got == {
            "city": ("Lisbon", "conversation", 70),
            "coffee": ("dark roast, no sugar", "user_explicit", 90),
            "timezone": ("UTC", "tool_call", 95),
        }
        summary = (await memory.get_summary("ada")).content
        assert summary == (
            "Personal:\n- city: Lisbon\nPreferences:\n- coffee: dark roast, no sugar\n"
            "Setup:\n- timezone: UTC"
        )
        # the next turn of ada gets it injected (the write dropped the cached "none")
        assert await feature.summaries.message("ada") == memory_message(summary)
        # s2 never had a turn: nothing to extract, but it is marked, and asks no model
        assert await memory.extracted_at("ada/s2") is not None
        # no new activity: never again, however many sweeps
        await trio.sleep(3 * 3600)
        assert len(standin.requests) == 1
        assert extractor.statistics().extracted == 2
        # new activity makes s1 due again, once it is idle again
        standin.script(answer([{"category": "preferences", "key": "tea", "value": "green"}]))
        await chat(node, "s1", "I also like green tea")
        await trio.sleep(31 * MINUTE + 60)
        assert len(standin.requests) == 2
        assert "User: I also like green tea" in standin.requests[1].body["messages"][1]["content"]
        assert "- tea: green" in (await memory.get_summary("ada")).content
        await trio.sleep(3600)
        assert len(standin.requests) == 2
    assert standin.rejected == []


@pytest.mark.guard(3 * 3600)
async def test_creating_a_session_extracts_that_users_stale_sessions(autojump_clock):
    """The reference's trigger: a new session of a user extracts that user's stale sessions at
    once, whatever the sweep's interval; another user's new session does not."""
    standin = OpenAIStandIn()
    standin.script(answer(FACTS[:1]))
    async with node_with(None, standin, extraction_interval_seconds=86_400) as (node, feature):
        memory, extractor = feature.memory, feature.extractor
        await chat(node, "s1", "I drink dark roast, no sugar")
        await trio.sleep(31 * MINUTE)  # idle long enough; the sweep is a day away
        assert standin.requests == []
        await node.directory.create_session("bob", session_id="b1")
        await trio.testing.wait_all_tasks_blocked()
        assert standin.requests == [] and await memory.extracted_at("ada/s1") is None
        await node.directory.create_session("ada", session_id="s3")
        await trio.testing.wait_all_tasks_blocked()
        (seen,) = standin.requests
        assert seen.body["messages"][1]["content"].startswith("User: I drink dark roast")
        assert await memory.extracted_at("ada/s1") is not None
        assert await memory.extracted_at("ada/s2") is not None  # stale too (no model call)
        assert await memory.extracted_at("ada/s3") is None  # just created: not stale
        facts, _ = await memory.list_facts("ada")
        assert [f.key for f in facts] == ["coffee"]
        assert "- coffee: dark roast" in (await memory.get_summary("ada")).content
        # nothing new: another session created asks the model nothing
        await node.directory.create_session("ada", session_id="s4")
        await trio.testing.wait_all_tasks_blocked()
        assert len(standin.requests) == 1 and extractor.statistics().extracted == 2
    assert standin.rejected == []


@pytest.mark.guard(3 * 3600)
async def test_a_failing_model_leaves_the_session_for_the_next_sweep(autojump_clock):
    standin = OpenAIStandIn()  # no scripted reply: the stand-in answers 500
    async with node_with(None, standin, extraction_interval_seconds=600) as (node, feature):
        await chat(node, "s1", "remember: I use vim")
        await trio.sleep(45 * MINUTE)
        assert len(standin.requests) == 1
        assert await feature.memory.extracted_at("ada/s1") is None
        assert feature.extractor.statistics().failed == 1
        standin.script(answer([{"category": "setup", "key": "editor", "value": "vim"}]))
        await trio.sleep(10 * MINUTE)
        assert len(standin.requests) == 2
        assert await feature.memory.extracted_at("ada/s1") is not None
        facts, _ = await feature.memory.list_facts("ada")
        assert [(f.key, f.confidence) for f in facts] == [("editor", 70)]


async def test_extraction_is_off_with_the_scripted_agent_and_no_model_server(store_url, caplog):
    caplog.set_level(logging.INFO, logger="turnstile.memory")
    async with node_with(store_url, None, mock=False) as (node, feature):
        assert feature.extractor is None
    off = [r.getMessage() for r in caplog.records if "memory extraction" in r.getMessage()]
    assert off == [
        "memory extraction: off (a model-less agent and no [openai] base_url: no model to"
        " extract with)"
    ]


class GatedModel:
    """A model that holds every call until the test lets it go; counts calls at once."""

    name = "gated"

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.release = trio.Event()

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn) -> str:
        self.running += 1
        self.most = max(self.most, self.running)
        await self.release.wait()
        self.running -= 1
        return "[]"


@pytest.mark.guard(3600)
async def test_extraction_takes_the_scheduled_turn_slots(autojump_clock):
    async with node_with(None, None, slots=1) as (node, feature):
        await chat(node, "s1", "one")
        await chat(node, "s2", "two")
        await trio.sleep(MINUTE)
        model = GatedModel()
        extractor = Extractor(
            feature.memory,
            node.store,
            model,
            stale_after=timedelta(seconds=1),
            interval=3600,
            history_entries=50,
            slots=lambda: feature_slots(node),
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(extractor.sweep)
            await trio.sleep(1)
            assert (model.running, feature_slots(node).borrowed_tokens) == (1, 1)
            model.release.set()
        assert model.most == 1 and extractor.statistics().extracted == 2


async def test_the_sweep_queries_on_both_backends(store_url):
    """On the real clock (the store may wait on a socket): sweeps called by hand."""
    standin = OpenAIStandIn()
    standin.script(answer(FACTS[:1]), answer([]))
    async with node_with(store_url, None, mock=False) as (node, feature):
        model = model_for(standin)
        extractor = Extractor(
            feature.memory,
            node.store,
            model,
            stale_after=timedelta(0),
            interval=3600,
            history_entries=50,
        )
        seen = Recorder()  # attached, so no session_sync follows a turn's stream_end
        await node.directory.attach("ada", "s1", seen)
        await chat(node, "s1", "I drink dark roast")
        await seen.until(b'"stream_end"', 1)
        cache = feature.summaries
        assert await cache.message("ada") is None  # (s1's turn read it: no summary yet)
        loads = cache.statistics().loads
        assert await extractor.sweep("bob") == 0  # one user's (a new session's trigger)
        assert await extractor.sweep("ada") == 2  # s1 and s2 (s2 without a model call)
        assert len(standin.requests) == 1
        # the summary extraction wrote reached the cache through memory's notice
        assert await cache.message("ada") == memory_message(
            "Preferences:\n- coffee: dark roast, no sugar"
        )
        assert cache.statistics().loads == loads + 1
        assert await extractor.sweep() == 0  # nothing happened since
        facts, _ = await feature.memory.list_facts("ada")
        assert [(f.key, f.source, f.confidence) for f in facts] == [("coffee", "user_explicit", 90)]
        await chat(node, "s1", "nothing new")
        await seen.until(b'"stream_end"', 2)
        assert await extractor.sweep() == 1
        assert len(standin.requests) == 2
        assert await extractor.sweep() == 0
        # a deleted session leaves no extraction state behind
        await node.directory.detach("ada", "s1", seen)
        await node.directory.delete_session("ada", "s1", confirm=True)
        assert await feature.memory.extracted_at("ada/s1") is None
    assert standin.rejected == []


def feature_slots(node):
    return node.features["sessions"].services.scheduled_turns


def test_the_transcript_cuts_tool_output_at_500():
    entries = [
        HistoryEntry(role="user", content="hi"),
        HistoryEntry(role="tool", content="x" * 600, tool="fs.read", arguments={"path": "a"}),
        HistoryEntry(role="assistant", content="done"),
        HistoryEntry(role="user", content="ping", source="cron"),
    ]
    assert render_transcript(entries) == (
        'User: hi\n[Tool call] fs.read({"path": "a"})\n'
        f"[Tool result] fs.read (untrusted tool output):\n```\n{'x' * 500}…\n```\nAssistant: done\n"
        "[Input from cron] (untrusted: not the user's words):\n```\nping\n```"
    )


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ('[{"category": "a", "key": "k", "value": "v"}]', ["k"]),
        ('Sure!\n```json\n[{"category": "a", "key": "k", "value": "v"}]\n```', ["k"]),
        ('Here: [{"category": "a", "key": "k", "value": 3}] done', ["k"]),
        ('{"facts": [{"category": "a", "key": "k", "value": "v"}]}', ["k"]),
        ('[{"category": "a", "key": "", "value": "v"}, 5, {"key": "x"}]', []),
        ("[]", []),
    ],
)
def test_parse_facts(text, keys):
    assert [f["key"] for f in parse_facts(text)] == keys


@pytest.mark.parametrize("text", ["no facts here", "[not json]", '{"a": 1}'])
def test_parse_facts_refuses_answers_without_an_array(text):
    with pytest.raises(ValueError, match="JSON array"):
        parse_facts(text)


def test_the_summary_fits_whole_lines_and_drops_empty_headings():
    def fact(category, key, value, confidence=70):
        return Fact("ada", category, key, value, "conversation", confidence, T0, T0)

    facts = [fact("b", "x", "1"), fact("a", "y", "2", 95), fact("a", "z", "3", 99)]
    assert render_summary(facts, 1000) == "A:\n- z: 3\n- y: 2\nB:\n- x: 1"
    assert render_summary(facts, 20) == "A:\n- z: 3\n- y: 2"
    assert render_summary(facts, 2) == ""
