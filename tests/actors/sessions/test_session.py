"""The session actor on its own: scheduled inputs, injections, passivation, slow subscribers."""

from __future__ import annotations

from contextlib import asynccontextmanager

import msgspec
import pytest
import trio
import trio.testing

from tests.support.agents import GatedAgent
from tests.support.sessions import NoTools, Recorder
from turnstile.actors.scheduling.events import JobUpdate
from turnstile.actors.sessions.actor import (
    MAX_UNSTORED_EVENTS,
    Arrived,
    Attach,
    Delivered,
    Detach,
    GetStatus,
    Inject,
    SessionActor,
    SessionLimits,
    SessionServices,
    SetPolicy,
    Submit,
    Wake,
)
from turnstile.runtime.errors import NotFound
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor


class IgnoresInjections(GatedAgent):
    async def run_turn(self, turn):
        if turn.input.content.startswith("wait:"):
            await self.gate(turn.input.content).wait()
        return f"reply:{turn.input.content}"


@asynccontextmanager
async def open_session(agent, wrap_store=None):
    """Session "s" of "ada" over an in-memory store (``wrap_store`` may wrap it), with a
    ``Recorder`` attached; yields ``(ref, store, registry, recorder)``."""
    async with open_store("sqlite:///:memory:") as store:  # inline: exact under MockClock
        await store.create_session("s", "ada")
        if wrap_store is not None:
            store = wrap_store(store)
        services = SessionServices(
            store=store,
            agent=agent,
            tools=NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
        )
        async with open_supervisor("sessions", escalate=False) as sup:
            registry = Registry(sup, idle_timeout=30.0)
            registry.register("session", lambda key: SessionActor(key, services))
            ref = registry.ref("session:s")
            seen = Recorder()
            await ref.ask(Attach(subscriber=seen))
            yield ref, store, registry, seen


@pytest.fixture
async def session(request):
    agent = getattr(request, "param", None) or GatedAgent()
    async with open_session(agent) as (ref, store, registry, seen):
        yield ref, store, agent, registry, seen


async def ended_inputs(store) -> list[tuple[int, str, str]]:
    events = await store.read_events("s")
    return [
        (e.payload["input_id"], e.payload["status"], e.payload["text"])
        for e in events
        if e.type == "stream_end"
    ]


async def test_a_cron_input_during_a_turn_waits_and_is_never_injected(session):
    ref, store, agent, _, seen = session
    await ref.ask(Submit(content="wait:user"))
    await seen.until(b'"stream_start"')
    await ref.ask(SetPolicy(policy="inject"))  # even with inject, only user input folds in
    queued = await ref.ask(Submit(source="cron", content="nightly report"))
    assert queued.injected is False and queued.input_id is not None
    agent.gate("wait:user").set()
    await seen.until(b'"stream_end"', 2)
    events = await store.read_events("s")
    starts = [
        (e.payload["source"], e.payload["content"]) for e in events if e.type == "stream_start"
    ]
    assert starts == [("user", "wait:user"), ("cron", "nightly report")]
    assert [text for _, _, text in await ended_inputs(store)] == [
        "reply:wait:user",
        "reply:nightly report",
    ]


async def test_notifications_fold_into_a_running_turn_or_start_one_when_idle(session):
    ref, store, agent, _, seen = session
    idle = await ref.ask(Inject(content="build finished"))
    assert idle.input_id is not None  # idle: a turn of its own
    await seen.until(b'"stream_end"')
    await ref.ask(Submit(content="wait:t"))
    await seen.until(b'"stream_start"', 2)
    folded = await ref.ask(Inject(content="watcher fired"))
    assert folded.injected is True
    agent.gate("wait:t").set()
    await seen.until(b'"stream_end"', 2)
    texts = [text for _, _, text in await ended_inputs(store)]
    assert texts == ["reply:build finished", "reply:wait:t +watcher fired"]


@pytest.mark.parametrize("session", [IgnoresInjections()], indirect=True)
async def test_an_injection_the_agent_never_took_becomes_a_turn_of_its_own(session):
    ref, store, agent, _, seen = session
    await ref.ask(Submit(content="wait:t"))
    await seen.until(b'"stream_start"')
    assert (await ref.ask(Inject(content="late news"))).injected is True
    agent.gate("wait:t").set()
    await seen.until(b'"stream_end"', 2)
    texts = [text for _, _, text in await ended_inputs(store)]
    assert texts == ["reply:wait:t", "reply:late news"]


