"""The crash scenarios, in order of value (issue 23, "A crash at every commit").

Each drives a real node over HTTP as a client would, and may be driven again from the start
after a crash: it creates its session (409 when a crash kept it), and sends every message with
an idempotency key, so a message the first node acknowledged, or stored without answering, is
one input. The scripted agent runs the turns (``/call <tool> <json>`` calls a tool).

* ``message_tool``: two user messages, the first a turn with a tool call (``clock.now``).
* ``once``: a turn whose tool call schedules a one-off job (``schedule_once``, in 1 s); the
  job fires a turn of its own. A crash before the job's commit loses it with the turn that was
  making it (that turn is closed ``interrupted``, not run again): then there is nothing to fire.
* ``recall``: the same with a one-off recall (``schedule_recall``), the agent's self-reminder.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

import trio

from tests.crash.harness import OWNER, TOKEN, Client, Scenario, ServerGone
from tests.crash.invariants import FINAL, Record
from tests.crash.stores import Snapshot, Target


def _call(tool: str, arguments: dict) -> str:
    return f"/call {tool} {json.dumps(arguments)}"


class MessageWithToolCall(Scenario):
    name = "message_tool"
    points = 21

    async def drive(self, client: Client) -> None:
        await client.create_session("s")
        await client.send("s", _call("clock.now", {}), "m1")
        await client.send("s", "hello", "m2")

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        out = []
        key = f"{OWNER}/s"
        if not any(row["id"] == key for row in snap["sessions"]):
            out.append("the session is gone")
        ends = [
            e["payload"]
            for e in snap["events"]
            if e["session_id"] == key and e["type"] == "stream_end"
        ]
        done = [e for e in ends if e.get("status") == "completed"]
        # the second message, acknowledged, runs after any crash: its turn completes unless a
        # crash cut it (then: interrupted, once)
        if not ends:
            out.append("no turn ended")
        allowed = ("completed", "interrupted") + (("failed",) if self.refused_commits else ())
        if any(e.get("status") not in allowed for e in ends):
            out.append(f"a turn ended otherwise: {[e.get('status') for e in ends]}")
        del done
        return out


class _Fires(Scenario):
    """A turn whose tool call makes a job that fires once, soon; over when nothing waits and
    no job is pending."""

    tool = ""
    arguments: dict = {}

    async def drive(self, client: Client) -> None:
        await client.create_session("s")
        await client.send("s", _call(self.tool, self.arguments), "m1")

    def settled(self, snap: Snapshot) -> bool:
        return _fired(snap)

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        out = []
        for job in snap["jobs"]:
            runs = _fired_runs(snap, job["id"])
            if job["state"] != "completed" or job["run_count"] != 1 or len(runs) != 1:
                out.append(
                    f"job {job['id']} ({job['kind']}) ended {job['state']} with"
                    f" run_count {job['run_count']} and {len(runs)} runs (expected one)"
                )
            for run in runs:
                if run["input_id"] is None:
                    out.append(f"job {job['id']}: run {run['id']} has no input")
        if len(snap["jobs"]) > 1:
            out.append(f"{len(snap['jobs'])} jobs from one tool call")
        return out


class OnceFire(_Fires):
    name = "once"
    points = 21
    tool = "schedule_once"
    arguments = {"when": "in 1s", "prompt": "fired", "action_type": "llm_prompt"}


class RecallFire(_Fires):
    name = "recall"
    points = 22
    tool = "schedule_recall"
    arguments = {"call_type": "once", "when": "in 1s", "additional_context_message": "look again"}


class _DueLater(_Fires):
    """A job made by a setup node for later (a minute, a quarter of an hour), then made due
    in the store: the crash points are those of the node that fires it."""

    has_setup = True

    async def setup(self, client: Client) -> None:
        await _Fires.drive(self, client)

    async def drive(self, client: Client) -> None:
        pass  # the job is there, due: the node fires it as it starts

    async def prepared(self, target: Target) -> None:
        if await target.make_jobs_due() < 1:
            raise AssertionError(f"{self.name}: the setup made no job")


class CheckFire(_DueLater):
    name = "check"
    points = 16
    tool = "schedule_check"
    arguments = {"delay_minutes": 1, "instructions": "is the build green?"}


class CronFire(_DueLater):
    """Once a year, made due: every minute (as it was) fired in the setup node whenever its
    second or so crossed a minute boundary, and the crash run then had no job (1 run of 60)."""

    name = "cron"
    points = 16
    tool = "schedule_cron"
    arguments = {
        "cron": "0 0 1 1 *",
        "max_runs": 1,
        "prompt": "tick",
        "action_type": "llm_prompt",
    }


class HeartbeatFire(_DueLater):
    """``set_heartbeat`` (a dedicated session, the default), made due: its turn answers
    briefly without a tool call, so it is suppressed (done, ``suppressed`` in its detail, a
    ``heartbeat_suppressed`` event, no stream: the invariants check that), unless a crash cut
    it. The job stays active (it recurs every 15 minutes): over once it ran and settled."""

    name = "heartbeat"
    points = 17
    tool = "set_heartbeat"
    arguments = {"enabled": True, "interval_minutes": 15}

    def settled(self, snap: Snapshot) -> bool:
        beats = [row for row in snap["inbox"] if row["source"] == "heartbeat"]
        return Scenario.settled(self, snap) and bool(beats)

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        out = []
        jobs = [job for job in snap["jobs"] if job["kind"] == "heartbeat"]
        if len(jobs) != 1:
            return [f"{len(jobs)} heartbeat jobs (expected one)"]
        job = jobs[0]
        runs = _fired_runs(snap, job["id"])
        beats = [row for row in snap["inbox"] if row["source"] == "heartbeat"]
        if job["state"] != "active" or len(runs) != 1 or job["run_count"] != 1:
            out.append(
                f"heartbeat {job['id']} is {job['state']} with run_count {job['run_count']}"
                f" and {len(runs)} runs (expected active, one)"
            )
        if len(beats) != 1 or [r["input_id"] for r in runs] != [b["id"] for b in beats]:
            out.append(
                f"heartbeat runs name inputs {[r['input_id'] for r in runs]}, the inbox"
                f" holds heartbeat inputs {[b['id'] for b in beats]}"
            )
        for beat in beats:
            if beat["state"] not in ("done", "interrupted"):
                out.append(f"heartbeat input {beat['id']} ended {beat['state']}")
        return out


class HeartbeatForwarded(HeartbeatFire):
    """``set_heartbeat`` with ``suppress_threshold: 0``, made due: no answer is short enough
    to be suppressed, so the turn's events, held back while it ran, are forwarded to the
    session's log at its closure (``_settle_heartbeat``): a ``stream_start`` and one
    ``stream_end``, as for any turn (the invariants check that); the job stays active."""

    name = "heartbeat_forwarded"
    points = 16  # (11-13 on SQLite, 14-16 on PostgreSQL)
    arguments = {"enabled": True, "interval_minutes": 15, "suppress_threshold": 0}

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        out = super().check(snap, record)
        for beat in snap["inbox"]:
            if beat["source"] == "heartbeat" and (beat["detail"] or {}).get("suppressed"):
                out.append(f"heartbeat input {beat['id']} was suppressed (threshold 0)")
        return out


GITHUB_SECRET = "crash-harness-github-secret-0123"
DELIVERY = "crash-delivery-1"


class WebhookDelivery(Scenario):
    """A signed GitHub ``check_run`` (a failure) to a session bound to its pull request; the
    repository is the dev user's. GitHub's redelivery keeps the delivery id: a re-sent one is
    answered 200 ``duplicate`` and runs no second turn."""

    name = "webhook"
    points = 20
    #: the sweep redelivers what a crash left half-delivered every second (a target the dead
    #: node claimed waits for its claim to run out first: ``CLAIM_SECONDS``, 30 s)
    config = (
        "[webhooks]\nredeliver_seconds = 1\n"
        f'[webhooks.github]\nsecret = "{GITHUB_SECRET}"\n'
        '[webhooks.github.repos."acme/app"]\nuser = "dev"\n'
    )

    async def drive(self, client: Client) -> None:
        from tests.support.github import check_run_event, signed

        await client.create_session("s")
        await client.request(
            "POST", "/sessions/s/bindings", json={"source": "github:acme/app#3"}, ok=(200, 201)
        )
        body = check_run_event(owner="acme", repo="app", pr=3)
        delivery = signed("check_run", body, secret=GITHUB_SECRET, delivery=DELIVERY)
        await client.request("POST", "/webhooks/github", ok=(200, 202), **delivery)
        client.record.deliveries.add(f"github:{DELIVERY}")

    def settled(self, snap: Snapshot) -> bool:
        return super().settled(snap) and all(
            t["state"] != "accepted" for t in snap["webhook_targets"]
        )

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        out = []
        inputs = [
            row
            for row in snap["inbox"]
            if isinstance(row["payload"], dict) and row["payload"].get("delivery_id")
        ]
        if record.deliveries and len(inputs) != 1:
            out.append(f"the delivery answered 2xx made {len(inputs)} inputs (expected one)")
        for target in snap["webhook_targets"]:
            if target["state"] != "delivered":
                out.append(
                    f"target {target['session_key']} of {target['delivery_id']} is"
                    f" {target['state']}"
                )
        return out


class BackgroundTask(Scenario):
    """A turn starts a background task (``background_run`` of ``clock.now``); the task
    finishes and tells the session, which runs a turn for it."""

    name = "background"
    points = 23

    async def drive(self, client: Client) -> None:
        await client.create_session("s")
        await client.send("s", _call("background_run", {"name": "clock.now", "params": {}}), "m1")

    #: Seconds a finished task may take to tell its session before :meth:`check` says it
    #: never did. A survivor tells what a dead node's task left untold only once that node's
    #: lease (``SURVIVOR_LEASE_SECONDS``, 3 s) expired and its sweep ran: 3 s, as it was, let a
    #: run stop the survivor first when the node died just after the task ended (two false
    #: violations, ``background on postgres+survivor``, 28 November).
    TELL_WITHIN = 10.0

    def settled(self, snap: Snapshot) -> bool:
        """No input waits or runs, no task runs, and each finished task told its session
        (or had ``TELL_WITHIN`` seconds to: then :meth:`check` says it never did)."""
        if not super().settled(snap):
            return False
        for task in snap["background_tasks"]:
            if task["state"] == "running":
                return False
            if not _told(snap, task) and _age(task["finished_at"]) < self.TELL_WITHIN:
                return False
        return True

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        out = []
        tasks = snap["background_tasks"]
        if len(tasks) > 1:
            out.append(f"{len(tasks)} background tasks from one tool call")
        for task in tasks:
            told = _told(snap, task)
            if len(told) != 1:
                out.append(
                    f"task {task['id']} ended {task['state']} (notified_at"
                    f" {task['notified_at']}) and told its session {len(told)} times"
                )
        return out


def _told(snap: Snapshot, task: dict) -> list[dict]:
    """The inputs that tell ``task``'s session that it ended."""
    return [
        row
        for row in snap["inbox"]
        if row["source"] != "user" and task["id"] in json.dumps(row["payload"], default=str)
    ]


