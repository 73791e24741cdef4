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

from tests.crash.harness import OWNER, Client, Scenario
from tests.crash.invariants import Record
from tests.crash.stores import Snapshot


def _call(tool: str, arguments: dict) -> str:
    return f"/call {tool} {json.dumps(arguments)}"


class MessageWithToolCall(Scenario):
    name = "message_tool"
    points = 20

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
        if any(e.get("status") not in ("completed", "interrupted") for e in ends):
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
        return super().settled(snap) and all(
            job["state"] not in ("active", "paused") for job in snap["jobs"]
        )

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        out = []
        for job in snap["jobs"]:
            runs = [r for r in snap["job_runs"] if r["job_id"] == job["id"]]
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
    points = 24
    tool = "schedule_once"
    arguments = {"when": "in 1s", "prompt": "fired", "action_type": "llm_prompt"}


class RecallFire(_Fires):
    name = "recall"
    points = 25
    tool = "schedule_recall"
    arguments = {"call_type": "once", "when": "in 1s", "additional_context_message": "look again"}


SCENARIOS: dict[str, type[Scenario]] = {
    cls.name: cls for cls in (MessageWithToolCall, OnceFire, RecallFire)
}