@pytest.mark.guard(1000)
async def test_a_session_is_not_passivated_mid_turn_or_while_watched(session, autojump_clock):
    ref, store, agent, registry, seen = session
    await ref.ask(Detach(subscriber=seen))
    await ref.ask(Submit(content="wait:long"))
    await trio.sleep(100)  # far past the 30 s idle timeout
    assert registry.is_active("session:s")
    assert (await ref.ask(GetStatus())).busy is True
    watcher = Recorder()
    await ref.ask(Attach(subscriber=watcher))
    agent.gate("wait:long").set()
    await watcher.until(b'"stream_end"')
    await trio.sleep(100)
    assert registry.is_active("session:s")  # an attached client keeps it alive
    await ref.ask(Detach(subscriber=watcher))
    await trio.sleep(100)
    assert not registry.is_active("session:s")


async def test_a_subscriber_that_falls_behind_is_dropped_and_told_where_it_stopped(session):
    ref, store, agent, _, fast = session
    slow = Recorder(accept=3)
    await ref.ask(Attach(subscriber=slow))
    await ref.ask(Submit(content="hello"))
    await fast.until(b'"stream_end"')
    assert slow.lagged_at == 3  # it got seqs 1-3, refused 4, and was dropped
    assert len(slow.frames) == 3
    assert len(fast.frames) == (await store.last_seq("s"))


# -- the event pipeline: streamed deltas do not wait for a commit each -------------------------


class GatedStore:
    """The real store, but ``append_events`` (and ``close_input_peek``, which appends a turn's
    closing events with its input's state) waits while ``closed`` (a slow disk, say)."""

    def __init__(self, store) -> None:
        self._store = store
        self.open = trio.Event()  # replace it with a fresh Event to stall the disk
        self.open.set()
        self.appends: list[list[str]] = []

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def append_events(self, session_id, events, *, fence=None):
        await self.open.wait()
        self.appends.append([type_ for type_, _ in events])
        return await self._store.append_events(session_id, events, fence=fence)

    async def close_input_peek(self, session_id, events, *args, **kwargs):
        await self.open.wait()
        self.appends.append([type_ for type_, _ in events])
        return await self._store.close_input_peek(session_id, events, *args, **kwargs)


class Streamer:
    """Streams ``words`` deltas as fast as it can, and notes how far it got."""

    name = "streamer"

    def __init__(self, words: int) -> None:
        self.words = words
        self.emitted = 0
        self.go = trio.Event()
        self.streamed = trio.Event()

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn) -> str:
        await self.go.wait()
        for i in range(self.words):
            await turn.emit("stream_delta", f"w{i} ")
            self.emitted += 1
        self.streamed.set()
        return "done"


@asynccontextmanager
async def gated_session(agent):
    """A session over a ``GatedStore``, with a ``Recorder`` attached."""
    async with open_session(agent, wrap_store=GatedStore) as (ref, gated, _, seen):
        yield ref, gated, seen


async def test_streamed_deltas_do_not_wait_for_the_store_and_are_offered_only_once_stored():
    agent = Streamer(words=50)
    async with gated_session(agent) as (ref, gated, seen):
        await ref.ask(Submit(content="go"))
        await trio.testing.wait_all_tasks_blocked()  # the turn started; its agent waits
        before = len(seen.frames)
        gated.open = trio.Event()  # the disk stalls
        agent.go.set()
        await agent.streamed.wait()  # all 50 deltas emitted while nothing could be stored
        await trio.testing.wait_all_tasks_blocked()
        assert len(seen.frames) == before  # and none offered before it is stored
        gated.open.set()
        await seen.until(b'"stream_end"')
        types = [msgspec.json.decode(f)["type"] for f in seen.frames]
        seqs = [msgspec.json.decode(f)["seq"] for f in seen.frames]
        assert types == ["turn_queued", "stream_start"] + ["stream_delta"] * 50 + ["stream_end"]
        assert seqs == list(range(1, len(types) + 1))
        assert len(gated.appends) <= 4  # a few commits, not one per delta
        assert [e.type for e in await gated.read_events("s")] == types


async def test_an_agent_far_ahead_of_the_store_waits_for_it():
    agent = Streamer(words=2000)
    async with gated_session(agent) as (ref, gated, seen):
        await ref.ask(Submit(content="go"))
        await trio.testing.wait_all_tasks_blocked()
        gated.open = trio.Event()
        agent.go.set()
        await trio.testing.wait_all_tasks_blocked()
        # held at the bound of unstored events (the first batch is stuck at the disk)
        assert MAX_UNSTORED_EVENTS - 2 <= agent.emitted <= MAX_UNSTORED_EVENTS
        assert not agent.streamed.is_set()
        gated.open.set()
        await seen.until(b'"stream_end"')
        assert seen.count(b'"stream_delta"') == 2000
        assert max(len(batch) for batch in gated.appends) <= MAX_UNSTORED_EVENTS


