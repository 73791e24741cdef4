"""The start order a node derives from its features' ``needs`` and ``after``
(``actors.feature.start_order``), the phases ``open_node`` drives them through, and the actors
that are spawned held in ``start`` and begin in ``open`` (issue 22: a node starts whole)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta

import msgspec
import pytest
import trio
import trio.testing

from tests.support.mock_node import DAY, LIMITS, node, once
from tests.support.polling import eventually
from tests.support.watchers import watching
from turnstile.actors.config import Config
from turnstile.actors.feature import (
    FeatureCycle,
    FeatureOrderError,
    MissingFeature,
    NodeContext,
    start_order,
)
from turnstile.actors.node import default_features, open_node
from turnstile.actors.scheduling.actor import AddJob, Begin, SchedulerActor
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.actors.watchers.actor import BeginChecks
from turnstile.runtime.store import open_store


@dataclass
class F:
    """A feature as ``start_order`` sees it: a name and its declarations."""

    name: str
    needs: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


def names(features) -> list[str]:
    return [f.name for f in features]


# -- the order ---------------------------------------------------------------------------------

DEFAULT_ORDER = [
    "sessions",
    "notifications",
    "scheduling",
    "execution",
    "watchers",
    "memory",
    "webhooks",
    "console",
    "mcp",
]


def test_the_default_features_start_sessions_first_and_notifications_before_their_users():
    features = default_features(ScriptedAgent(token_delay=0))
    assert names(start_order(features)) == DEFAULT_ORDER
    # given the other way round: only what the declarations require moves
    assert names(start_order(features[::-1])) == [
        "console",
        "sessions",
        "mcp",
        "webhooks",
        "memory",
        "execution",
        "notifications",
        "watchers",
        "scheduling",
    ]


def test_any_order_given_satisfies_every_need_and_after_and_the_same_order_gives_the_same():
    features = default_features(ScriptedAgent(token_delay=0))
    shuffle = random.Random(22)
    for _ in range(50):
        given = shuffle.sample(features, len(features))
        order = names(start_order(given))
        assert sorted(order) == sorted(DEFAULT_ORDER)
        for feature in given:
            for first in (*feature.needs, *feature.after):
                assert order.index(first) < order.index(feature.name), (order, feature.name)
        assert names(start_order(given)) == order  # deterministic


def test_ties_keep_the_order_given_and_an_order_that_fits_is_kept():
    given = [F("c"), F("a"), F("b", needs=("a",)), F("d")]
    assert names(start_order(given)) == ["c", "a", "b", "d"]
    assert names(start_order([F("b", needs=("a",)), F("d"), F("a")])) == ["d", "a", "b"]


def test_after_orders_only_the_features_that_are_there():
    given = [F("scheduling", after=("notifications",)), F("notifications")]
    assert names(start_order(given)) == ["notifications", "scheduling"]
    assert names(start_order([F("scheduling", after=("notifications",))])) == ["scheduling"]


def test_a_missing_need_is_refused_naming_both():
    with pytest.raises(MissingFeature) as raised:
        start_order([F("notifications"), F("scheduling", needs=("sessions",))])
    assert (
        str(raised.value)
        == "feature 'scheduling' needs feature 'sessions', which is not on the node"
    )
    assert (raised.value.needed, raised.value.by) == ("sessions", "scheduling")
    assert isinstance(raised.value, LookupError) and isinstance(raised.value, ValueError)


def test_what_the_caller_requires_is_refused_when_missing():
    with pytest.raises(MissingFeature, match="^the node needs feature 'sessions', which is not"):
        start_order([F("console")], required=("sessions",))


def test_a_cycle_is_refused_naming_it():
    given = [F("d"), F("a", needs=("b",)), F("b", after=("c",)), F("c", needs=("a",))]
    with pytest.raises(FeatureCycle) as raised:
        start_order(given)
    assert str(raised.value) == (
        "features cannot be started in any order: a -> b -> c -> a"
        " (each needs or comes after the next)"
    )
    assert raised.value.cycle == ("a", "b", "c", "a")
    with pytest.raises(FeatureCycle, match=r": x -> x \("):
        start_order([F("x", after=("x",))])


def test_a_cycle_behind_a_feature_that_waits_on_it_is_the_one_named():
    given = [F("e", needs=("a",)), F("a", needs=("b",)), F("b", needs=("a",))]
    with pytest.raises(FeatureCycle) as raised:
        start_order(given)
    assert raised.value.cycle == ("a", "b", "a")


def test_two_features_of_one_name_and_a_declaration_that_is_not_a_tuple_are_refused():
    with pytest.raises(FeatureOrderError, match="^two features are named 'a'$"):
        start_order([F("a"), F("a")])
    with pytest.raises(FeatureOrderError, match="^feature 'a': needs must be a tuple of feature"):
        start_order([F("a", needs="sessions")])  # type: ignore[arg-type]


def test_a_feature_without_declarations_needs_nothing():
    class Plain:
        name = "plain"

    assert names(start_order([Plain(), F("sessions")])) == ["plain", "sessions"]


# -- the node ----------------------------------------------------------------------------------


async def test_the_node_refuses_a_missing_feature_and_a_cycle_before_opening_anything(tmp_path):
    agent = ScriptedAgent(token_delay=0)
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    without = [f for f in default_features(agent) if f.name != "sessions"]
    with pytest.raises(MissingFeature, match="^feature 'notifications' needs feature 'sessions'"):
        async with open_node(config, agent=agent, features=without, serve=False):
            pass
    looped = [*default_features(agent), F("x", needs=("y",)), F("y", needs=("x",))]
    with pytest.raises(FeatureCycle, match=r": x -> y -> x \("):
        async with open_node(config, agent=agent, features=looped, serve=False):
            pass
    assert not (tmp_path / "node.db").exists()


@dataclass
class Probe:
    """A feature that writes down the phases it is driven through, and what it sees then."""

    name: str
    log: list[tuple[str, str]]
    needs: tuple[str, ...] = ("sessions",)
    after: tuple[str, ...] = ()
    seen: dict[str, object] = field(default_factory=dict)

    async def start(self, node: NodeContext) -> None:
        self.log.append(("start", self.name))
        try:
            node.sessions.ref("session:ada/s")
        except LookupError:  # no actor kind 'session' registered
            self.seen["session kind at start"] = False
        else:
            self.seen["session kind at start"] = True
        self.seen["cut-off input at start"] = await self._cut(node)

    async def ready(self, node: NodeContext) -> None:
        self.log.append(("ready", self.name))
        self.seen["cut-off input at ready"] = await self._cut(node)

    async def open(self, node: NodeContext) -> None:
        self.log.append(("open", self.name))
        self.seen["cut-off input at open"] = await self._cut(node)
        self.seen["started at open"] = node.started.is_set()

    def routes(self, node: NodeContext) -> list:
        return []

    async def _cut(self, node: NodeContext) -> str:
        (item,) = [i for i in await node.store.list_inputs("ada/s") if i.payload["content"] == "x"]
        return item.state


async def test_every_start_then_every_ready_then_recovery_then_every_open(tmp_path):
    agent = ScriptedAgent(token_delay=0)
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    async with open_node(config, agent=agent, serve=False) as node:
        await node.directory.create_session("ada", session_id="s")
    async with open_store(config.store) as store:  # the node died in the middle of a turn
        await store.enqueue_input("ada/s", "user", {"content": "x"})
        assert (await store.claim_next_input("ada/s")).payload["content"] == "x"
    log: list[tuple[str, str]] = []
    late = Probe("late", log, needs=("early",), after=("webhooks",))
    early = Probe("early", log)
    features = [late, *default_features(agent), early]
    async with open_node(config, agent=agent, features=features, serve=False) as node:
        assert node.context.started.is_set()
        # children stop newest first: the features' actors in the reverse of the start order
        # (the watcher first), every session last
        assert node.context.supervisor.children == [
            "sessions",
            "scheduler",
            "background",
            "watchers",
        ]
    order = [name for phase, name in log if phase == "start"]
    assert order == ["early", "late"]
    assert log == [("start", "early"), ("start", "late")] + [
        (phase, name) for phase in ("ready", "open") for name in order
    ]
    for probe in (early, late):
        assert probe.seen == {
            "session kind at start": False,  # sessions register it in their ``ready``
            "cut-off input at start": "running",
            "cut-off input at ready": "running",
            "cut-off input at open": "interrupted",  # recovery: after ready, before open
            "started at open": False,
        }


# -- actors spawned held -----------------------------------------------------------------------


@pytest.mark.guard(DAY)
async def test_a_held_scheduler_fires_nothing_until_it_begins(autojump_clock):
    async with node(start_scheduler=False) as n:
        an_hour_ago = n.clock.now() - timedelta(hours=1)
        spec = AddJob(
            session_id="s", kind="once", schedule=once(an_hour_ago), deliver={"prompt": "late"}
        ).spec()
        overdue = await JobStore(n.store).create_job(
            "overdue",
            kind="once",
            spec=msgspec.to_builtins(spec),
            session_id="s",
            next_fire_at=an_hour_ago,
        )
        scheduler = await n.sup.spawn(
            lambda: SchedulerActor(n.store, n.clock, publish=n.publish, limits=LIMITS, held=True),
            name="scheduler",
        )
        soon = await scheduler.ask(
            AddJob(
                session_id="s",
                kind="once",
                schedule=once(n.clock.now() + timedelta(minutes=5)),
                deliver={"prompt": "added while held"},
            )
        )
        await trio.sleep(3600)  # both due meanwhile: held, nothing fires
        assert await JobStore(n.store).list_runs(overdue.id) == []
        assert await JobStore(n.store).list_runs(soon.id) == []
        assert await n.store.list_inputs("s") == []
        assert await scheduler.ask(Begin()) is None
        await scheduler.ask(Begin())  # a second changes nothing
        await trio.sleep(60)
        assert [len(await JobStore(n.store).list_runs(j)) for j in (overdue.id, soon.id)] == [1, 1]
        await trio.testing.wait_all_tasks_blocked()
        assert len(n.ends()) == 2  # each ran its turn once


@pytest.mark.guard(DAY)
async def test_a_held_watcher_actor_checks_nothing_until_it_begins(autojump_clock):
    async with watching(held=True) as w:
        await w.start(interval=10)  # a new watcher checks at once, once begun
        await trio.sleep(5)
        assert w.probe.calls == []
        await w.ref.ask(BeginChecks())
        await w.ref.ask(BeginChecks())  # a second changes nothing
        await trio.sleep(16)  # the first check now, then on its grid
        assert w.probe.calls == [5.0, 10.0, 20.0]


async def test_actors_restarted_after_a_crash_once_the_node_is_open_begin_at_once(tmp_path):
    """A held actor's supervisor restarts it from the same factory: once the node is open, the
    new incarnation fires and checks from its start (no one would tell it to begin)."""
    agent = ScriptedAgent(token_delay=0)
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    async with open_node(config, agent=agent, serve=False) as node:
        await node.directory.create_session("ada", session_id="s")
        scheduler = node.features["scheduling"].scheduler
        watchers = node.features["watchers"].watchers
        for actor in (scheduler, watchers):
            await actor.tell("not a message")  # crashes it: its supervisor starts another
        in_an_hour = node.context.clock.now() + timedelta(hours=1)
        await scheduler.ask(
            AddJob(
                session_id="ada/s",
                kind="once",
                schedule=once(in_an_hour),
                deliver={"prompt": "now", "action_type": "llm_prompt"},
                immediate=True,
            )
        )
        started = await node.tools.call(
            "ada/s", "ada", "watch_start", {"tool": "clock.now", "interval": 3600}
        )
        crashed = [report.actor for report in node.context.supervisor.crash_reports]
        assert sorted(crashed) == ["scheduler", "watchers"]

        async def fired() -> bool:
            events = await node.store.read_events("ada/s", 0, 1000)
            return any(e.type == "stream_end" and e.payload.get("status") for e in events)

        async def checked() -> bool:
            status = await node.tools.call(
                "ada/s", "ada", "watch_status", {"watcher_id": started.data["watcher_id"]}
            )
            return status.data["check_count"] >= 1

        await eventually(fired)  # (eventually's hang guard: a loaded box takes seconds)
        await eventually(checked)
