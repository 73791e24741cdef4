"""Watchers: run a tool on an interval, silently, and tell the session only what matters.

A watcher belongs to a session (and its owner). Every ``interval`` seconds (5–3,600) it runs its
tool through the tool registry — policies apply exactly as for a direct call — and an
escalation strategy decides whether the result is worth a notification:

* ``on_change`` (default) — the first check sets the baseline *and* notifies; afterwards a
  notification whenever the result differs from the last one notified (a stable hash of the
  JSON result; an error counts as a result of its own, so "starts failing" is a change).
* ``on_error`` — a notification when the tool fails, and one when it recovers. Nothing while
  all is well.
* ``on_threshold`` — ``notify_config.expression`` (``runtime.safeexpr``, compiled at start, so a
  bad expression is refused there with its position) is evaluated against the result's data
  (against ``{"error": {...}}`` when the tool failed, so ``result.error != null`` works).
  **Edge-triggered**: a notification when it *becomes* true; it must turn false again (which
  is silent) before it can notify again.
* ``summary`` — every ``notify_config.batch_size`` checks (default 10), one notification with
  the batch.
* ``always`` — every check (debugging).

Beyond the reference:

* ``notify_config.debounce`` (on_change, on_error, on_threshold; default 1): a new state counts
  only after that many consecutive checks agree on it, so a flapping target does not flap the
  agent.
* ``notify_config.cooldown_seconds`` (every strategy but summary): at most one escalation per
  window. A change held back by the cooldown is counted (``suppressed_count``) and, if the state
  still differs from what was last notified, delivered by the first check after the window —
  so the agent learns the latest state, never a stale one, and never twice in a window.
* **Backoff.** While the tool fails, checks slow down: ``interval × 2^k`` after ``k``
  consecutive failures, capped at ``10 × interval`` and at one hour (never below the
  interval). The first success returns to the normal interval.

Only escalations reach the session, as the reference's text::

    [WATCHER UPDATE] watcher_id=a1b2c3d4e5f6, label="API health check", tool=http.get
    Check #42 (interval: 30s, 3 notification(s) so far, strategy: on_error)
    Error: Connection refused

sent with ``Inject(source="notification")`` — folded into the session's running turn, or a turn
of its own when the session is idle; escalations of one session within ``BATCH_WINDOW`` travel
as one ``Inject`` — plus a ``watcher_update`` event per escalation (and per start, pause,
resume and stop) for attached clients. A check itself costs no turn and no event.

**Timing.** Checks are indexed by one ``TimerWheel``; one task sleeps until its next deadline
and starts what is due, each check in its own short-lived task under a ``CapacityLimiter``
(``MAX_CONCURRENT_CHECKS``). An idle actor with 10,000 watchers has two sleeping tasks (the
wheel and the persister), not 10,000. A new watcher checks at once, then every interval, on a
fixed grid (a slow check does not make the next one drift). A check may take at most
``check_timeout(interval)``; longer is an error.

**Persistence** (store key-value namespace ``watchers``). Key ``<watcher_id>`` holds the
watcher's full state (session, owner, tool, params, strategy and config, running/paused, counts,
last result hash and bounded value, error streak, debounce/cooldown state, summary batch, next
check time). The history ring (100 entries) is stored in chunks of ``HISTORY_CHUNK`` entries
under ``<watcher_id>/hNN``, so a check rewrites one small chunk rather than the whole ring.
Start, pause, resume and stop are written through at once. Check results are written behind:
dirty watchers (and dirty chunks) are flushed together, in one ``kv_put``, at most every
``persist_interval`` seconds, and on stop. So a kill -9 loses at most the checks of the last
flush window (counts and history a second behind); it never loses a watcher.

At start the actor reloads every watcher: running ones resume on their own grid — the next
check is the first multiple of the interval after now, counted from the last planned check —
paused ones stay paused, counts and history are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
import trio

from turnstile.actors.sessions.actor import Inject, Publish
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.actors.watchers.safeexpr import MAX_EXPRESSION_CHARS, Expr, compile_expr
from turnstile.runtime.actor import Actor
from turnstile.runtime.clock import Clock
from turnstile.runtime.codec import Message
from turnstile.runtime.errors import InvalidArgument, LimitExceeded, NotFound
from turnstile.runtime.store import Store
from turnstile.runtime.timerwheel import TimerHandle, TimerWheel

__all__ = [
    "STRATEGIES",
    "WatcherActor",
    "Watcher",
    "StartWatcher",
    "StopWatcher",
    "PauseWatcher",
    "ResumeWatcher",
    "GetWatcher",
    "ListWatchers",
    "WatcherHistory",
    "DropSessionWatchers",
    "notification_text",
    "backoff_delay",
    "check_timeout",
]

log = logging.getLogger("turnstile.watcher")

STRATEGIES = ("on_change", "on_error", "on_threshold", "summary", "always")
MIN_INTERVAL = 5.0
MAX_INTERVAL = 3600.0
DEFAULT_INTERVAL = 30.0
#: Entries kept in each watcher's history ring.
HISTORY_SIZE = 100
#: History entries per persisted chunk; ``HISTORY_CHUNKS`` chunks cover any 100 consecutive
#: checks (11 blocks of 10, so the newest block never overwrites one still in the ring).
HISTORY_CHUNK = 10
HISTORY_CHUNKS = HISTORY_SIZE // HISTORY_CHUNK + 1
#: Checks running at once, across every watcher.
MAX_CONCURRENT_CHECKS = 64
#: Escalations of one session this close together reach it as one notification.
BATCH_WINDOW = 0.05
#: Results longer than this are cut in a notification.
NOTIFY_RESULT_CHARS = 2000
#: A summary notification is cut beyond this.
NOTIFY_SUMMARY_CHARS = 4000
#: A history entry keeps this much of the result (or error).
HISTORY_TEXT_CHARS = 200
#: The last result is kept (in memory and in the store) up to this many characters.
LAST_VALUE_CHARS = 2000
#: A result in a summary batch is kept whole up to this size, else as cut text.
BATCH_ENTRY_CHARS = 200
MAX_PARAMS_BYTES = 16_384
MAX_LABEL_CHARS = 200
MAX_TOOL_CHARS = 128
MAX_BATCH_SIZE = 100
DEFAULT_BATCH_SIZE = 10
MAX_DEBOUNCE = 100
MAX_COOLDOWN_SECONDS = 86_400.0
#: Backoff never waits longer than this many intervals, nor longer than an hour.
BACKOFF_FACTOR_CAP = 10
BACKOFF_SECONDS_CAP = 3600.0
NAMESPACE = "watchers"
CONFIG_KEYS = (
    "expression",
    "batch_size",
    "debounce",
    "cooldown_seconds",
    "output_channel",
    "output_config",
)

_det = msgspec.json.Encoder(order="deterministic")


def backoff_delay(interval: float, error_streak: int) -> float:
    """Seconds until the next check after ``error_streak`` consecutive failures."""
    if error_streak <= 0:
        return interval
    cap = max(interval, min(interval * BACKOFF_FACTOR_CAP, BACKOFF_SECONDS_CAP))
    return min(interval * 2.0 ** min(error_streak, 32), cap)


def check_timeout(interval: float) -> float:
    """How long one check may run: the interval, but at least 30 s and at most 5 min."""
    return min(300.0, max(30.0, interval))


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- messages ----------------------------------------------------------------------------------


class StartWatcher(Message, tag="watch_start", kw_only=True):
    """Create a watcher for a session; answers its start view (the reference's response)."""

    session_id: str
    owner: str
    tool: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    interval: float = DEFAULT_INTERVAL
    label: str = ""
    notify_when: str = "on_change"
    notify_config: dict[str, Any] = msgspec.field(default_factory=dict)


class _Scoped(Message, kw_only=True):
    """Names one watcher; ``session_id`` / ``owner``, when given, must match (else not found)."""

    watcher_id: str
    session_id: str | None = None
    owner: str | None = None


class StopWatcher(_Scoped, tag="watch_stop", kw_only=True):
    """Stop and forget a watcher (history too); answers its final summary view."""


class PauseWatcher(_Scoped, tag="watch_pause", kw_only=True):
    """Pause a watcher (no checks; history kept); answers its summary view."""


class ResumeWatcher(_Scoped, tag="watch_resume", kw_only=True):
    """Resume a paused watcher (next check one interval from now); answers its summary view."""


class GetWatcher(_Scoped, tag="watch_status", kw_only=True):
    """Answers the status view with the ``history`` most recent history entries."""

    history: int = 5


class WatcherHistory(_Scoped, tag="watch_history", kw_only=True):
    """Answers the ``last_n`` (1–100) most recent history entries, oldest first."""

    last_n: int = 10


class ListWatchers(Message, tag="watch_list", kw_only=True):
    """Answers summary views of a session's (or an owner's) watchers, running first."""

    session_id: str | None = None
    owner: str | None = None


class DropSessionWatchers(Message, tag="watch_drop_session", kw_only=True):
    """Stop every watcher of a session (it is being deleted); answers how many."""

    session_id: str


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


def notification_text(watcher: Watcher, check: int, body: str, extra: list[str] = ()) -> str:
    """The reference's notification: a head line, the check line, the body, then notes."""
    head = (
        f"[WATCHER UPDATE] watcher_id={watcher.id}, "
        f"label={json.dumps(watcher.label, ensure_ascii=False)}, tool={watcher.tool}"
    )
    line = (
        f"Check #{check} (interval: {_num(watcher.interval)}s, "
        f"{watcher.notification_count} notification(s) so far, strategy: {watcher.notify_when})"
    )
    return "\n".join([head, line, body, *extra])


def _result_line(data: Any) -> str:
    text = json.dumps(data, default=str, ensure_ascii=False)
    if len(text) <= NOTIFY_RESULT_CHARS:
        return f"Result: {text}"
    return f"Result (truncated): {text[:NOTIFY_RESULT_CHARS]}... ({len(text)} chars total)"


# -- the actor ---------------------------------------------------------------------------------


class _Outbox:
    __slots__ = ("events", "texts", "ids")

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.texts: list[str] = []
        self.ids: list[str] = []


class WatcherActor(Actor):
    """Owns every watcher. See the module docstring.

    Args:
        run_tool: ``async (session_id, owner, tool, params) -> ToolResult`` — the registry's
            call (``tools.watchers.watch_runner(registry)`` also refuses tools whose policy has
            become APPROVE or BLOCK since the watcher started).
        publish: ``async (session_id, message)`` — tells a session actor (``Inject``,
            ``Publish``).
        store: where watchers persist (key-value namespace ``watchers``).
        clock: wall time for persisted times and cooldowns; trio's clock for the wheel.
        max_watchers_per_session: running and paused watchers one session may have.
        persist_interval: check results are flushed at most this often (seconds).
        max_concurrent_checks: checks in flight at once, over every watcher.
    """

    uses_nursery = True

    def __init__(
        self,
        run_tool: Callable[[str, str, str, dict[str, Any]], Awaitable[ToolResult]],
        publish: Callable[[str, Any], Awaitable[None]],
        store: Store,
        clock: Clock,
        *,
        max_watchers_per_session: int = 20,
        persist_interval: float = 1.0,
        max_concurrent_checks: int = MAX_CONCURRENT_CHECKS,
        notify=None,
    ) -> None:
        self.run_tool = run_tool
        self.publish = publish
        #: ``async (session_id, owner, channel, text, **fields)`` — the notifier, for watchers
        #: whose ``notify_config.output_channel`` names a channel other than the session.
        self.notify = notify
        self.store = store
        self.clock = clock
        self.max_per_session = max_watchers_per_session
        self.persist_interval = persist_interval
        self.wheel = TimerWheel(now=trio.current_time())
        self.watchers: dict[str, Watcher] = {}
        self.by_session: dict[str, set[str]] = {}
        self._wake = trio.Event()
        self._sleep_until = math.inf
        self._limiter = trio.CapacityLimiter(max_concurrent_checks)
        self._dirty: set[str] = set()
        self._dirty_chunks: set[tuple[str, int]] = set()
        self._dirty_event = trio.Event()
        self._write_lock = trio.Lock()
        self._outbox: dict[str, _Outbox] = {}
        #: Counters for benches and status: checks run, escalations, flushes, items flushed.
        self.stats = {"checks": 0, "escalations": 0, "flushes": 0, "flushed_items": 0}
        #: Recent lateness samples (seconds from due to start of the check).
        self.lateness: deque[float] = deque(maxlen=100_000)

    # -- lifecycle --

    async def on_start(self) -> None:
        await self._load()
        self.nursery.start_soon(self._run, name="watcher wheel")
        self.nursery.start_soon(self._persist_loop, name="watcher persister")

    async def on_stop(self) -> None:
        with trio.move_on_after(5, shield=True):
            await self._flush()
            for session_id in list(self._outbox):
                box = self._outbox.pop(session_id)
                await self._send(session_id, box)

    async def _load(self) -> None:
        rows: list[tuple[str, dict[str, Any]]] = []
        after: str | None = None
        while True:
            page = await self.store.kv_list(NAMESPACE, after_key=after, limit=1000)
            rows.extend(page)
            if len(page) < 1000:
                break
            after = page[-1][0]
        states: dict[str, dict[str, Any]] = {}
        chunks: dict[str, list[list[Any]]] = {}
        for key, value in rows:
            wid, sep, _ = key.partition("/")
            if sep:
                chunks.setdefault(wid, []).extend(value.get("entries", []))
            else:
                states[key] = value
        now_wall = self.clock.now().timestamp()
        orphans = [
            f"{wid}/h{k:02d}" for wid in chunks if wid not in states for k in range(HISTORY_CHUNKS)
        ]
        for wid, state in states.items():
            try:
                watcher = Watcher.from_state(state)
            except Exception:
                log.exception("watcher %s could not be restored; it is left in the store", wid)
                continue
            entries = sorted(chunks.get(wid, []), key=lambda e: e[0])[-HISTORY_SIZE:]
            watcher.history.extend(tuple(e) for e in entries)
            self._add(watcher)
            if watcher.state == "running":
                self._schedule(watcher, self._resume_in(watcher, now_wall))
        if orphans:
            await self.store.kv_delete(NAMESPACE, orphans)
        log.info("watchers loaded: %d", len(self.watchers))

    def _resume_in(self, watcher: Watcher, now_wall: float) -> float:
        """Seconds to the watcher's next grid point after a restart (strictly after now)."""
        delay = watcher.delay()
        planned = watcher.next_check_at
        if planned is None:
            return delay
        if planned > now_wall:
            return planned - now_wall
        steps = math.floor((now_wall - planned) / delay) + 1
        return planned + steps * delay - now_wall

    # -- messages --

    async def receive(self, message: Any) -> Any:
        match message:
            case StartWatcher():
                return await self._start(message)
            case StopWatcher():
                watcher = self._get(message)
                view = watcher.summary_view()
                await self._stop([watcher])
                view["status"] = "stopped"
                view["next_check_at"] = None
                return view
            case PauseWatcher():
                return await self._pause(self._get(message))
            case ResumeWatcher():
                return await self._resume(self._get(message))
            case GetWatcher():
                count = max(0, min(HISTORY_SIZE, message.history))
                return self._get(message).status_view(count)
            case WatcherHistory():
                watcher = self._get(message)
                if not 1 <= message.last_n <= HISTORY_SIZE:
                    raise InvalidArgument(
                        f"last_n must be from 1 to {HISTORY_SIZE}", field="last_n"
                    )
                entries = watcher.history_view(message.last_n)
                return {
                    "watcher_id": watcher.id,
                    "entries": entries,
                    "count": len(entries),
                    "total_checks": watcher.check_count,
                }
            case ListWatchers():
                return self._list(message)
            case DropSessionWatchers():
                mine = [self.watchers[w] for w in self.by_session.get(message.session_id, ())]
                await self._stop(mine, announce=False)
                return len(mine)
        raise InvalidArgument(f"watcher actor cannot handle {type(message).__name__}")

    def _get(self, msg: _Scoped) -> Watcher:
        watcher = self.watchers.get(msg.watcher_id)
        if (
            watcher is None
            or (msg.session_id is not None and watcher.session_id != msg.session_id)
            or (msg.owner is not None and watcher.owner != msg.owner)
        ):
            raise NotFound(f"no watcher with id {msg.watcher_id!r}")
        return watcher

    def _list(self, msg: ListWatchers) -> list[dict[str, Any]]:
        if msg.session_id is None and msg.owner is None:
            raise InvalidArgument("list watchers of a session or of an owner", field="session_id")
        if msg.session_id is not None:
            found = [self.watchers[w] for w in self.by_session.get(msg.session_id, ())]
        else:
            found = list(self.watchers.values())
        if msg.owner is not None:
            found = [w for w in found if w.owner == msg.owner]
        found.sort(key=lambda w: (w.state != "running", w.created_at, w.id))
        return [w.summary_view() for w in found]

    def _add(self, watcher: Watcher) -> None:
        self.watchers[watcher.id] = watcher
        self.by_session.setdefault(watcher.session_id, set()).add(watcher.id)

    async def _start(self, msg: StartWatcher) -> dict[str, Any]:
        config, expr = validate_spec(
            msg.tool, msg.params, msg.interval, msg.label, msg.notify_when, msg.notify_config
        )
        count = len(self.by_session.get(msg.session_id, ()))
        if count >= self.max_per_session:
            raise LimitExceeded(
                f"session already has {count} watchers (limit {self.max_per_session}); "
                "stop one with watch_stop first",
                field="watcher",
            )
        watcher = Watcher(
            id=uuid.uuid4().hex[:12],
            session_id=msg.session_id,
            owner=msg.owner,
            tool=msg.tool,
            params=msg.params,
            interval=float(msg.interval),
            label=msg.label,
            notify_when=msg.notify_when,
            notify_config=config,
            created_at=self.clock.now().timestamp(),
        )
        watcher.expr = expr
        if msg.notify_when == "on_error":
            watcher.confirmed = watcher.notified = "ok"
        elif msg.notify_when == "on_threshold":
            watcher.confirmed = watcher.notified = "false"
        self._add(watcher)
        try:
            await self._save_now(watcher)
        except BaseException:
            self._forget(watcher)
            raise
        self._post(watcher.session_id, self._lifecycle(watcher, "started"))
        self._schedule(watcher, 0.0)  # the first check runs at once
        return watcher.start_view()

    async def _pause(self, watcher: Watcher) -> dict[str, Any]:
        if watcher.state == "running":
            watcher.state = "paused"
            watcher.epoch += 1
            if watcher.handle is not None:
                self.wheel.cancel(watcher.handle)
                watcher.handle = None
            watcher.next_check_at = None
            await self._save_now(watcher)
            self._post(watcher.session_id, self._lifecycle(watcher, "paused"))
        return watcher.summary_view()

    async def _resume(self, watcher: Watcher) -> dict[str, Any]:
        if watcher.state == "paused":
            watcher.state = "running"
            watcher.epoch += 1
            self._schedule(watcher, watcher.delay())
            await self._save_now(watcher)
            self._post(watcher.session_id, self._lifecycle(watcher, "resumed"))
        return watcher.summary_view()

    async def _stop(self, watchers: list[Watcher], announce: bool = True) -> None:
        for watcher in watchers:
            self._forget(watcher)
        keys = [
            key
            for w in watchers
            for key in (w.id, *(f"{w.id}/h{k:02d}" for k in range(HISTORY_CHUNKS)))
        ]
        async with self._write_lock:
            for w in watchers:
                self._dirty.discard(w.id)
            self._dirty_chunks = {c for c in self._dirty_chunks if c[0] in self.watchers}
            if keys:
                await self.store.kv_delete(NAMESPACE, keys)
        if announce:
            for watcher in watchers:
                watcher.state = "stopped"
                self._post(watcher.session_id, self._lifecycle(watcher, "stopped"))

    def _forget(self, watcher: Watcher) -> None:
        watcher.epoch += 1
        if watcher.handle is not None:
            self.wheel.cancel(watcher.handle)
            watcher.handle = None
        if self.watchers.get(watcher.id) is watcher:
            del self.watchers[watcher.id]
        ids = self.by_session.get(watcher.session_id)
        if ids is not None:
            ids.discard(watcher.id)
            if not ids:
                del self.by_session[watcher.session_id]

    # -- the wheel --

    def _schedule(self, watcher: Watcher, delay: float) -> None:
        if watcher.handle is not None:
            self.wheel.cancel(watcher.handle)
        deadline = trio.current_time() + max(0.0, delay)
        watcher.next_check_at = self.clock.now().timestamp() + max(0.0, delay)
        watcher.handle = self.wheel.schedule(deadline, watcher.id)
        if deadline < self._sleep_until and not self._wake.is_set():
            self._wake.set()

    async def _run(self) -> None:
        async with trio.open_nursery() as checks:
            while True:
                deadline = self.wheel.next_deadline()
                self._sleep_until = math.inf if deadline is None else deadline
                with trio.move_on_at(self._sleep_until):
                    await self._wake.wait()
                self._wake = trio.Event()
                self._sleep_until = -math.inf  # awake: schedule() need not wake us
                now = trio.current_time()
                for watcher_id in self.wheel.advance(now):
                    watcher = self.watchers.get(watcher_id)
                    if watcher is None or watcher.state != "running":
                        continue
                    due = watcher.handle.deadline if watcher.handle is not None else now
                    watcher.handle = None
                    token = object()
                    await self._limiter.acquire_on_behalf_of(token)
                    checks.start_soon(
                        self._check, watcher, watcher.epoch, due, token, name=f"watch {watcher_id}"
                    )

    async def _check(self, watcher: Watcher, epoch: int, due: float, token: object) -> None:
        started = trio.current_time()
        self.lateness.append(started - due)
        timeout = check_timeout(watcher.interval)
        try:
            result: ToolResult | None = None
            with trio.move_on_after(timeout):
                result = await self.run_tool(
                    watcher.session_id, watcher.owner, watcher.tool, watcher.params
                )
            if result is None:
                result = ToolResult(
                    ok=False,
                    error={"code": "timeout", "message": f"the check took over {timeout:g}s"},
                )
        except Exception as exc:  # the registry turns tool errors into results; this is a bug
            log.exception("watcher %s: check failed", watcher.id)
            result = ToolResult(ok=False, error={"code": "internal", "message": type(exc).__name__})
        finally:
            self._limiter.release_on_behalf_of(token)
        self.stats["checks"] += 1
        if self.watchers.get(watcher.id) is not watcher or watcher.epoch != epoch:
            return  # stopped, paused or resumed meanwhile: this result belongs to nobody
        self._apply(watcher, result, round((trio.current_time() - started) * 1000, 1))
        delay = watcher.delay()
        self._schedule(watcher, max(0.0, due + delay - trio.current_time()))

    # -- strategies --

    def _apply(self, w: Watcher, result: ToolResult, duration_ms: float) -> None:
        now = self.clock.now().timestamp()
        w.check_count += 1
        check = w.check_count
        w.last_check_at = now
        ok = bool(result.ok)
        data = result.data if ok else None
        if ok:
            try:
                raw = _det.encode(data).decode()
            except (TypeError, msgspec.EncodeError):
                raw = json.dumps(data, default=str, sort_keys=True)
            digest = hashlib.blake2b(_det.encode(stable_view(data)), digest_size=8).hexdigest()
            message = ""
            if w.error_streak:
                w.last_error_run = w.error_streak
            w.error_streak = 0
            w.last_value = _cut(raw, LAST_VALUE_CHARS)
            w.last_error = None
            short = raw if len(raw) <= HISTORY_TEXT_CHARS else _cut(raw, HISTORY_TEXT_CHARS)
        else:
            error = result.error or {}
            code = str(error.get("code", "error"))
            message = str(error.get("message") or code)
            digest = hashlib.blake2b(
                f"error\0{code}\0{message}".encode(), digest_size=8
            ).hexdigest()
            w.error_streak += 1
            w.error_count += 1
            w.last_value = None
            w.last_error = {"code": code, "message": _cut(message, LAST_VALUE_CHARS)}
            short = _cut(message, HISTORY_TEXT_CHARS)
        if w.history and w.history[-1][3] == short:
            short = w.history[-1][3]  # share the string: unchanged results cost no memory
        w.last_ok = ok
        w.last_hash = digest
        escalation = self._evaluate(w, ok, data, result.error, message, digest, check, now)
        w.history.append((check, now, ok, short, escalation is not None, duration_ms))
        self._mark(w, w.chunk_of(check))
        if escalation is not None:
            body, extra = escalation
            self._escalate(w, check, ok, short, body, extra, now)

    def _evaluate(self, w, ok, data, error, message, digest, check, now):
        """``(body, extra lines)`` when this check escalates, else None."""
        strategy = w.notify_when
        body = _result_line(data) if ok else f"Error: {message}"
        if strategy == "summary":
            if ok:
                text = _det.encode(data).decode() if data is not None else "null"
                value = data if len(text) <= BATCH_ENTRY_CHARS else _cut(text, BATCH_ENTRY_CHARS)
                w.batch.append({"check": check, "result": value})
            else:
                w.batch.append({"check": check, "error": _cut(message, BATCH_ENTRY_CHARS)})
            size = int(w.notify_config.get("batch_size", DEFAULT_BATCH_SIZE))
            if len(w.batch) < size:
                return None
            batch, w.batch = w.batch, []
            text = json.dumps(batch, default=str, ensure_ascii=False)
            if len(text) > NOTIFY_SUMMARY_CHARS:
                text = f"{text[:NOTIFY_SUMMARY_CHARS]}... ({len(text)} chars total)"
            return f"Summary ({len(batch)} checks): {text}", []
        if strategy == "always":
            if self._cooling(w, now):
                w.suppressed_count += 1
                w.suppressed_since += 1
                return None
            return body, []
        # on_change / on_error / on_threshold: a debounced state machine.
        if strategy == "on_change":
            observed = digest
        elif strategy == "on_error":
            observed = "ok" if ok else "error"
        else:
            target = data if ok else {"error": error}
            observed = "true" if w.expr is not None and w.expr.evaluate(target) else "false"
        if w.confirmed is None:  # on_change's first check: the baseline, at once
            w.confirmed = observed
        elif observed == w.confirmed:
            w.candidate, w.candidate_count = None, 0
        else:
            if observed == w.candidate:
                w.candidate_count += 1
            else:
                w.candidate, w.candidate_count = observed, 1
            if w.candidate_count >= w.debounce:
                w.confirmed = observed
                w.candidate, w.candidate_count = None, 0
        if w.confirmed == w.notified:
            w.held = None
            return None
        if strategy == "on_threshold" and w.confirmed == "false":
            w.notified, w.held = "false", None  # re-armed, silently
            return None
        if self._cooling(w, now):
            if w.held != w.confirmed:
                w.held = w.confirmed
                w.suppressed_count += 1
                w.suppressed_since += 1
            return None
        extra: list[str] = []
        if strategy == "on_change" and w.notified is None:
            extra.append("Baseline (first check): you will be notified when the result changes.")
        elif strategy == "on_error" and w.confirmed == "ok":
            extra.append(f"Recovered after {w.last_error_run} failed check(s).")
        elif strategy == "on_threshold":
            extra.append(f"Condition met: {w.notify_config.get('expression', '')}")
        w.notified, w.held = w.confirmed, None
        return body, extra

    def _cooling(self, w: Watcher, now: float) -> bool:
        cooldown = w.cooldown
        return (
            cooldown > 0
            and w.last_escalation_at is not None
            and now - w.last_escalation_at < cooldown
        )

    def _escalate(self, w, check, ok, short, body, extra, now) -> None:
        w.notification_count += 1
        w.last_escalation_at = now
        if w.suppressed_since:
            extra = [
                *extra,
                f"{w.suppressed_since} earlier escalation(s) held back by the cooldown "
                f"({_num(w.cooldown)}s).",
            ]
            w.suppressed_since = 0
        self.stats["escalations"] += 1
        event = {
            "watcher_id": w.id,
            "what": "escalated",
            "label": w.label,
            "tool_name": w.tool,
            "notify_when": w.notify_when,
            "check": check,
            "notification_count": w.notification_count,
            "ok": ok,
            ("result" if ok else "error"): short,
        }
        text = notification_text(w, check, body, extra)
        channel = w.notify_config.get("output_channel")
        if channel and self.notify is not None:  # escalations go to a channel, not the session
            self._post(w.session_id, event)
            self.nursery.start_soon(
                self._to_channel, w.session_id, w.owner, channel, text,
                w.notify_config.get("output_config") or {},
            )  # fmt: skip
            return
        self._post(w.session_id, event, text, w.id)

    async def _to_channel(self, session_id, owner, channel, text, output_config) -> None:
        try:
            await self.notify(
                session_id, owner, channel, text, output_config=output_config, source="watcher",
                truncate=True,
            )  # fmt: skip
        except Exception:  # the notifier already fell back to the session where it could
            log.warning("watcher escalation to channel %s failed", channel, exc_info=True)

    # -- delivery --

    def _lifecycle(self, w: Watcher, what: str) -> dict[str, Any]:
        return {
            "watcher_id": w.id,
            "what": what,
            "status": w.state,
            "label": w.label,
            "tool_name": w.tool,
            "notify_when": w.notify_when,
            "interval": _num(w.interval),
        }

    def _post(
        self,
        session_id: str,
        event: dict[str, Any],
        text: str | None = None,
        watcher_id: str | None = None,
    ) -> None:
        """Queue an event (and a notification) for the session; sent after ``BATCH_WINDOW``."""
        box = self._outbox.get(session_id)
        if box is None:
            box = self._outbox[session_id] = _Outbox()
            self.nursery.start_soon(self._deliver, session_id, name=f"watch notify {session_id}")
        box.events.append(event)
        if text is not None:
            box.texts.append(text)
            box.ids.append(watcher_id)

    async def _deliver(self, session_id: str) -> None:
        await trio.sleep(BATCH_WINDOW)
        box = self._outbox.pop(session_id, None)
        if box is not None:
            with trio.CancelScope(shield=True):
                await self._send(session_id, box)

    async def _send(self, session_id: str, box: _Outbox) -> None:
        try:
            for event in box.events:
                await self.publish(session_id, Publish(event="watcher_update", payload=event))
            if box.texts:
                await self.publish(
                    session_id,
                    Inject(
                        source="notification",
                        content="\n\n".join(box.texts),
                        payload={"watcher_id": box.ids[0], "watcher_ids": list(box.ids)},
                    ),
                )
        except Exception:
            log.warning("watcher notification for session %s was not delivered", session_id)

    # -- persistence --

    def _mark(self, w: Watcher, chunk: int | None = None) -> None:
        self._dirty.add(w.id)
        if chunk is not None:
            self._dirty_chunks.add((w.id, chunk))
        if not self._dirty_event.is_set():
            self._dirty_event.set()

    async def _save_now(self, w: Watcher) -> None:
        """Write one watcher's state through (start, pause, resume)."""
        async with self._write_lock:
            self._dirty.discard(w.id)
            await self.store.kv_put(NAMESPACE, [(w.id, w.to_state(), None)])

    async def _persist_loop(self) -> None:
        while True:
            await self._dirty_event.wait()
            await trio.sleep(self.persist_interval)  # gather a window's worth of checks
            self._dirty_event = trio.Event()
            try:
                await self._flush()
            except Exception:
                log.exception("flushing watchers failed; retrying in %ss", self.persist_interval)
                self._dirty_event.set()

    async def _flush(self) -> None:
        """Write every dirty watcher and history chunk, in one ``kv_put``."""
        async with self._write_lock:
            dirty, self._dirty = self._dirty, set()
            chunks, self._dirty_chunks = self._dirty_chunks, set()
            items: list[tuple[str, dict[str, Any], None]] = []
            for wid in dirty:
                watcher = self.watchers.get(wid)
                if watcher is not None:
                    items.append((wid, watcher.to_state(), None))
            for wid, chunk in chunks:
                watcher = self.watchers.get(wid)
                if watcher is not None:
                    entries = watcher.chunk_entries(chunk)
                    items.append((f"{wid}/h{chunk:02d}", {"entries": entries}, None))
            if not items:
                return
            try:
                await self.store.kv_put(NAMESPACE, items)
            except BaseException:
                self._dirty |= dirty
                self._dirty_chunks |= chunks
                raise
            self.stats["flushes"] += 1
            self.stats["flushed_items"] += len(items)


# -- validation --------------------------------------------------------------------------------


def validate_spec(
    tool: str,
    params: Any,
    interval: Any,
    label: Any,
    notify_when: Any,
    notify_config: Any,
) -> tuple[dict[str, Any], Expr | None]:
    """Check a watcher's spec; returns the normalized ``notify_config`` and the compiled
    expression (on_threshold).

    Raises:
        InvalidArgument: a value out of bounds (``field`` names it).
        LimitExceeded: ``params`` is too large.
        ExprError: the expression does not compile (with its ``position``).
    """
    if not isinstance(tool, str) or not 0 < len(tool) <= MAX_TOOL_CHARS:
        raise InvalidArgument(f"tool must be a name of 1-{MAX_TOOL_CHARS} characters", "tool")
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        raise InvalidArgument("interval must be a number of seconds", field="interval")
    if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        raise InvalidArgument(
            f"interval must be from {MIN_INTERVAL:g} to {MAX_INTERVAL:g} seconds, got {interval}",
            field="interval",
        )
    if not isinstance(label, str) or len(label) > MAX_LABEL_CHARS:
        raise InvalidArgument(f"label must be at most {MAX_LABEL_CHARS} characters", "label")
    if not isinstance(params, dict):
        raise InvalidArgument("params must be an object", field="params")
    try:
        size = len(msgspec.json.encode(params))
    except (TypeError, msgspec.EncodeError):
        raise InvalidArgument("params must be plain JSON", field="params") from None
    if size > MAX_PARAMS_BYTES:
        raise LimitExceeded(
            f"params are {size} bytes of JSON (limit {MAX_PARAMS_BYTES})", field="params"
        )
    if notify_when not in STRATEGIES:
        raise InvalidArgument(
            f"notify_when must be one of {', '.join(STRATEGIES)}, got {notify_when!r}",
            field="notify_when",
        )
    if not isinstance(notify_config, dict):
        raise InvalidArgument("notify_config must be an object", field="notify_config")
    for key in notify_config:
        if key not in CONFIG_KEYS:
            raise InvalidArgument(
                f"notify_config has no option {key!r} (known: {', '.join(CONFIG_KEYS)})",
                field=f"notify_config.{key}",
            )
    config: dict[str, Any] = {}
    expr: Expr | None = None
    expression = notify_config.get("expression")
    if notify_when == "on_threshold":
        if not isinstance(expression, str) or not expression.strip():
            raise InvalidArgument(
                "on_threshold needs notify_config.expression (e.g. result.count > 100)",
                field="notify_config.expression",
            )
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise InvalidArgument(
                f"expression is longer than {MAX_EXPRESSION_CHARS} characters",
                field="notify_config.expression",
            )
        expr = compile_expr(expression)  # ExprError names the position
        config["expression"] = expression
    elif expression is not None:
        raise InvalidArgument(
            "notify_config.expression applies to on_threshold only",
            field="notify_config.expression",
        )
    batch_size = notify_config.get("batch_size")
    if notify_when == "summary":
        batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        _check_int(batch_size, 1, MAX_BATCH_SIZE, "notify_config.batch_size")
        config["batch_size"] = batch_size
    elif batch_size is not None:
        raise InvalidArgument(
            "notify_config.batch_size applies to summary only", field="notify_config.batch_size"
        )
    debounce = notify_config.get("debounce")
    if debounce is not None:
        if notify_when not in ("on_change", "on_error", "on_threshold"):
            raise InvalidArgument(
                "notify_config.debounce applies to on_change, on_error and on_threshold",
                field="notify_config.debounce",
            )
        _check_int(debounce, 1, MAX_DEBOUNCE, "notify_config.debounce")
        if debounce > 1:
            config["debounce"] = debounce
    cooldown = notify_config.get("cooldown_seconds")
    if cooldown is not None:
        if notify_when == "summary":
            raise InvalidArgument(
                "notify_config.cooldown_seconds does not apply to summary (use batch_size)",
                field="notify_config.cooldown_seconds",
            )
        if (
            isinstance(cooldown, bool)
            or not isinstance(cooldown, int | float)
            or not 0 <= cooldown <= MAX_COOLDOWN_SECONDS
        ):
            raise InvalidArgument(
                f"notify_config.cooldown_seconds must be from 0 to {MAX_COOLDOWN_SECONDS:g}",
                field="notify_config.cooldown_seconds",
            )
        if cooldown > 0:
            config["cooldown_seconds"] = _num(float(cooldown))
    channel = notify_config.get("output_channel", "llm_notification")
    if not isinstance(channel, str) or not 0 < len(channel) <= 64:
        raise InvalidArgument("output_channel must be a channel name", field="output_channel")
    if channel != "llm_notification":
        config["output_channel"] = channel
        output_config = notify_config.get("output_config") or {}
        if not isinstance(output_config, dict):
            raise InvalidArgument("output_config must be an object", field="output_config")
        if output_config:
            config["output_config"] = output_config
    return config, expr


#: Fields that change on every call without the answer changing (timings, response dates);
#: ``on_change`` ignores them, or every check of an HTTP endpoint would look like a change.
VOLATILE_KEYS = frozenset({"elapsed_ms"})
VOLATILE_HEADERS = frozenset({"date", "age", "expires", "x-request-id", "x-runtime"})


def stable_view(data: Any) -> Any:
    """``data`` without its volatile fields, for change detection."""
    if not isinstance(data, dict):
        return data
    view = {k: v for k, v in data.items() if k not in VOLATILE_KEYS}
    headers = view.get("headers")
    if isinstance(headers, dict):
        view["headers"] = {k: v for k, v in headers.items() if k.lower() not in VOLATILE_HEADERS}
    return view


def _check_int(value: Any, low: int, high: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer from {low} to {high}", field=name)