@pytest.mark.guard(1000)
async def test_a_turn_closes_even_when_the_store_takes_long_to_commit_it(autojump_clock):
    """Under load a turn's closure (its streamed events, stream_end, the inbox row) can wait
    seconds for the store; it must not be given up, or the input would stay running and the
    session would never take another one."""
    agent = Streamer(words=20)
    async with gated_session(agent) as (ref, gated, seen):
        first = await ref.ask(Submit(content="go"))
        await trio.testing.wait_all_tasks_blocked()
        gated.open = trio.Event()  # the disk stalls for a while
        agent.go.set()
        await trio.sleep(60)
        gated.open.set()
        await seen.until(b'"stream_end"')
        await trio.testing.wait_all_tasks_blocked()  # the inbox row is settled after stream_end
        assert [(i.id, i.state) for i in await gated.list_inputs("s")] == [(first.input_id, "done")]
        second = await ref.ask(Submit(content="again"))  # and the session goes on
        await seen.until(b'"stream_end"', 2)
        await trio.testing.wait_all_tasks_blocked()
        states = [i.state for i in await gated.list_inputs("s")]
        assert states == ["done", "done"] and second.input_id is not None


async def test_a_notice_for_a_missing_session_is_dropped_and_the_name_stays_usable(
    autojump_clock,
):
    """A background result or watcher escalation told to a session deleted meanwhile has
    nobody to reach: it is dropped, the actor does not crash, and a session created later under
    the same key starts afresh without it."""
    async with open_store("sqlite:///:memory:") as store:
        services = SessionServices(
            store=store,
            agent=GatedAgent(),
            tools=NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
        )
        async with open_supervisor("sessions", escalate=False) as sup:
            registry = Registry(sup, idle_timeout=30.0)
            registry.register("session", lambda key: SessionActor(key, services))
            await registry.ref("session:ann/late").tell(
                Inject(source="notification", content="[BACKGROUND TASK COMPLETED] secret")
            )
            await trio.testing.wait_all_tasks_blocked()
            assert list(sup.crash_reports) == []
            with pytest.raises(NotFound, match=r"^no session with id 'late'$"):
                await registry.ref("session:ann/late").ask(GetStatus())
            await trio.testing.wait_all_tasks_blocked()
            await store.create_session("ann/late", "ann")
            status = await registry.ref("session:ann/late").ask(GetStatus())
            assert (status.session_id, status.queued) == ("ann/late", 0)
            assert await store.read_events("ann/late") == []
            assert list(sup.crash_reports) == []


def test_the_actor_module_still_exports_the_names_others_import_from_it():
    """``actors/sessions/actor.py`` was split into modules; the names other modules import from
    it stay importable there and are the very objects their new modules define."""
    from turnstile.actors.sessions import actor, events, history, messages, services

    moved = {
        messages: ["POLICIES", "Submit", "Attach", "Detach", "StopTurn", "SetPolicy", "Inject"],
        services: ["SessionServices", "SessionLimits", "ToolCaller", "ShapedTurn", "TurnShaper"],
        history: ["history_from_events", "load_history"],
        events: ["MAX_UNSTORED_EVENTS"],
    }
    for module, names in moved.items():
        for name in names:
            assert name in actor.__all__
            assert getattr(actor, name) is getattr(module, name)
    for name in ("GetStatus", "SessionStatus", "Wake", "Delivered", "Publish", "DeleteSession"):
        assert getattr(actor, name) is getattr(messages, name)


async def test_an_input_announced_after_its_turn_started_is_not_said_queued(session):
    """With several nodes the runner asks the store until it has nothing, so it can claim a
    fired input before the scheduler's ``Delivered`` (or another node's ``Arrived``) reaches
    the session: the announcement then adds its events but no ``turn_queued`` after the
    turn's ``stream_start``, and the queue count stays right."""
    ref, store, agent, _, seen = session
    item = await store.enqueue_input("s", "cron", {"content": "wait:nightly"})
    await ref.tell(Wake())
    await seen.until(b'"stream_start"')
    fired = JobUpdate(
        job_id="j",
        kind="cron",
        event="fired",
        state="active",
        label="nightly",
        next_fire_at=None,
        run_count=1,
    )
    await ref.tell(Delivered(input_id=item.id, source="cron", job_update=fired))
    await ref.tell(Arrived(input_id=item.id, source="cron"))
    status = await ref.ask(GetStatus())
    assert status.queued == 0
    agent.gate("wait:nightly").set()
    await seen.until(b'"stream_end"')
    types = [e.type for e in await store.read_events("s")]
    assert "turn_queued" not in types and "job_update" in types