def _age(when: object) -> float:
    """Seconds since ``when`` (ISO text on SQLite, a datetime on PostgreSQL); 0 for none."""
    if when is None:
        return 0.0
    at = when if isinstance(when, datetime) else datetime.fromisoformat(str(when))
    return (datetime.now(UTC) - at).total_seconds()


class ApprovalAnswered(Scenario):
    """A tool whose policy is ``APPROVE`` (``clock.now``, by config): the turn asks, the
    client approves through ``POST /approvals/{id}/approve``, the call runs."""

    name = "approval"
    points = 21
    config = '[policies]\n"clock.now" = "APPROVE"\n'

    async def drive(self, client: Client) -> None:
        await client.create_session("s")
        input_id = await client.send("s", _call("clock.now", {}), "m1")
        deadline = trio.current_time() + 20
        while trio.current_time() < deadline:
            listed = await client.request("GET", "/sessions/s/approvals")
            for approval in listed.json()["approvals"]:
                await client.request(
                    "POST", f"/approvals/{approval['approval_id']}/approve", ok=(200, 404, 409)
                )
                return
            snap = await client.target.snapshot()  # type: ignore[union-attr]
            if any(r["id"] == input_id and r["state"] in FINAL for r in snap["inbox"]):
                return  # the turn that asked was cut by a crash: nothing to answer
            await trio.sleep(0.2)
        raise AssertionError("no approval was asked")

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        out = []
        for row in snap["inbox"]:
            if row["state"] != "done":
                continue
            types = [
                e["type"]
                for e in snap["events"]
                if e["session_id"] == row["session_id"]
                and e["type"] in ("approval_required", "approval_resolved", "tool_call")
            ]
            # (approval_resolved comes through the session's mailbox, the call's events
            # from the turn: either may be stored first)
            if sorted(types) != ["approval_required", "approval_resolved", "tool_call"]:
                out.append(
                    f"input {row['id']} done with {types} (expected one approval"
                    " asked, answered, the call run)"
                )
        return out


