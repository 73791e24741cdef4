"""A scheduler job's spec, typed: what the store keeps as the JSON ``spec`` of a ``Job``.

Every job the scheduling feature writes has the same base — its schedule, the turn input it
delivers, its label and firing options — and, depending on which tool made it, a few more
fields:

=======================================  ===================================================
written by                               extra fields
=======================================  ===================================================
``schedule_once``, ``schedule_cron``,     ``understood``
``remember``
``cron``                                 ``understood``, ``prompt_name``, ``prompt_version``,
                                         ``prompt_sha256``, ``prompt_text``
``schedule_check``                       ``instructions``, ``understood``, ``reference``
                                         (when given)
``schedule_recall``                      ``recall``
``set_heartbeat``                        ``heartbeat_of``, ``active_hours`` (null: all day),
                                         ``understood``
=======================================  ===================================================

It is one Struct, not a tagged union per kind: the stored JSON carries no tag, and the job
kinds overlap (``schedule_cron``, ``remember`` and the ``cron`` tool all make ``"cron"`` jobs,
with different extra fields). The extras are ``UNSET`` — absent from the JSON — unless their
writer sets them.

Compatibility: specs written before this Struct existed must keep reading, and new ones must
look the same to older readers. So ``msgspec.to_builtins(spec)`` writes what was written
before, key for key and in the same order (field order is key order: do not reorder, and add
new fields last, as ``UNSET`` or with a default): the base fields always, the extras only when
set. Every base field but ``schedule`` has a default, so a spec missing one still reads.

``deliver`` stays a dict: it is the template of the turn input's payload, copied as it is into
the session's inbox and read there by the session actor; its keys differ per writer, and
callers of ``AddJob`` may add their own. The few keys this feature reads back from it are the
properties of :class:`JobSpec` (``prompt``, ``action_type``, …), in this module only.

Read a job's spec with :func:`job_spec`, once per job, or straight from the stored JSON text
with :func:`decode_spec` (no dict in between: what the scheduler does): both raise
:class:`JobSpecError` when the stored JSON does not decode.

The pure functions of a spec's times live here too: :func:`next_occurrence` and
:func:`first_occurrence` of a ``Schedule``, :func:`in_active_hours` of an ``ActiveHours``. They
never read the clock (the scheduler passes ``now``), so ``MockClock`` drives them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from turnstile.actors.scheduling.cronexpr import CronSchedule, resolve_timezone
from turnstile.actors.scheduling.records import Job
from turnstile.runtime.clock import utc
from turnstile.runtime.errors import InvalidArgument, StoreError
from turnstile.runtime.store import unescape_json

__all__ = [
    "ActiveHours",
    "CallType",
    "HHMM",
    "JobSpec",
    "JobSpecError",
    "MisfirePolicy",
    "RecallSpec",
    "Schedule",
    "cron_of",
    "decode_spec",
    "first_occurrence",
    "in_active_hours",
    "job_spec",
    "next_occurrence",
]

#: What a job does with occurrences it missed (see ``actors.scheduling.actor``).
MisfirePolicy = Literal["coalesce", "skip", "catch_up"]
#: When a recall fires: at one instant, every ``interval_seconds``, or after the current turn.
CallType = Literal["once", "recurring", "immediate"]
#: A wall-clock time of day, ``"HH:MM"`` on 24 hours.
HHMM = Annotated[str, msgspec.Meta(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]


class JobSpecError(StoreError):
    """A job's stored spec does not decode as a :class:`JobSpec` (a row written by hand, by a
    newer version, or damaged). The scheduler skips such a job rather than fail for all.

    Attributes:
        job_id: the job whose spec it is.
    """

    code = "bad_job_spec"

    def __init__(self, job_id: str, why: str) -> None:
        super().__init__(f"job {job_id!r} has an unreadable spec: {why}")
        self.job_id = job_id


class Schedule(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """When a job fires: once at ``run_at``, every ``interval_seconds``, or by ``cron``.

    Attributes:
        type: which of the three it is.
        run_at: (once) the instant, aware.
        interval_seconds: (interval) seconds between occurrences.
        cron: (cron) a cron expression, read in ``timezone``.
        timezone: the IANA zone (or ``UTC±HH:MM``) a cron expression is read in.
    """

    type: Literal["once", "interval", "cron"]
    run_at: datetime | None = None
    interval_seconds: float | None = None
    cron: str | None = None
    timezone: str = "UTC"


class ActiveHours(msgspec.Struct, frozen=True, kw_only=True):
    """The daily window in which a heartbeat's turns run; outside it, occurrences are only
    recorded (``outside_active_hours``).

    Attributes:
        start: when the window opens, local wall time.
        end: when it closes; before ``start``, the window wraps past midnight (22:00–06:00);
            equal to ``start``, it lasts all day.
        timezone: the zone ``start`` and ``end`` are read in.
    """

    start: HHMM
    end: HHMM
    timezone: str = "UTC"


def next_occurrence(
    schedule: Schedule, after: datetime, cron: CronSchedule | None = None
) -> datetime | None:
    """The first occurrence strictly after ``after``, or None when there is none.

    Pass the job's own ``CronSchedule`` as ``cron``: it caches its croniter iterator, which
    makes the next-after-previous question (the one a job asks) nearly free.
    """
    if schedule.type == "once":
        return None
    if schedule.type == "interval":
        return after + timedelta(
            seconds=_needed(schedule, "interval_seconds", schedule.interval_seconds)
        )
    if cron is None:
        cron = cron_of(schedule)
    return cron.next_fire(after)


def cron_of(schedule: Schedule) -> CronSchedule:
    """The evaluator of a ``cron`` schedule.

    Raises:
        InvalidArgument: it has no expression (adding a job checks it has), or a bad one.
    """
    return CronSchedule(_needed(schedule, "cron", schedule.cron), schedule.timezone)


def first_occurrence(
    schedule: Schedule, now: datetime, cron: CronSchedule | None = None
) -> datetime:
    """When a new job first fires: at ``run_at`` (once), else the first occurrence after now."""
    if schedule.type == "once":
        return utc(_needed(schedule, "run_at", schedule.run_at))
    found = next_occurrence(schedule, now, cron)
    assert found is not None
    return found


_T = TypeVar("_T")


def _needed(schedule: Schedule, field: str, value: _T | None) -> _T:
    """``value``, ``schedule``'s ``field``, which its type needs (adding a job checks it).

    Raises:
        InvalidArgument: it is missing.
    """
    if value is None:
        raise InvalidArgument(f"a {schedule.type} schedule needs {field}", field=field)
    return value


def in_active_hours(window: ActiveHours, now: datetime) -> bool:
    """Whether ``now`` falls in ``window``.

    The window is read on the local wall clock of its timezone; ``end`` before ``start``
    wraps past midnight (22:00–06:00). ``start == end`` means all day.
    """
    local = now.astimezone(resolve_timezone(window.timezone or "UTC"))
    minutes = local.hour * 60 + local.minute
    start, end = _minutes(window.start), _minutes(window.end)
    if start == end:
        return True
    if start < end:
        return start <= minutes < end
    return minutes >= start or minutes < end


def _minutes(hhmm: str) -> int:
    hours, _, minutes = hhmm.partition(":")
    return int(hours) * 60 + int(minutes or 0)


class RecallSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A recall's own settings, as ``schedule_recall`` was given them (all four always stored).

    Attributes:
        call_type: ``once``, ``recurring`` or ``immediate``.
        interval_seconds: (recurring) seconds between triggers; None for the others.
        internal_comment: the short human-readable note.
        additional_context_message: the self-instruction the recall's turn is given.
    """

    call_type: CallType
    interval_seconds: int | None = None
    internal_comment: str = ""
    additional_context_message: str = ""


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A job's spec as stored; see the module docstring for who writes which fields.

    Attributes:
        schedule: when the job fires.
        deliver: the turn input's payload template (``source``, ``action_type``, ``prompt``
            and whatever the writer adds), copied into the input at each occurrence.
        label: a short name for lists and events; may be empty.
        misfire: what a late job does with the occurrences it missed.
        misfire_grace_seconds: how late an occurrence may be and still count as on time.
        max_runs: the job completes after this many deliveries; 0 means no limit.
        jitter_seconds: each occurrence is delayed by a stable pseudo-random amount up to this.
        instructions: (check) what to check or do, in full.
        heartbeat_of: (heartbeat) the key of the session the heartbeat belongs to, which may
            not be the one its turns run in (a dedicated ``<key>.heartbeat`` session).
        active_hours: (heartbeat) the window its turns run in; None when it runs all day.
        recall: (recall) the recall's settings.
        understood: how the time expression was read (``"every day at 09:00 UTC — next …"``).
        reference: (check) the PR, ticket or URL the check is about.
        prompt_name: (cron) the prompt's name in its session (``daily-monitor``).
        prompt_version: (cron) the version of that name's prompt text, from 1.
        prompt_sha256: (cron) the SHA-256 of the prompt text, hex.
        prompt_text: (cron) the prompt as given, without the trigger line.
    """

    schedule: Schedule
    deliver: dict[str, Any] = msgspec.field(default_factory=dict)
    label: str = ""
    misfire: MisfirePolicy = "coalesce"
    misfire_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 60.0
    max_runs: Annotated[int, msgspec.Meta(ge=0)] = 0
    jitter_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.0
    instructions: str | UnsetType = UNSET
    heartbeat_of: str | UnsetType = UNSET
    active_hours: ActiveHours | None | UnsetType = UNSET
    recall: RecallSpec | UnsetType = UNSET
    understood: str | UnsetType = UNSET
    reference: str | UnsetType = UNSET
    prompt_name: str | UnsetType = UNSET
    prompt_version: int | UnsetType = UNSET
    prompt_sha256: str | UnsetType = UNSET
    prompt_text: str | UnsetType = UNSET

    # -- what the scheduler reads back from ``deliver`` --

    @property
    def prompt(self) -> str:
        """The prompt the job delivers, or ``""`` (a ``tool_call`` may have none)."""
        return self.deliver.get("prompt") or ""

    @property
    def action_type(self) -> str | None:
        """``llm_prompt``, ``notification``, ``tool_call`` or ``heartbeat``; None if unsaid."""
        return self.deliver.get("action_type")

    @property
    def tool_name(self) -> str | None:
        """(tool_call) the tool the occurrence runs."""
        return self.deliver.get("tool_name")

    @property
    def output_channel(self) -> str:
        """Where the occurrence's output goes; ``llm_notification`` is into the session."""
        return self.deliver.get("output_channel", "llm_notification")

    @property
    def source(self) -> str | None:
        """The turn input's ``source`` (``schedule``, ``cron``, ``check``…), if the writer
        named one; the scheduler falls back on the job's kind."""
        return self.deliver.get("source")

    @property
    def instruction(self) -> str | None:
        """(recall) the self-instruction, kept in the run record too."""
        return self.deliver.get("instruction")

    def prompt_variables(self, job_id: str) -> dict[str, Any] | None:
        """(cron) The variables its trigger template (``cron.trigger@v1``:
        ``cron.render_trigger``) rendered the delivered prompt from, kept in each run record
        beside the rendered prompt (cron-session-binding.md): ``job_id``, ``name``,
        ``version``, ``prompt`` (the text as given). None for a job without a named prompt."""
        if not isinstance(self.prompt_name, str) or not isinstance(self.prompt_text, str):
            return None
        version = self.prompt_version if isinstance(self.prompt_version, int) else 1
        return {
            "job_id": job_id,
            "name": self.prompt_name,
            "version": version,
            "prompt": self.prompt_text,
        }


def job_spec(job: Job) -> JobSpec:
    """The spec of ``job``, decoded.

    Raises:
        JobSpecError: the stored spec does not decode (the message says where and why).
    """
    try:
        return msgspec.convert(job.spec, JobSpec)
    except msgspec.ValidationError as exc:
        raise JobSpecError(job.id, str(exc)) from None


_spec_decoder = msgspec.json.Decoder(JobSpec)


def decode_spec(job_id: str, text: str) -> JobSpec:
    """The spec of job ``job_id`` from its stored JSON ``text`` (``ActiveJob.spec``), decoded
    straight into the Struct: the same spec, and the same errors, as :func:`job_spec` of the
    row.

    Raises:
        JobSpecError: the text does not decode as a spec (the message says where and why).
    """
    try:
        return _spec_decoder.decode(unescape_json(text))
    except msgspec.DecodeError as exc:  # ValidationError included
        raise JobSpecError(job_id, str(exc)) from None
