"""The scheduler's messages and limits: what a caller asks the ``SchedulerActor``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from msgspec import UNSET, UnsetType

from turnstile.actors.scheduling.cronexpr import CronSchedule
from turnstile.actors.scheduling.spec import (
    ActiveHours,
    JobSpec,
    MisfirePolicy,
    RecallSpec,
    Schedule,
)
from turnstile.runtime.codec import Message
from turnstile.runtime.errors import InvalidArgument

__all__ = [
    "MISFIRE_POLICIES",
    "AddJob",
    "Begin",
    "CancelJob",
    "PauseJob",
    "RescheduleJob",
    "ResumeJob",
    "SchedulerLimits",
    "validate_spec",
]

MISFIRE_POLICIES: tuple[MisfirePolicy, ...] = ("coalesce", "skip", "catch_up")


@dataclass(frozen=True)
class SchedulerLimits:
    """Bounds on scheduling.

    Attributes:
        max_jobs_per_session: active and paused jobs one session may have.
        min_interval_seconds: the shortest recurrence allowed.
        max_prompt_chars: the longest prompt a job may carry.
        restart_rate: overdue jobs fired per second after a restart.
    """

    max_jobs_per_session: int = 100
    min_interval_seconds: float = 60.0
    max_prompt_chars: int = 8000
    restart_rate: float = 500.0


class AddJob(Message, tag="add_job", kw_only=True):
    """Create a job and index it. Answers the stored ``Job``.

    Every ``JobSpec`` field is a field here too, under the same name, with the same meaning
    (see ``JobSpec``); the stored spec is built from them. The others say where and how:

    Attributes:
        session_id: the session its turns go to.
        kind: what sort of job (``"once"``, ``"cron"``, ``"recall"``…); the scheduler runs
            every kind alike.
        job_id: the job's id; default a random one.
        immediate: fire at once (the first occurrence is now), whatever the schedule says.
    """

    session_id: str
    kind: str
    schedule: Schedule
    deliver: dict[str, Any]
    label: str = ""
    misfire: str = "coalesce"
    misfire_grace_seconds: float = 60.0
    max_runs: int = 0
    jitter_seconds: float = 0.0
    job_id: str | None = None
    immediate: bool = False
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

    def spec(self) -> JobSpec:
        """The spec to store: this message's ``JobSpec`` fields."""
        return JobSpec(**{name: getattr(self, name) for name in JobSpec.__struct_fields__})


class RescheduleJob(Message, tag="reschedule_job", kw_only=True):
    """Move an active job's next occurrence; answers the stored ``Job``."""

    job_id: str
    next_fire_at: datetime
    session_id: str | None = None


class Begin(Message, tag="begin_scheduler", kw_only=True):
    """Start firing: the wheel runs (and, with several nodes, the look for jobs to take on).
    A scheduler spawned ``held`` fires nothing before it; the scheduling feature sends it in
    its ``open``, once every feature is ready. Answers None; a second one changes nothing."""


class CancelJob(Message, tag="cancel_job", kw_only=True):
    """Cancel a job; answers the stored ``Job``. ``session_id`` must own it when given."""

    job_id: str
    session_id: str | None = None


class PauseJob(Message, tag="pause_job", kw_only=True):
    """Pause an active job: it fires nothing until resumed, and keeps its runs and count.
    Answers the stored ``Job`` (a paused one as it is). ``session_id`` must own it when given.

    Raises:
        ConflictError: the job is done (``completed`` or ``cancelled``).
    """

    job_id: str
    session_id: str | None = None


class ResumeJob(Message, tag="resume_job", kw_only=True):
    """Resume a paused job; answers the stored ``Job`` (an active one as it is). What fell
    due while it was paused is not run: a recurring job goes on from its next occurrence after
    now, a one-off job whose time passed fires at once.

    Raises:
        ConflictError: the job is done (``completed`` or ``cancelled``).
    """

    job_id: str
    session_id: str | None = None


def validate_spec(spec: JobSpec, limits: SchedulerLimits, now: datetime) -> None:
    """Check the bounds of ``JobSpec`` (which only decoding checks) and the scheduler's
    ``limits`` at ``now``.

    Raises:
        InvalidArgument: naming the field and the rule.
    """
    schedule = spec.schedule
    if spec.misfire not in MISFIRE_POLICIES:
        raise InvalidArgument(
            f"misfire must be one of {', '.join(MISFIRE_POLICIES)}, got {spec.misfire!r}",
            field="misfire",
        )
    if spec.max_runs < 0:
        raise InvalidArgument("max_runs must be >= 0", field="max_runs")
    if not 0 <= spec.jitter_seconds <= 3600:
        raise InvalidArgument("jitter_seconds must be from 0 to 3600", field="jitter_seconds")
    if not 0 <= spec.misfire_grace_seconds <= 86400:
        raise InvalidArgument(
            "misfire_grace_seconds must be from 0 to 86400", field="misfire_grace_seconds"
        )
    if len(spec.prompt) > limits.max_prompt_chars:
        raise InvalidArgument(
            f"prompt is longer than {limits.max_prompt_chars} characters", field="prompt"
        )
    if schedule.type == "once" and schedule.run_at is None:
        raise InvalidArgument("a once schedule needs run_at", field="when")
    if schedule.type == "interval":
        seconds = schedule.interval_seconds or 0
        if not limits.min_interval_seconds <= seconds <= 366 * 86400:
            raise InvalidArgument(
                f"interval must be at least {limits.min_interval_seconds:g} seconds",
                field="interval_seconds",
            )
    if schedule.type == "cron":
        cron = CronSchedule(schedule.cron or "", schedule.timezone)  # raises InvalidArgument
        first = cron.next_fire(now)
        second = cron.next_fire(first)
        if (second - first).total_seconds() < limits.min_interval_seconds:
            raise InvalidArgument(
                f"cron fires more often than every {limits.min_interval_seconds:g} seconds",
                field="cron",
            )
