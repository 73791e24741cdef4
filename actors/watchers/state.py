"""One watcher's configuration and state: the ``Watcher`` record, its history ring and views.

``Watcher`` is plain data plus what can be derived from it alone: its current delay (backoff),
its persisted form (``to_state``/``from_state`` and the history chunks) and the views the
messages answer with. It is separate from the actor because it holds no task, no clock and no
store: the escalation logic mutates it, the persistence writes it, the actor schedules it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from turnstile.actors.watchers.safeexpr import Expr, compile_expr
from turnstile.actors.watchers.spec import _num, backoff_delay
from turnstile.runtime.timerwheel import TimerHandle

#: Entries kept in each watcher's history ring.
HISTORY_SIZE = 100
#: History entries per persisted chunk; ``HISTORY_CHUNKS`` chunks cover any 100 consecutive
#: checks (11 blocks of 10, so the newest block never overwrites one still in the ring).
HISTORY_CHUNK = 10
HISTORY_CHUNKS = HISTORY_SIZE // HISTORY_CHUNK + 1


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


# -- one watcher -------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Watcher:
    """One watcher's configuration and state (all of it persisted but ``handle``/``expr``/
    ``epoch``). Times are wall-clock epoch seconds."""

    id: str
    session_id: str
    owner: str
    tool: str
    params: dict[str, Any]
    interval: float
    label: str
    notify_when: str
    notify_config: dict[str, Any]
    created_at: float
    state: str = "running"  # running | paused (stopped watchers are gone)
    check_count: int = 0
    notification_count: int = 0
    suppressed_count: int = 0
    suppressed_since: int = 0
    error_count: int = 0
    error_streak: int = 0
    last_error_run: int = 0
    last_check_at: float | None = None
    next_check_at: float | None = None
    last_ok: bool | None = None
    last_hash: str | None = None
    last_value: str | None = None
    last_error: dict[str, Any] | None = None
    #: The state the strategy believes in (after debounce), the one last notified, the one
    #: being debounced (and how many checks agreed), and the one held back by the cooldown.
    confirmed: str | None = None
    notified: str | None = None
    candidate: str | None = None
    candidate_count: int = 0
    held: str | None = None
    last_escalation_at: float | None = None
    batch: list[dict[str, Any]] = field(default_factory=list)
    #: Several nodes: the node that checks it (None: nobody yet, or released by the node that
    #: had it; ``cluster.py``). Always None on one node.
    holder: str | None = None
    #: ``(check, at, ok, text, escalated, duration_ms)``, oldest first.
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_SIZE))
    handle: TimerHandle | None = None
    expr: Expr | None = None
    epoch: int = 0

    @property
    def debounce(self) -> int:
        return int(self.notify_config.get("debounce", 1))

    @property
    def cooldown(self) -> float:
        return float(self.notify_config.get("cooldown_seconds", 0))

    def delay(self) -> float:
        return backoff_delay(self.interval, self.error_streak)

    # -- persistence --

    _PERSISTED = (
        "id",
        "session_id",
        "owner",
        "tool",
        "params",
        "interval",
        "label",
        "notify_when",
        "notify_config",
        "created_at",
        "state",
        "check_count",
        "notification_count",
        "suppressed_count",
        "suppressed_since",
        "error_count",
        "error_streak",
        "last_error_run",
        "last_check_at",
        "next_check_at",
        "last_ok",
        "last_hash",
        "last_value",
        "last_error",
        "confirmed",
        "notified",
        "candidate",
        "candidate_count",
        "held",
        "last_escalation_at",
        "batch",
        "holder",
    )

    def to_state(self) -> dict[str, Any]:
        """Everything but the history ring, as JSON-ready data."""
        out = {name: getattr(self, name) for name in self._PERSISTED}
        out["v"] = 1
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Watcher:
        known = {k: state[k] for k in cls._PERSISTED if k in state}
        watcher = cls(**known)
        if watcher.notify_when == "on_threshold":
            watcher.expr = compile_expr(watcher.notify_config.get("expression", ""))
        return watcher

    def chunk_of(self, check: int) -> int:
        return ((check - 1) // HISTORY_CHUNK) % HISTORY_CHUNKS

    def chunk_entries(self, chunk: int) -> list[list[Any]]:
        """The ring's entries that belong to ``chunk``: the latest block of ``HISTORY_CHUNK``
        consecutive checks with that index (read from the newest end: the dirty chunk is
        nearly always the current block, so this touches a handful of entries)."""
        if not self.history:
            return []
        block = (self.history[-1][0] - 1) // HISTORY_CHUNK
        block -= (block - chunk) % HISTORY_CHUNKS
        low, high = block * HISTORY_CHUNK + 1, (block + 1) * HISTORY_CHUNK
        out = []
        for entry in reversed(self.history):
            if entry[0] < low:
                break
            if entry[0] <= high:
                out.append(list(entry))
        out.reverse()
        return out

    # -- views --

    def start_view(self) -> dict[str, Any]:
        name = self.label or self.id
        return {
            "watcher_id": self.id,
            "tool_name": self.tool,
            "label": self.label,
            "status": self.state,
            "interval": _num(self.interval),
            "notify_when": self.notify_when,
            "notify_config": dict(self.notify_config),
            "hint": (
                f"Watcher '{name}' started. Checking {self.tool} every "
                f"{_num(self.interval)}s. You'll be notified via '{self.notify_when}' strategy."
            ),
        }

    def summary_view(self) -> dict[str, Any]:
        return {
            "watcher_id": self.id,
            "session_id": self.session_id,
            "tool_name": self.tool,
            "label": self.label,
            "status": self.state,
            "interval": _num(self.interval),
            "notify_when": self.notify_when,
            "check_count": self.check_count,
            "notification_count": self.notification_count,
            "consecutive_errors": self.error_streak,
            "last_check_at": _iso(self.last_check_at),
            "next_check_at": _iso(self.next_check_at) if self.state == "running" else None,
        }

    def status_view(self, history: int = 5) -> dict[str, Any]:
        last: dict[str, Any] | None = None
        if self.last_ok is True:
            last = {"ok": True, "result": self.last_value}
        elif self.last_ok is False:
            last = {"ok": False, "error": self.last_error}
        return {
            **self.summary_view(),
            "params": self.params,
            "notify_config": dict(self.notify_config),
            "owner": self.owner,
            "created_at": _iso(self.created_at),
            "current_interval": _num(self.delay()),
            "error_count": self.error_count,
            "suppressed_count": self.suppressed_count,
            "last_result": last,
            "recent_history": self.history_view(history),
        }

    def history_view(self, last_n: int) -> list[dict[str, Any]]:
        entries = list(self.history)[-last_n:] if last_n > 0 else []
        out = []
        for check, at, ok, text, escalated, ms in entries:
            entry: dict[str, Any] = {"check": check, "at": _iso(at), "ok": ok}
            entry["result" if ok else "error"] = text
            entry["escalated"] = escalated
            entry["duration_ms"] = ms
            out.append(entry)
        return out
