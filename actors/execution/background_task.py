"""A background task as the background actor holds it, the words its session is told, and the
form the store keeps it in.

Both the background actor (``background``) and the sweep that closes the tasks of ended nodes
(``background_lost``) tell sessions with these texts and read and write these rows, so that
every node tells a task's end in the same words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import trio

from turnstile.actors.execution.queries import StoredTask
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.runtime.clock import Clock

__all__ = [
    "NOTIFY_RESULT_CHARS",
    "STORED_RESULT_CHARS",
    "BackgroundTask",
    "from_store",
    "iso",
    "stored_text",
    "notification_text",
    "result_of",
    "stored_result",
]

#: Results longer than this are cut in the notification (background_result has them whole).
NOTIFY_RESULT_CHARS = 2000
#: A stored result longer than this (as JSON) is kept cut, as text: ``{"success", "truncated",
#: "chars", "text"}``; the node that ran the task keeps it whole in memory.
STORED_RESULT_CHARS = 64_000


@dataclass
class BackgroundTask:
    """One background task and, once done, its outcome."""

    id: str
    session_id: str
    owner: str
    tool: str
    params: dict[str, Any]
    started_at: str
    started: float
    preapproved: bool = False
    idempotency_key: str | None = None
    status: str = "running"  # running | completed | failed | cancelled | lost
    result: ToolResult | None = None
    finished: float | None = None
    done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: when it started, by the node's clock (what the store records)
    started_on: datetime | None = None
    #: its row was written when it started (so its end is written too)
    recorded: bool = False
    #: read from the store: run by another node (or an earlier incarnation of this one)
    stored: bool = False

    def elapsed(self, now: float) -> float:
        return round((self.finished if self.finished is not None else now) - self.started, 3)

    def view(self, now: float) -> dict[str, Any]:
        return {
            "task_id": self.id,
            "tool_name": self.tool,
            "status": self.status,
            "started_at": self.started_at,
            "elapsed_seconds": self.elapsed(now),
        }


def notification_text(task: BackgroundTask, now: float) -> str:
    """The reference's notification for a finished task."""
    return _text(task.id, task.tool, task.status, task.elapsed(now), task.result)


def stored_text(task: StoredTask) -> str:
    """The notification for an ended task, read from its row alone (so every node that tells
    it tells the same words): a task closed as lost, or one whose node ended before telling."""
    assert task.finished_at is not None
    elapsed = (task.finished_at - task.started_at).total_seconds()
    return _text(task.id, task.tool, task.state, elapsed, result_of(task.result))


def _text(task_id: str, tool: str, status: str, elapsed: float, result: ToolResult | None) -> str:
    head = f"task_id={task_id}, tool={tool}, elapsed={elapsed:.1f}s"
    if status == "cancelled":
        return f"[BACKGROUND TASK CANCELLED] {head}"
    if result is None or not result.ok:
        message = (result.error or {}).get("message") if result else "the task failed"
        return f"[BACKGROUND TASK FAILED] {head}\nError: {message}"
    body = json.dumps({"success": True, "data": result.data}, default=str)
    if len(body) <= NOTIFY_RESULT_CHARS:
        return f"[BACKGROUND TASK COMPLETED] {head}\nResult: {body}"
    return (
        f"[BACKGROUND TASK COMPLETED] {head}\n"
        f"Result (truncated): {body[:NOTIFY_RESULT_CHARS]}... ({len(body)} chars total)\n"
        f'Use background_result(task_id="{task_id}") to get the full output.'
    )


def stored_result(result: ToolResult | None) -> str | None:
    """A result as the store keeps it: JSON, cut past :data:`STORED_RESULT_CHARS`."""
    if result is None:
        return None
    body: dict[str, Any] = {"success": result.ok}
    if result.ok:
        body["data"] = result.data
    else:
        body["error"] = result.error
    text = json.dumps(body, default=str)
    if len(text) <= STORED_RESULT_CHARS:
        return text
    cut = {
        "success": result.ok,
        "truncated": True,
        "chars": len(text),
        "text": text[:STORED_RESULT_CHARS],
    }
    return json.dumps(cut)


def result_of(stored: dict[str, Any] | None) -> ToolResult | None:
    """A stored result (:func:`stored_result`, decoded) as a ``ToolResult``; a cut one keeps
    its cut text."""
    if stored is None:
        return None
    if stored.get("truncated"):
        cut = {k: stored[k] for k in ("truncated", "chars", "text")}
        if stored["success"]:
            return ToolResult(ok=True, data=cut)
        return ToolResult(ok=False, error={"code": "truncated", "message": stored["text"], **cut})
    if stored["success"]:
        return ToolResult(ok=True, data=stored.get("data"))
    return ToolResult(ok=False, error=stored.get("error"))


def from_store(row: StoredTask, clock: Clock) -> BackgroundTask:
    """A stored task as the tools and routes read one: its times on this node's trio clock."""
    now = trio.current_time()
    started = now - (clock.now() - row.started_at).total_seconds()
    finished = None
    if row.finished_at is not None:
        finished = started + (row.finished_at - row.started_at).total_seconds()
    task = BackgroundTask(
        id=row.id,
        session_id=row.session_key,
        owner=row.owner,
        tool=row.tool,
        params={},
        started_at=iso(row.started_at),
        started=started,
        status=row.state,
        result=result_of(row.result),
        finished=finished,
        started_on=row.started_at,
        stored=True,
    )
    if row.state != "running":
        task.done.set()
    return task


def iso(when: datetime) -> str:
    """``when`` as the tools and routes show it (ISO 8601, ``Z`` for UTC)."""
    return when.isoformat().replace("+00:00", "Z")
