"""``turnstile jobs [list|show|pause|resume|cancel]``: your scheduled jobs (``/jobs``).

``list [--session S] [--state STATE]`` every session's jobs (or one's), ``show JOB`` one with
its run records, ``pause|resume|cancel JOB`` change one; a table, or ``--json``.
"""

from __future__ import annotations

from typing import Any, TextIO

from turnstile.client import Client
from turnstile.client.commands._run import print_table, runner, when

__all__ = ["run_jobs"]

_HEADERS = ["JOB", "SESSION", "KIND", "STATE", "SCHEDULE", "NEXT RUN", "RUNS", "LABEL"]
_RUN_HEADERS = ["RUN", "SCHEDULED FOR", "STATE", "INPUT", "UPDATED"]


def _schedule(job: dict[str, Any]) -> str:
    schedule = (job.get("spec") or {}).get("schedule") or {}
    if schedule.get("type") == "cron":
        return f"cron {schedule.get('cron')} {schedule.get('timezone') or ''}".strip()
    if schedule.get("type") == "interval":
        return f"every {schedule.get('interval_seconds'):g}s"
    if schedule.get("type") == "once":
        return f"once {when(schedule.get('run_at'))}"
    return schedule.get("type") or "-"


def _label(job: dict[str, Any]) -> str:
    spec = job.get("spec") or {}
    return spec.get("label") or (spec.get("deliver") or {}).get("prompt") or ""


def _rows(jobs: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            j["id"],
            j["session_id"],
            j["kind"],
            j["state"],
            _schedule(j),
            when(j["next_fire_at"]),
            j["run_count"],
            _label(j),
        ]
        for j in jobs
    ]


async def _jobs(client: Client, args: Any, out: TextIO) -> Any:
    action = args.action
    if action == "list":
        jobs = await client.jobs(session_id=args.session, state=args.state)
        if args.json:
            return {"jobs": jobs}  # the node's answer: its one field
        if not jobs:
            print("no jobs", file=out)
            return None
        print_table(out, _HEADERS, _rows(jobs), right={6})
        return None
    if action == "show":
        body = await client.get_job(args.id)
        if args.json:
            return body
        print_table(out, _HEADERS, _rows([body["job"]]), right={6})
        runs = body["runs"]
        if not runs:
            print("no runs yet", file=out)
            return None
        print(file=out)
        rows = [
            [r["id"], when(r["scheduled_for"]), r["state"], r["input_id"], when(r["updated_at"])]
            for r in runs
        ]
        print_table(out, _RUN_HEADERS, rows, {0, 3})
        return None
    change = {"pause": client.pause_job, "resume": client.resume_job, "cancel": client.cancel_job}
    job = await change[action](args.id)
    if args.json:
        return job
    print(f"job {job['id']} is {job['state']}", file=out)
    return None


#: ``turnstile jobs [list|show|pause|resume|cancel]``; its exit status (``_run.run``).
run_jobs = runner(lambda args: f"jobs {args.action}", _jobs)
