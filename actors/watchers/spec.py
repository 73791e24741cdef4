"""What a watcher is asked to do, and the bounds on it: the messages and ``validate_spec``.

This module holds the watcher actor's messages (``StartWatcher`` and the rest), the strategy
names, every bound a spec is checked against, ``validate_spec`` itself, and the two timing rules
that follow from the interval: ``backoff_delay`` and ``check_timeout``. It is separate from the
actor so that what a caller may ask for can be read, imported and tested without the actor,
its timer wheel and its persistence.

**Backoff.** While the tool fails, checks slow down: ``interval × 2^k`` after ``k``
consecutive failures, capped at ``10 × interval`` and at one hour (never below the
interval). The first success returns to the normal interval.
"""

from __future__ import annotations

from typing import Any

import msgspec

from turnstile.actors.watchers.safeexpr import MAX_EXPRESSION_CHARS, Expr, compile_expr
from turnstile.runtime.codec import Message
from turnstile.runtime.errors import InvalidArgument, LimitExceeded

STRATEGIES = ("on_change", "on_error", "on_threshold", "summary", "always")
MIN_INTERVAL = 5.0
MAX_INTERVAL = 3600.0
DEFAULT_INTERVAL = 30.0
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
CONFIG_KEYS = (
    "expression",
    "batch_size",
    "debounce",
    "cooldown_seconds",
    "output_channel",
    "output_config",
)


def backoff_delay(interval: float, error_streak: int) -> float:
    """Seconds until the next check after ``error_streak`` consecutive failures."""
    if error_streak <= 0:
        return interval
    cap = max(interval, min(interval * BACKOFF_FACTOR_CAP, BACKOFF_SECONDS_CAP))
    return min(interval * 2.0 ** min(error_streak, 32), cap)


def check_timeout(interval: float) -> float:
    """How long one check may run: the interval, but at least 30 s and at most 5 min."""
    return min(300.0, max(30.0, interval))


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


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


def _check_int(value: Any, low: int, high: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer from {low} to {high}", field=name)