class MemorySave(Scenario):
    """A turn saves a fact (``memory.save``): one fact, kept once its turn completed."""

    name = "memory"
    points = 18
    FACT = {"category": "preferences", "key": "drink", "value": "tea"}

    async def drive(self, client: Client) -> None:
        await client.create_session("s")
        await client.send("s", _call("memory.save", self.FACT), "m1")

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        facts = [f for f in snap["memory_facts"] if f["key"] == "drink"]
        done = [r for r in snap["inbox"] if r["state"] == "done"]
        # a save whose commit the store refused (``--fault fail``) is a failed tool call the
        # agent and the client see (the model may try again): kept nowhere, and said so
        refused = any(
            e["type"] == "tool_call"
            and e["payload"].get("tool") == "memory.save"
            and (e["payload"].get("error") or {}).get("code")
            in ("store_error", "store_unavailable")
            for e in snap["events"]
        )
        if len(facts) > 1 or (done and not facts and not (refused and self.refused_commits)):
            return [f"{len(facts)} facts saved, the turn {'done' if done else 'not done'}"]
        if facts and (facts[0]["owner"], facts[0]["value"]) != (OWNER, "tea"):
            return [f"the fact saved is {facts[0]}"]
        return []


class BufferedNotification(Scenario):
    """A turn sends a notification (``send_notification`` to ``llm_notification``) while no
    client is attached: the client's copy is buffered; a client then attaches (WebSocket) and
    gets it, once."""

    name = "notification"
    points = 24

    async def drive(self, client: Client) -> None:
        from trio_websocket import open_websocket_url

        await client.create_session("s")
        arguments = {"channel": "llm_notification", "message": "ding"}
        await client.send("s", _call("send_notification", arguments), "m1")
        if not await client.wait_for(lambda snap: bool(snap["inbox"]) and _fired(snap)):
            raise AssertionError("the turn did not end")
        url = client.url.replace("http://", "ws://") + "/ws"
        headers = [(b"authorization", f"Bearer {TOKEN}".encode())]
        try:
            async with open_websocket_url(url, extra_headers=headers) as ws:
                await ws.send_message(json.dumps({"type": "attach", "session_id": "s"}))
                with trio.move_on_after(3):
                    while True:
                        frame = json.loads(await ws.get_message())
                        if frame.get("type") == "notification":
                            return
        except (OSError, ConnectionError, trio.BrokenResourceError) as exc:
            raise ServerGone(f"websocket: {exc!r}") from None
        except Exception as exc:  # trio_websocket's own closed/handshake errors
            name = type(exc).__name__
            if "ConnectionClosed" in name or "Handshake" in name or "ConnectionTimeout" in name:
                raise ServerGone(f"websocket: {exc!r}") from None
            raise

    def settled(self, snap: Snapshot) -> bool:
        return _fired(snap) and not _buffered(snap)

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        shown = [
            e["payload"]
            for e in snap["events"]
            if e["session_id"] == f"{OWNER}/s" and e["type"] == "notification"
        ]
        ids = Counter(p.get("notification_id") for p in shown)
        out = [f"notification {n} published {k} times" for n, k in ids.items() if k > 1]
        if _buffered(snap):
            out.append(f"{len(_buffered(snap))} notifications still buffered after an attach")
        sent = [
            e
            for e in snap["events"]
            if e["type"] == "tool_call" and e["payload"].get("tool") == "send_notification"
        ]
        if sent and sent[0]["payload"].get("ok") and not shown:
            out.append("the notification was sent, and never reached the client")
        return out


