"""What a check's result does: the strategies, debounce, cooldown and the notification.

``EscalationMixin`` is the half of ``WatcherActor`` that turns a check's ``ToolResult`` into
the watcher's new state and, when the strategy says so, an escalation: the notification text,
the ``watcher_update`` event, and their delivery to the session (batched per session over
``BATCH_WINDOW``) or to a notifier channel. It is separate from the actor so that the
strategies can be read in one place, apart from scheduling and persistence. The mixin uses the
actor's ``clock``, ``stats``, ``nursery``, ``publish``, ``notify``, ``_outbox``, and
``PersistenceMixin._mark``.

The strategies:

* ``on_change`` (default) — the first check sets the baseline *and* notifies; afterwards a
  notification whenever the result differs from the last one notified (a stable hash of the
  JSON result; an error counts as a result of its own, so "starts failing" is a change).
* ``on_error`` — a notification when the tool fails, and one when it recovers. Nothing while
  all is well.
* ``on_threshold`` — ``notify_config.expression`` (``safeexpr.py``, compiled at start, so a
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

Only escalations reach the session, as the reference's text::

    [WATCHER UPDATE] watcher_id=a1b2c3d4e5f6, label="API health check", tool=http.get
    Check #42 (interval: 30s, 3 notification(s) so far, strategy: on_error)
    Error: Connection refused

sent with ``Inject(source="notification")`` — folded into the session's running turn, or a turn
of its own when the session is idle; escalations of one session within ``BATCH_WINDOW`` travel
as one ``Inject`` — plus a ``watcher_update`` event per escalation (and per start, pause,
resume and stop) for attached clients. A check itself costs no turn and no event.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import trio
from msgspec import UNSET

from turnstile.actors.sessions.actor import Inject, Publish
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.actors.watchers.base import WatcherBase, _Outbox
from turnstile.actors.watchers.events import WatcherUpdate
from turnstile.actors.watchers.spec import DEFAULT_BATCH_SIZE, _num
from turnstile.actors.watchers.state import Watcher
from turnstile.runtime import tracing

log = logging.getLogger("turnstile.watcher")

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

_det = msgspec.json.Encoder(order="deterministic")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


def notification_text(watcher: Watcher, check: int, body: str, extra: Sequence[str] = ()) -> str:
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


def _body(ok: bool, data: Any, message: str) -> str:
    """An escalation's body line: the result, or the error. Built only for a check that
    escalates: most checks do not, and the result's JSON is a check's largest string."""
    return _result_line(data) if ok else f"Error: {message}"


def _result_line(data: Any) -> str:
    text = json.dumps(data, default=str, ensure_ascii=False)
    if len(text) <= NOTIFY_RESULT_CHARS:
        return f"Result: {text}"
    return f"Result (truncated): {text[:NOTIFY_RESULT_CHARS]}... ({len(text)} chars total)"


class EscalationMixin(WatcherBase):
    """``WatcherActor``'s strategies and delivery. See the module docstring."""

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

    def _evaluate(
        self,
        w: Watcher,
        ok: bool,
        data: Any,
        error: dict[str, Any] | None,
        message: str,
        digest: str,
        check: int,
        now: float,
    ) -> tuple[str, list[str]] | None:
        """``(body, extra lines)`` when this check escalates, else None."""
        strategy = w.notify_when
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
            return _body(ok, data, message), []
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
        return _body(ok, data, message), extra

    def _cooling(self, w: Watcher, now: float) -> bool:
        cooldown = w.cooldown
        return (
            cooldown > 0
            and w.last_escalation_at is not None
            and now - w.last_escalation_at < cooldown
        )

    def _escalate(
        self,
        w: Watcher,
        check: int,
        ok: bool,
        short: str,
        body: str,
        extra: list[str],
        now: float,
    ) -> None:
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
        event = WatcherUpdate(
            watcher_id=w.id,
            what="escalated",
            label=w.label,
            tool_name=w.tool,
            notify_when=w.notify_when,
            check=check,
            notification_count=w.notification_count,
            ok=ok,
            result=short if ok else UNSET,
            error=UNSET if ok else short,
        )
        text = notification_text(w, check, body, extra)
        channel = w.notify_config.get("output_channel")
        if channel and self.notify is not None:  # escalations go to a channel, not the session
            self._post(w.session_id, event)
            self._tasks.start_soon(
                self._to_channel, self.notify, w.session_id, w.owner, channel, text,
                w.notify_config.get("output_config") or {},
            )  # fmt: skip
            return
        self._post(w.session_id, event, (w.id, text))

    async def _to_channel(
        self,
        notify: Callable[..., Awaitable[Any]],
        session_id: str,
        owner: str,
        channel: str,
        text: str,
        output_config: dict[str, Any],
    ) -> None:
        try:
            await notify(
                session_id, owner, channel, text, output_config=output_config, source="watcher",
                truncate=True,
            )  # fmt: skip
        except Exception:  # the notifier already fell back to the session where it could
            log.warning("watcher escalation to channel %s failed", channel, exc_info=True)

    # -- delivery --

    def _lifecycle(self, w: Watcher, what: str) -> WatcherUpdate:
        return WatcherUpdate(
            watcher_id=w.id,
            what=what,
            status=w.state,
            label=w.label,
            tool_name=w.tool,
            notify_when=w.notify_when,
            interval=_num(w.interval),
        )

    def _post(
        self,
        session_id: str,
        event: WatcherUpdate,
        notice: tuple[str, str] | None = None,
    ) -> None:
        """Queue an event (and a notification: the watcher's id and the text) for the session;
        sent after ``BATCH_WINDOW``."""
        box = self._outbox.get(session_id)
        if box is None:
            box = self._outbox[session_id] = _Outbox()
            self._tasks.start_soon(self._deliver, session_id, name=f"watch notify {session_id}")
        box.events.append(event)
        if notice is not None:
            watcher_id, text = notice
            box.texts.append(text)
            box.ids.append(watcher_id)
            if box.trace is None:
                box.trace = tracing.current_trace()

    async def _deliver(self, session_id: str) -> None:
        await trio.sleep(BATCH_WINDOW)
        box = self._outbox.pop(session_id, None)
        if box is not None:
            with trio.CancelScope(shield=True):
                await self._send(session_id, box)

    async def _send(self, session_id: str, box: _Outbox) -> None:
        try:
            for event in box.events:
                await self.publish(session_id, Publish(event=event))
            if box.texts:
                await self.publish(
                    session_id,
                    Inject(
                        source="notification",
                        content="\n\n".join(box.texts),
                        payload={"watcher_id": box.ids[0], "watcher_ids": list(box.ids)},
                        trace=box.trace,
                    ),
                )
        except Exception:
            log.warning("watcher notification for session %s was not delivered", session_id)
