"""The runtime's default system prompt: the execution primitives, and the time.

Every turn's ``TurnInput.system_prompt`` carries it, so every agent gets the same account of
what the runtime does for the model, whatever the agent is; an agent puts it first and adds its
own configured ``system_prompt`` after it (then the turn's ``system_segment``, e.g. a
heartbeat's checklist). As in the execution-primitives reference's EXECUTION PRIMITIVES
section, it says what ``run_parallel`` and the ``background_*`` tools are for and that results
arrive by themselves, so the model does not spend calls polling. The watcher, scheduler and
notification paragraphs appear only when the turn carries those tools' schemas (a group left
out of the turn stays reachable through ``tool_search``, and the prompt says so); a group turned
off (``hidden``: ``[execution] watchers = false``) is not mentioned at all, not even among what
arrives by itself.

The time section gives the session's time zone and the current time from the runtime's clock
(``Clock.now``), to the minute; it comes last so that the rest is a stable prefix for servers
that cache prompts.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from turnstile.runtime.clock import utc
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.timezones import resolve_timezone

__all__ = ["build_system_prompt", "session_timezone"]

_PRIMITIVES = """\
EXECUTION PRIMITIVES
These work with any tool, by its name (module.action, e.g. http.get):
- run_parallel: run up to 50 tool calls at once ({"name", "params"} each); results come back \
in the same order and one failure does not stop the others. Batch actions that take under \
about 30 seconds this way instead of calling them one after another.
- background_run: start a slow action (a download, a long command) and get a task_id at once; \
keep working meanwhile. background_status, background_result, background_cancel, \
background_list and background_wait manage tasks."""

_ARRIVE = """\
{kinds} arrive by themselves, as messages starting {markers}. Do not poll for them with \
{pollers}: carry on, and act on the message when it comes."""

_WATCHERS = """\
- watch_start: keep checking a tool every interval seconds in the background and hear only \
when it matters (notify_when: on_change, on_error, on_threshold, summary); watch_stop, \
watch_pause, watch_resume, watch_status, watch_list and watch_history manage watchers."""

_SCHEDULER = """\
- schedule_once, schedule_cron, remember: do something later or on a schedule ("in 5m", \
"tomorrow at 9am", a cron expression); when the job fires its output comes to this session \
(or to the output_channel you name). schedule_list, schedule_status, schedule_pause, \
schedule_resume and schedule_cancel manage jobs."""

_NOTIFY = """\
- send_notification: reach the user outside this conversation. The default channel is \
{channel!r}: use it for notifications unless the user names another."""

_NOTIFY_OUTPUTS = """\
 {outputs} deliver there too unless you give another output_channel{remember}."""

_DISCOVERY = """\
More tools than the ones listed are available: tool_search's description indexes them. Call \
tool_search with their names for their parameters, then run them with tool_run (or inside \
run_parallel or background_run)."""


def session_timezone(metadata: dict, default: str = "UTC") -> str:
    """The session's time zone: ``metadata["timezone"]`` when it names one, else ``default``
    (and UTC if that names none either)."""
    for name in (metadata.get("timezone"), default):
        if isinstance(name, str):
            try:
                resolve_timezone(name)
            except InvalidArgument:
                continue
            return name
    return "UTC"


def _listed(items: list[str], last: str) -> str:
    """``a``, ``a and b``, ``a, b and c`` (``last``: ``and`` or ``or``)."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def build_system_prompt(
    *,
    tools: Collection[str],
    now: datetime,
    timezone: str = "UTC",
    default_channel: str = "",
    hidden: Collection[str] = (),
) -> str:
    """The default system prompt for a turn.

    Args:
        tools: names of the tools whose schemas the turn carries.
        now: the current time (aware; naive is taken as UTC), from the runtime's clock.
        timezone: the session's time zone (IANA name, ``UTC`` or ``UTC±HH:MM``).
        default_channel: the output channel to name for notifications ('' for none).
        hidden: tools the model is not told of (a group turned off): with ``watch_start``
            among them nothing is said of watchers, with ``schedule_once`` nothing of jobs.

    Returns:
        the prompt text.

    Raises:
        InvalidArgument: ``timezone`` names no time zone.
    """
    parts = [_PRIMITIVES]
    if "watch_start" in tools:
        parts.append(_WATCHERS)
    if "schedule_once" in tools or "remember" in tools:
        parts.append(_SCHEDULER)
    watchers = "watch_start" not in hidden
    scheduler = "schedule_once" not in hidden
    if default_channel and "send_notification" in tools:
        notify = _NOTIFY.format(channel=default_channel)
        outputs = [name for name, shown in (("jobs", scheduler), ("watchers", watchers)) if shown]
        if outputs:
            remember = " (remember comes back here)" if scheduler else ""
            listed = _listed(outputs, "and")
            notify += _NOTIFY_OUTPUTS.format(outputs=listed.capitalize(), remember=remember)
        parts.append(notify)
    kinds, markers = ["Background results"], ["[BACKGROUND TASK COMPLETED]"]
    markers.append("[BACKGROUND TASK FAILED]")
    pollers = ["background_status", "background_wait"]
    if watchers:
        kinds.append("watcher updates")
        markers.append("[WATCHER UPDATE]")
        pollers.append("watch_status")
    if scheduler:
        kinds.append("scheduled jobs")
        markers.append("[SCHEDULED …]")
    parts.append(
        _ARRIVE.format(
            kinds=_listed(kinds, "and"),
            markers=_listed(markers, "or"),
            pollers=_listed(pollers, "or"),
        )
    )
    if "tool_search" in tools:
        parts.append(_DISCOVERY)
    when = utc(now)
    local = when.astimezone(resolve_timezone(timezone))
    clock = f"{local:%Y-%m-%d %H:%M} ({local:%A})"
    if timezone != "UTC":
        offset = f"{local:%z}"
        clock += f", UTC{offset[:3]}:{offset[3:5]}; {when:%Y-%m-%d %H:%M} UTC"
    parts.append(f"TIME\nSession time zone: {timezone}. Current time: {clock}.")
    return "\n".join(parts[:-1]) + "\n\n" + parts[-1]