def _fired_runs(snap: Snapshot, job_id: str) -> list[dict]:
    """The job's runs that ran a turn: a late job's occurrences folded into one
    (``coalesced``) or passed over (``missed``) are recorded with no input, by design."""
    return [
        r
        for r in snap["job_runs"]
        if r["job_id"] == job_id and r["state"] not in ("coalesced", "missed")
    ]


def _fired(snap: Snapshot) -> bool:
    """No input waits or runs, and no job is still to fire."""
    return Scenario.settled(Scenario(), snap) and all(
        job["state"] not in ("active", "paused") for job in snap["jobs"]
    )


def _buffered(snap: Snapshot) -> list[dict]:
    return [
        row
        for row in snap["kv"]
        if str(row["namespace"]).startswith("notify:") and row["key"] != ""
    ]


class DeleteWithAutomations(Scenario):
    """A session with a cron job and a watcher, deleted (``confirm=true`` cancels the jobs a
    user made): nothing of it remains. A client that sent the delete re-sends only that."""

    name = "delete"
    points = 43

    def __init__(self) -> None:
        self.deleting = False

    async def drive(self, client: Client) -> None:
        if not self.deleting:
            await client.create_session("s")
            cron = {"cron": "0 0 1 1 *", "prompt": "new year", "action_type": "llm_prompt"}
            await client.send("s", _call("schedule_cron", cron), "m1")
            watch = {"tool": "clock.now", "interval": 3600}
            last = await client.send("s", _call("watch_start", watch), "m2")
            if not await client.wait_for(
                lambda snap: any(r["id"] == last and r["state"] in FINAL for r in snap["inbox"])
            ):
                raise AssertionError("the second turn did not end")
            self.deleting = True
        answer = await client.request("DELETE", "/sessions/s?confirm=true", ok=(200, 204, 404))
        del answer
        client.record.deleted.add(f"{OWNER}/s")

    def settled(self, snap: Snapshot) -> bool:
        return super().settled(snap) and not any(r["id"] == f"{OWNER}/s" for r in snap["sessions"])

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        if f"{OWNER}/s" not in record.deleted:
            return ["the delete was never acknowledged"]
        return []


SCENARIOS: dict[str, type[Scenario]] = {
    cls.name: cls
    for cls in (
        MessageWithToolCall,
        OnceFire,
        RecallFire,
        HeartbeatFire,
        HeartbeatForwarded,
        CheckFire,
        CronFire,
        WebhookDelivery,
        BackgroundTask,
        ApprovalAnswered,
        MemorySave,
        BufferedNotification,
        DeleteWithAutomations,
    )
}
