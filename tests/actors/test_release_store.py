"""A store written by the release before issue 22 (f7b1e2e) opens and runs on with this code,
with no migration beyond what ``open_node`` runs (issue 22: "``turnstile serve`` on a store
written by the current release keeps every session, job and delivery"; "stored payloads keep
their keys").

The store is ``tests/fixtures/release-f7b1e2e.sqlite``, built by
``tests/fixtures/make_release_store.py`` through that release's public API (its docstring says
what it holds and how it was run). A node opens a copy of it with its wall clock at 12:02, a
minute after the old node stopped; everything is read back through the public API (the
gateway's routes over an ASGI transport, the directory, the store); then the clock moves on to
12:45, past every job's first fire, and each job, the input left queued and the recorded
delivery must run exactly one turn, their runs settled.

The clock: trio's MockClock. The store is a file (the fixture), so SQLite works in real
threads, and a clock that jumps whenever the trio thread waits for one (``autojump_threshold =
0``) jumps while the store works: to the test's own deadline while the node starts, or through
the timeouts bounding a delivery (5 s) or a turn's close. So the clock stands still while the
node starts, the fixture is read back and the node runs what it owes from its start (the queued
input, the recorded delivery); only then does it run, jumping to the next deadline once the node
has been idle for ``IDLE_JUMP`` of real time.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections import Counter
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from tests.support.github import GITHUB_SECRET
from tests.support.polling import eventually
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import open_node
from turnstile.actors.webhooks.settings import GitHubConfig, WebhooksConfig
from turnstile.runtime.clock import MockWallClock

FIXTURE = Path(__file__).parents[1] / "fixtures" / "release-f7b1e2e.sqlite"
#: The old node wrote from 12:00 to 12:01:06; the new one opens a minute later.
OPENED = datetime(2026, 11, 21, 12, 2, tzinfo=UTC)
#: Past every job's first fire (the check's, 12:40:01), before the cron's and heartbeat's second.
LATER = datetime(2026, 11, 21, 12, 45, tzinfo=UTC)
ADA, BOB = "ada-token-0123456789", "bob-token-0123456789"
TOKENS = {ADA: "ada", BOB: "bob"}
DELIVERY = "github:recorded-before-the-upgrade"
#: The queued input the old node left (its job fired while "hold" ran), the fixture's last.
QUEUED = 4
#: The jobs the fixture holds: (session, kind, state, next fire) when the new node opens.
JOBS = {
    "6365bccd7ca2": ("ada/notes", "once", "active", "2026-11-21T12:20:00.500000Z"),
    "d1c0cbd8cf3b": ("ada/notes", "cron", "active", "2026-11-21T12:30:00Z"),
    "rc_3c8c1b036863": ("ada/notes", "recall", "active", "2026-11-21T12:25:01Z"),
    "103fbb0ab412": ("bob/ops", "heartbeat", "active", "2026-11-21T12:30:01Z"),
    "3b703ee2f74d": ("bob/ops", "check", "active", "2026-11-21T12:40:01Z"),
    # fired at 12:01:01 while "hold" ran: its run ``queued``, its input (QUEUED) waiting
    "3da338256f49": ("ada/busy", "once", "completed", None),
}
#: After 12:45: each job fired once, and where it stands.
JOBS_LATER = {
    "6365bccd7ca2": ("completed", None),
    "d1c0cbd8cf3b": ("active", "2026-11-21T13:00:00Z"),
    "rc_3c8c1b036863": ("completed", None),
    "103fbb0ab412": ("active", "2026-11-21T13:00:01Z"),
    "3b703ee2f74d": ("completed", None),
    "3da338256f49": ("completed", None),
}
#: The turns the new node owes: (session, source, content), each exactly once.
OWED = [
    ("ada/busy", "schedule", "Tidy up."),
    ("ada/notes", "cron", "Post the half-hourly report."),
    (
        "ada/notes",
        "recall",
        "[RECALL] recall_id=rc_3c8c1b036863 call_type=once note=check the build",
    ),
    ("ada/notes", "schedule", "Summarise the notes."),
    ("bob/ci", "webhook", "[CI FAILED] recorded before the upgrade"),
    (
        "bob/ops",
        "check",
        "[SCHEDULED CHECK] id=3b703ee2f74d requested_at=2026-11-21T12:00:01Z\nCheck the deploy.",
    ),
    ("bob/ops", "heartbeat", "[HEARTBEAT] job_id=103fbb0ab412\nRun your heartbeat checklist."),
]
KEYS = ("ada/notes", "ada/busy", "bob/ops", "bob/ci")


@pytest.fixture
def manual_clock() -> trio.testing.MockClock:
    """Still until the test starts it (``IDLE_JUMP``); see the module docstring."""
    return trio.testing.MockClock()


#: Once the clock runs: it jumps to the next deadline when the node has been idle this long
#: (real seconds).
IDLE_JUMP = 0.02


class Answering:
    """Answers every turn at once, and keeps (session, source, content) of each."""

    name = "answering"

    def __init__(self) -> None:
        self.turns: list[tuple[str, str, str]] = []

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn) -> str:
        self.turns.append((turn.session_id, turn.input.source, turn.input.content))
        return f"done: {turn.input.source}"


def stored() -> tuple[dict[str, Any], dict[int, tuple[str, dict[str, Any]]]]:
    """The fixture's rows as the old release wrote them: job specs by id, inbox (source,
    payload) by id."""
    with closing(sqlite3.connect(FIXTURE)) as db:
        specs = {i: json.loads(s) for i, s in db.execute("SELECT id, spec FROM jobs")}
        inbox = db.execute("SELECT id, source, payload FROM inbox")
        inputs = {i: (source, json.loads(payload)) for i, source, payload in inbox}
    return specs, inputs


def token_of(key: str) -> str:
    return ADA if key.startswith("ada/") else BOB


async def get(http: httpx.AsyncClient, token: str, url: str) -> Any:
    answer = await http.get(url, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, (url, answer.text)
    return answer.json()


@pytest.mark.guard(7200)
async def test_a_store_written_by_the_release_before_keeps_everything_and_runs_on(
    tmp_path, manual_clock
):
    path = tmp_path / "node.db"
    shutil.copyfile(FIXTURE, path)
    specs, inputs = stored()
    config = Config(
        store=f"sqlite:///{path}",
        webhooks=WebhooksConfig(github=GitHubConfig(secret=GITHUB_SECRET)),
        # one node: its heartbeat and sweep every 200 s, not every 5 s (the default 15 s
        # lease), so the clock's 43 minutes are some hundred jumps, not a thousand, each after
        # IDLE_JUMP of real time
        node=NodeConfig(lease_seconds=600),
    )
    agent = Answering()
    clock = MockWallClock(OPENED)
    async with open_node(config, tokens=TOKENS, agent=agent, clock=clock, serve=False) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            # ---- every session, history, job, recall, heartbeat, binding and delivery ----
            sessions = {
                user: {s["id"]: s for s in (await get(http, token, "/sessions"))["sessions"]}
                for token, user in TOKENS.items()
            }
            assert {user: sorted(s) for user, s in sessions.items()} == {
                "ada": ["busy", "notes"],
                "bob": ["ci", "ops"],
            }
            notes = sessions["ada"]["notes"]
            assert (notes["last_seq"], notes["has_recall"], notes["recall_trigger_at"]) == (
                14,
                True,
                "2026-11-21T12:25:01Z",
            )
            history = (await get(http, ADA, "/sessions/notes/history"))["history"]
            assert [(h["role"], h["content"][:24]) for h in history] == [
                ("user", "hello"),
                ("assistant", "answer to user: hello"),
                ("user", "remind me"),
                ("tool", '{"job_id":"6365bccd7ca2"'),
                ("assistant", "Scheduled 6365bccd7ca2."),
            ]
            call = history[3]
            assert (call["tool"], call["call_id"], call["arguments"]) == (
                "schedule_once",
                "call-remind-1",
                {"when": "in 20m", "action_type": "llm_prompt", "prompt": "Summarise the notes."},
            )

            jobs = {}
            for token, user in TOKENS.items():
                for job in (await get(http, token, "/jobs"))["jobs"]:
                    jobs[job["id"]] = (f"{user}/{job['session_id']}", job)
            assert {
                job_id: (key, job["kind"], job["state"], job["next_fire_at"])
                for job_id, (key, job) in jobs.items()
            } == JOBS
            # every spec as the old release stored it: each key, each value
            assert {job_id: job["spec"] for job_id, (_, job) in jobs.items()} == specs

            recall = (await get(http, ADA, "/sessions/notes/recall"))["recall"]
            assert {
                k: recall[k]
                for k in ("recall_id", "call_type", "status", "trigger_at", "internal_comment")
            } == {
                "recall_id": "rc_3c8c1b036863",
                "call_type": "once",
                "status": "pending",
                "trigger_at": "2026-11-21T12:25:01Z",
                "internal_comment": "check the build",
            }
            heartbeat = await get(http, BOB, "/sessions/ops/heartbeat")
            assert heartbeat["runs"] == []
            fields = ("heartbeat_id", "enabled", "interval_minutes", "checklist", "session")
            assert {k: heartbeat["heartbeat"][k] for k in (*fields, "next_run_at")} == {
                "heartbeat_id": "103fbb0ab412",
                "enabled": True,
                "interval_minutes": 30,
                "checklist": "Look at the queue.",
                "session": "main",
                "next_run_at": "2026-11-21T12:30:01Z",
            }
            bindings = (await get(http, BOB, "/sessions/ci/bindings"))["bindings"]
            assert [(b["source"], b["via"]) for b in bindings] == [("github:acme/app#3", "http")]
            (delivery,) = (await get(http, BOB, "/webhooks/deliveries"))["deliveries"]
            assert (delivery["delivery_id"], delivery["event"], delivery["state"]) == (
                DELIVERY,
                "check_run",
                "routed",
            )
            # the delivery and the queued input run from the node's start, the clock still
            while not await settled(node, ("ada/busy", "bob/ci"), 2):
                await trio.testing.wait_all_tasks_blocked(0.01)
            assert clock.now() == OPENED

            # ---- the clock moves on past every job's first fire ----
            manual_clock.autojump_threshold = IDLE_JUMP
            await trio.sleep((LATER - clock.now()).total_seconds())
            await eventually(lambda: settled(node, KEYS, len(OWED)), seconds=600, every=1)

            assert sorted(agent.turns) == OWED  # each once; "hold" (interrupted) not again
            ran: dict[int, str] = {}  # the inputs the new node ran -> their session
            kept: dict[int, tuple[str, dict[str, Any]]] = {}
            for key in KEYS:
                items = await node.store.list_inputs(key)
                kept.update((i.id, (i.source, i.payload)) for i in items if i.id in inputs)
                for item in items:
                    interrupted = item.payload.get("content") == "hold"
                    assert item.state == ("interrupted" if interrupted else "done"), item
                    if item.id == QUEUED or item.id not in inputs:
                        ran[item.id] = key
                # one stream_start and one stream_end for each input, old and new
                events = await node.store.read_events(key, 0, 1000)
                for kind in ("stream_start", "stream_end"):
                    per_input = Counter(e.payload["input_id"] for e in events if e.type == kind)
                    assert per_input == {i.id: 1 for i in items}, (key, kind, per_input)
            # the old inputs are all there, with the payloads the old release stored
            assert kept == inputs
            assert len(ran) == len(OWED)

            # each job fired once, into one of those inputs, its run settled
            for job_id, (state, next_fire) in JOBS_LATER.items():
                key = JOBS[job_id][0]
                detail = await get(http, token_of(key), f"/jobs/{job_id}")
                job, runs = detail["job"], detail["runs"]
                assert (job["state"], job["next_fire_at"], job["run_count"]) == (
                    state,
                    next_fire,
                    1,
                )
                (run,) = runs
                assert run["state"] == "turn_completed", run
                fired_for = specs[job_id]["schedule"].get("run_at", JOBS[job_id][3])
                assert run["scheduled_for"].replace(".000000Z", "Z") == fired_for, run
                assert ran.pop(run["input_id"]) == key
            heartbeat = await get(http, BOB, "/sessions/ops/heartbeat")
            assert [r["state"] for r in heartbeat["runs"]] == ["turn_completed"]
            assert (await get(http, ADA, "/sessions/notes/recall"))["recall"] is None

            # the recorded delivery: delivered once, into the one input left
            ((input_id, key),) = ran.items()
            assert key == "bob/ci"
            (delivery,) = (await get(http, BOB, "/webhooks/deliveries"))["deliveries"]
            (target,) = delivery["targets"]
            assert (target["session"], target["state"], target["input_id"], target["attempts"]) == (
                "ci",
                "delivered",
                input_id,
                1,
            )


async def settled(node, keys: tuple[str, ...], turns: int) -> bool:
    """Whether ``turns`` turns owed in ``keys`` ran and closed: as many inputs run by the new
    node (the one left queued and the new ones), none queued or running, each with its
    ``stream_end`` stored (a turn's last events are stored a moment after it ends)."""
    count = 0
    for key in keys:
        items = await node.store.list_inputs(key)
        if any(i.state in ("queued", "running") for i in items):
            return False
        events = await node.store.read_events(key, 0, 1000)
        if sum(1 for e in events if e.type == "stream_end") < len(items):
            return False
        count += sum(1 for i in items if i.id >= QUEUED)
    return count >= turns
