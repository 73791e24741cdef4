"""A node starts whole (issue 22): what fell due while the node was down runs once after the
restart, because nothing fires, delivers or recovers before every feature is ready.

The defect this pins: a job due while the node was down was fired by the scheduler as soon as
the scheduling feature started, before the sessions feature had registered the ``session``
actor kind: the fire committed (run ``queued``, job ``completed``), telling the session failed
(``LookupError: no actor kind 'session' registered``), and nothing ever woke the session, so
its turn never ran.

For every kind of input that can fall due while a node is down, one node (a store of its own,
SQLite and PostgreSQL) is opened, the input is set up through the tools a session calls, the
node is closed, and another node is opened on the same store with its wall clock 15.5 minutes
later (``MockWallClock`` on trio's real clock: the restart is a real one, the downtime is not
waited for). Each kind must then run exactly the turns its policy promises, each exactly once:
one input, one ``stream_start`` and one ``stream_end`` for it in the session's events, and its
run record settled. With two nodes on PostgreSQL, both stop and only the one that did not hold
the session comes back: it runs everything once.

Nothing here is an event of the test's own: the restarted node runs the turns on its own, so
the test looks at the store (``eventually``) with a deadline shorter than any sweep interval
(leases of 600 s: the catch-up that would hide the defect on PostgreSQL runs every 200 s).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
import trio

from tests.support.github import GITHUB_SECRET
from tests.support.polling import eventually
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.feature import NodeContext
from turnstile.actors.node import default_features, open_node
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.actors.webhooks.queries import RECORD
from turnstile.actors.webhooks.settings import GitHubConfig, RepoConfig, WebhooksConfig
from turnstile.runtime.clock import MockWallClock

#: The first node's wall time: cron ``*/5`` occurrences fall at 12:05, 12:10, 12:15.
T0 = datetime(2026, 11, 21, 12, 0, 30, tzinfo=UTC)
#: How much later the restarted node's wall clock is: every input below is due by then, the
#: heartbeat (due at 12:15:30) within its 60 s grace, the rest more than a minute late.
DOWN = timedelta(minutes=15, seconds=30)
#: How long a restarted node may take to run what was due (real time; on the old code the turns
#: never ran): a hang guard, generous for a 2-core box at load 8, not a promise.
DEADLINE = 60
#: How long the restarted node's ``Hang`` feature takes to start.
SLOW_START = 0.5
OWNER = "ada"
PR3 = "github:acme/app#3"


class NoArgs(msgspec.Struct, forbid_unknown_fields=True):
    pass


class Hang:
    """A feature with one tool, ``test.hang``, that never ends (a background task that is
    still running when its node stops), and a slow start.

    Given ``watch`` (a session key), its ``start`` takes up to ``SLOW_START`` seconds, as a
    feature that probes an embedder or creates indexes may, and keeps what was put in that
    session's inbox meanwhile (``early``): nothing may be, since the node is not ready. (Before
    issue 22 the scheduler fired overdue jobs there, so the slow start also makes the old
    defect certain instead of a race with the other features' starts.)
    """

    name = "hang"
    needs: tuple[str, ...] = ("execution",)
    after: tuple[str, ...] = ()

    def __init__(self, watch: str | None = None) -> None:
        self.running = trio.Event()
        self.watch = watch
        self.early: list[Any] = []

    async def start(self, node: NodeContext) -> None:
        async def hang(call, args: NoArgs):
            self.running.set()
            await trio.sleep_forever()

        node.tools.register("test.hang", NoArgs, hang, "Never ends.")
        if self.watch is not None:
            watch = self.watch
            with trio.move_on_after(SLOW_START):
                while not self.early:
                    self.early = await node.store.list_inputs(watch)
                    await trio.sleep(0.01)

    def routes(self, node: NodeContext) -> list:
        return []


@dataclass
class Due:
    """What a restart owes the session once the input a kind set up fell due.

    Attributes:
        turns: turns that must run in the session, each once.
        job_id: the job whose runs must settle (None: not a job).
        runs: the job's run records by state once settled.
    """

    turns: int
    job_id: str | None = None
    runs: dict[str, int] = field(default_factory=dict)


async def call(node, key: str, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await node.tools.call(key, OWNER, tool, arguments)
    assert result.ok, result.error
    return result.data


async def once(node, key: str, hang: Hang) -> Due:
    job = await call(
        node, key, "schedule_once", when="in 5m", action_type="llm_prompt", prompt="ship it"
    )
    return Due(turns=1, job_id=job["job_id"], runs={"turn_completed": 1})


def cron(policy: str, turns: int, runs: dict[str, int]):
    async def setup(node, key: str, hang: Hang) -> Due:
        job = await call(
            node,
            key,
            "schedule_cron",
            cron="*/5 * * * *",
            action_type="llm_prompt",
            prompt="report",
            misfire=policy,
        )
        return Due(turns=turns, job_id=job["job_id"], runs=runs)

    return setup


async def recall(node, key: str, hang: Hang) -> Due:
    made = await call(
        node,
        key,
        "schedule_recall",
        call_type="once",
        when="in 5m",
        additional_context_message="Read the build log and report errors.",
        internal_comment="check the build",
    )
    (job,) = await JobStore(node.store).list_jobs(session_id=key, states=["active"])
    assert made  # the recall's own view; its job is the session's one job
    return Due(turns=1, job_id=job.id, runs={"turn_completed": 1})


async def heartbeat(node, key: str, hang: Hang) -> Due:
    """``suppress_threshold=0``: its answer is forwarded (a short one is only logged, with a
    ``heartbeat_suppressed`` instead of the turn's events)."""
    made = await call(
        node,
        key,
        "set_heartbeat",
        enabled=True,
        interval_minutes=15,
        session="main",
        suppress_threshold=0,
    )
    return Due(turns=1, job_id=made["heartbeat_id"], runs={"turn_completed": 1})


async def late_heartbeat(node, key: str, hang: Hang) -> Due:
    """A heartbeat of every 15 minutes is due twice by the restart if it was set 15 minutes
    earlier: ``misfire = "skip"``, a late heartbeat is simply the next one; none runs."""
    made = await call(node, key, "set_heartbeat", enabled=True, interval_minutes=15, session="main")
    job = await JobStore(node.store).get_job(made["heartbeat_id"])
    await JobStore(node.store).update_job(
        job.id, next_fire_at=job.next_fire_at - timedelta(minutes=15)
    )
    return Due(turns=0, job_id=job.id, runs={"missed": 2})


async def check(node, key: str, hang: Hang) -> Due:
    made = await call(node, key, "schedule_check", delay_minutes=5, instructions="Check CI.")
    (job,) = await JobStore(node.store).list_jobs(session_id=key, states=["active"])
    assert made
    return Due(turns=1, job_id=job.id, runs={"turn_completed": 1})


async def webhook(node, key: str, hang: Hang) -> Due:
    """A delivery recorded (acknowledged to GitHub) whose inbox row the crash took."""
    await call(node, key, "bind_source", source=PR3)
    targets = await node.store.run(
        RECORD,
        delivery={
            "id": "github:recorded",
            "hook": "github",
            "event": "check_run",
            "source_ref": "Acme/App#check_run:1",
            "source_keys": [PR3],
            "owner": None,
            "content": "[CI FAILED] recorded before the node stopped",
            "payload": {"type": "check_run_failed", "name": "tests"},
        },
        lookup=[PR3],
        owners=None,
        fallback=[],
        now=node.store.db_time(node.context.clock.now()),
    )
    assert targets == [(key, OWNER)]
    return Due(turns=1)


async def background(node, key: str, hang: Hang) -> Due:
    """A background task still running when its node stops: it ends as ``lost``, and its
    session is told once, which starts a turn."""
    await call(node, key, "background_run", name="test.hang")
    await hang.running.wait()
    return Due(turns=1)


KINDS: dict[str, Callable[..., Awaitable[Due]]] = {
    "once": once,
    "cron coalesce": cron("coalesce", 1, {"turn_completed": 1, "coalesced": 2}),
    "cron skip": cron("skip", 0, {"missed": 3}),
    "cron catch_up": cron("catch_up", 3, {"turn_completed": 3}),
    "recall": recall,
    "heartbeat": heartbeat,
    "heartbeat past its grace": late_heartbeat,
    "scheduled check": check,
    "webhook delivery": webhook,
    "background task": background,
}


def node_config(url: str, node_id: str | None = None) -> Config:
    return Config(
        store=url,
        webhooks=WebhooksConfig(
            github=GitHubConfig(secret=GITHUB_SECRET, repos={"acme/app": RepoConfig(user=OWNER)})
        ),
        node=NodeConfig(id=node_id, lease_seconds=600),
    )


@asynccontextmanager
async def a_node(config: Config, at: datetime, hang: Hang):
    agent = ScriptedAgent(token_delay=0)
    # (the code before issue 22 started them in this order, and wanted sessions last)
    *others, last = default_features(agent)
    features = [*others, hang, last]
    clock = MockWallClock(at)  # wall time from ``at``, on trio's real clock
    async with open_node(config, agent=agent, clock=clock, features=features, serve=False) as node:
        yield node


async def owed(node, key: str, due: Due) -> bool:
    """Whether everything ``due`` says has happened (nothing more can: checked after)."""
    items = await node.store.list_inputs(key)
    if len(items) < due.turns or any(i.state in ("queued", "running") for i in items):
        return False
    if due.job_id is not None:
        runs = await JobStore(node.store).list_runs(due.job_id)
        if sum(due.runs.values()) > len(runs) or any(r.state == "queued" for r in runs):
            return False
    events = await node.store.read_events(key, 0, 1000)
    ends = [e for e in events if e.type == "stream_end"]
    return len(ends) >= due.turns  # a turn's last events are stored a moment after it ends


async def assert_ran_once(node, key: str, due: Due) -> None:
    """Each input of the session ran one turn, and they are the turns ``due`` promised."""
    items = await node.store.list_inputs(key)
    assert [i.state for i in items] == ["done"] * due.turns, items
    events = await node.store.read_events(key, 0, 1000)
    for kind in ("stream_start", "stream_end"):
        per_input = Counter(e.payload["input_id"] for e in events if e.type == kind)
        assert per_input == {i.id: 1 for i in items}, (kind, per_input)
    if due.job_id is not None:
        runs = await JobStore(node.store).list_runs(due.job_id)
        assert Counter(r.state for r in runs) == due.runs
        delivered = sorted(r.input_id for r in runs if r.state == "turn_completed")
        assert delivered == sorted(i.id for i in items)


def no_tell_failed(caplog: pytest.LogCaptureFixture) -> None:
    told = [r.getMessage() for r in caplog.records if r.name == "turnstile.scheduler"]
    assert not [m for m in told if m.startswith("could not tell session")], told


@pytest.mark.guard(120)
@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
async def test_what_fell_due_while_the_node_was_down_runs_once_after_the_restart(
    kind, store_url, caplog
):
    caplog.set_level(logging.WARNING)
    config = node_config(store_url)
    key = f"{OWNER}/s"
    hang = Hang()
    async with a_node(config, T0, hang) as node:
        await node.directory.create_session(OWNER, session_id="s")
        due = await kind(node, key, hang)
        assert await node.store.list_inputs(key) == []  # nothing due yet
    again = Hang(watch=key)
    async with a_node(config, T0 + DOWN, again) as node:
        assert again.early == []  # nothing delivered before every feature was ready
        await eventually(lambda: owed(node, key, due), seconds=DEADLINE)
        await assert_ran_once(node, key, due)
    no_tell_failed(caplog)


@pytest.mark.guard(120)
@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_with_two_nodes_the_one_that_comes_back_runs_it_once(kind, store_url, caplog):
    """``a`` holds the session and set everything up; both stop; only ``b`` comes back."""
    caplog.set_level(logging.WARNING)
    key = f"{OWNER}/s"
    hang = Hang()
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(a_node(node_config(store_url, "a"), T0, hang))
        await stack.enter_async_context(a_node(node_config(store_url, "b"), T0, Hang()))
        await a.directory.create_session(OWNER, session_id="s")
        due = await kind(a, key, hang)
        assert await a.store.list_inputs(key) == []
    again = Hang(watch=key)
    async with a_node(node_config(store_url, "b"), T0 + DOWN, again) as b:
        assert again.early == []
        await eventually(lambda: owed(b, key, due), seconds=DEADLINE)
        await assert_ran_once(b, key, due)
    no_tell_failed(caplog)
