"""``turnstile sessions``, ``turnstile jobs`` and ``turnstile watchers``: what an operator does
without the console, as HTTP clients of a running node.

Each command is one or two requests to the node's API (``docs/protocol.md``, ``/openapi.json``)
with a user's bearer token, so it sees and changes exactly what that user could over HTTP:

* ``sessions`` lists the user's sessions;
* ``jobs [list] [--session S] [--state STATE]`` lists the scheduled jobs, ``jobs show JOB`` one
  with its run records, ``jobs pause|resume|cancel JOB`` change one;
* ``watchers [list] [--session S]`` lists the watchers, ``watchers show W`` one with its recent
  checks, ``watchers pause|resume|stop W`` change one.

Output is a table for people, or with ``--json`` the node's JSON answer as it is (indented),
for scripts. Exit status, as every ``turnstile`` command: 0 done; 2 the command line is wrong
or the node refused the request (a 4xx: a bad token, nothing by that id, a bad value; the
node's own message is printed, with the field it names); 1 the node could not be reached or
failed (a 5xx, a timeout). Messages go to stderr.

The module names no feature's code: it speaks to the node's HTTP API only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any, TextIO

import httpx

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "NodeClient",
    "NodeError",
    "cell",
    "reason",
    "run_jobs",
    "run_sessions",
    "run_watchers",
    "table",
    "when",
]

#: Done.
EXIT_OK = 0
#: The node could not be reached, or failed (5xx).
EXIT_FAILED = 1
#: A wrong command line, or a request the node refused (4xx).
EXIT_USAGE = 2

#: Longest value shown in a table cell; ``--json`` shows everything.
MAX_CELL = 60


class NodeError(Exception):
    """A request that did not succeed, with the exit status it means.

    Attributes:
        status: ``EXIT_USAGE`` (refused by the node, or a wrong command line) or
            ``EXIT_FAILED`` (unreachable, or it failed).
    """

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NodeClient:
    """One node's HTTP API, for one token.

    Args:
        url: the node's base URL (``http://127.0.0.1:8765``).
        token: the user's bearer token.
        transport: an httpx transport (tests); None talks to ``url`` over the network.
    """

    def __init__(self, url: str, token: str, transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
            timeout=30.0,
        )

    def close(self) -> None:
        self._http.close()

    def request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        """The JSON answer of ``method path`` (None for an answer without a body).

        Raises:
            NodeError: no connection, or an error answer (its status, code, message, field).
        """
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(method, path, params=query, json=body)
        except httpx.ConnectError as exc:
            raise NodeError(f"cannot reach the node at {self.url}: {reason(exc)}", 1) from None
        except httpx.TimeoutException:
            raise NodeError(f"the node at {self.url} did not answer in time", 1) from None
        except httpx.HTTPError as exc:
            raise NodeError(f"request to {self.url} failed: {exc}", 1) from None
        if response.is_success:
            return response.json() if response.content else None
        status = EXIT_USAGE if response.status_code < 500 else EXIT_FAILED
        raise NodeError(_error_text(response), status)


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def reason(exc: Exception) -> str:
    """Why a connection failed, in a few words."""
    text = str(exc)
    return "connection refused" if "refused" in text.lower() else text or type(exc).__name__


def _error_text(response: httpx.Response) -> str:
    """``<status> <code>: <message> (field <field>)`` from the gateway's error body."""
    try:
        error = response.json()["error"]
        text = f"{error['code']}: {error['message']}"
        if error.get("field"):
            text += f" (field {error['field']})"
    except (ValueError, KeyError, TypeError):
        text = response.text.strip()[:200] or response.reason_phrase
    return f"{response.status_code} {text}"


# ---- rendering ------------------------------------------------------------------------------


def when(value: str | None) -> str:
    """An ISO time from the node as ``YYYY-MM-DD HH:MM`` (UTC); ``-`` for none."""
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return value


def cell(value: Any) -> str:
    """``value`` as one line of at most ``MAX_CELL`` characters; ``-`` for nothing."""
    if value is None or value == "":
        return "-"
    text = " ".join(str(value).split())  # one line: no newlines or tabs in a table
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Collection[int] = ()
) -> list[str]:
    """Lines of a plain text table; columns in ``right`` are right-aligned."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(r) for r in cells)]


def _print_table(out: TextIO, headers: Sequence[str], rows: list, right=()) -> None:
    for line in table(headers, rows, right):
        print(line, file=out)


# ---- sessions -------------------------------------------------------------------------------


def _sessions(client: NodeClient, args: Any, out: TextIO) -> Any:
    body = client.request("GET", "/sessions", params={"limit": 1000})
    if args.json:
        return body
    sessions = body["sessions"]
    if not sessions:
        print("no sessions", file=out)
        return None
    rows = [
        [
            s["id"],
            s.get("status"),
            s.get("queued"),
            s["policy"],
            when(s.get("recall_trigger_at")) if s.get("has_recall") else "-",
            s["last_seq"],
            when(s["updated_at"]),
        ]
        for s in sessions
    ]
    headers = ["SESSION", "STATUS", "QUEUED", "POLICY", "RECALL AT", "LAST SEQ", "UPDATED"]
    _print_table(out, headers, rows, right={2, 5})
    return None


# ---- jobs -----------------------------------------------------------------------------------


def _job_schedule(job: dict[str, Any]) -> str:
    schedule = (job.get("spec") or {}).get("schedule") or {}
    if schedule.get("type") == "cron":
        return f"cron {schedule.get('cron')} {schedule.get('timezone') or ''}".strip()
    if schedule.get("type") == "interval":
        return f"every {schedule.get('interval_seconds'):g}s"
    if schedule.get("type") == "once":
        return f"once {when(schedule.get('run_at'))}"
    return schedule.get("type") or "-"


def _job_label(job: dict[str, Any]) -> str:
    spec = job.get("spec") or {}
    return spec.get("label") or (spec.get("deliver") or {}).get("prompt") or ""


def _job_rows(jobs: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            j["id"],
            j["session_id"],
            j["kind"],
            j["state"],
            _job_schedule(j),
            when(j["next_fire_at"]),
            j["run_count"],
            _job_label(j),
        ]
        for j in jobs
    ]


_JOB_HEADERS = ["JOB", "SESSION", "KIND", "STATE", "SCHEDULE", "NEXT RUN", "RUNS", "LABEL"]


def _jobs(client: NodeClient, args: Any, out: TextIO) -> Any:
    action = args.action
    if action == "list":
        body = client.request("GET", "/jobs", params={"session": args.session, "state": args.state})
        if args.json:
            return body
        if not body["jobs"]:
            print("no jobs", file=out)
            return None
        _print_table(out, _JOB_HEADERS, _job_rows(body["jobs"]), right={6})
        return None
    if action == "show":
        body = client.request("GET", f"/jobs/{args.id}")
        if args.json:
            return body
        _print_table(out, _JOB_HEADERS, _job_rows([body["job"]]), right={6})
        runs = body["runs"]
        if not runs:
            print("no runs yet", file=out)
            return None
        print(file=out)
        rows = [
            [r["id"], when(r["scheduled_for"]), r["state"], r["input_id"], when(r["updated_at"])]
            for r in runs
        ]
        _print_table(out, ["RUN", "SCHEDULED FOR", "STATE", "INPUT", "UPDATED"], rows, {0, 3})
        return None
    body = client.request("POST", f"/jobs/{args.id}/{action}")  # pause, resume, cancel
    if args.json:
        return body
    print(f"job {body['id']} is {body['state']}", file=out)
    return None


# ---- watchers -------------------------------------------------------------------------------


def _watcher_rows(watchers: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            w["watcher_id"],
            w["session_id"],
            w["tool_name"],
            w["status"],
            f"{w['interval']:g}s",
            w["notify_when"],
            w["check_count"],
            when(w["last_check_at"]),
            when(w["next_check_at"]),
            w["label"],
        ]
        for w in watchers
    ]


_WATCHER_HEADERS = [
    "WATCHER",
    "SESSION",
    "TOOL",
    "STATUS",
    "EVERY",
    "NOTIFY",
    "CHECKS",
    "LAST CHECK",
    "NEXT CHECK",
    "LABEL",
]


def _watchers(client: NodeClient, args: Any, out: TextIO) -> Any:
    action = args.action
    if action == "list":
        path = "/watchers" if args.session is None else f"/sessions/{args.session}/watchers"
        body = client.request("GET", path)
        if args.json:
            return body
        if not body["watchers"]:
            print("no watchers", file=out)
            return None
        _print_table(out, _WATCHER_HEADERS, _watcher_rows(body["watchers"]), right={6})
        print(f"{body['running']} running, {body['paused']} paused", file=out)
        return None
    if action == "show":
        body = client.request("GET", f"/watchers/{args.id}")
        if args.json:
            return body
        _print_table(out, _WATCHER_HEADERS, _watcher_rows([body]), right={6})
        history = body["recent_history"]
        if history:
            print(file=out)
            rows = [
                [
                    c["check"],
                    when(c["at"]),
                    "ok" if c["ok"] else "error",
                    "yes" if c["escalated"] else "no",
                    c.get("result", c.get("error")),
                ]
                for c in history
            ]
            _print_table(out, ["CHECK", "AT", "OUTCOME", "ESCALATED", "RESULT"], rows, {0})
        return None
    method, path = {
        "pause": ("POST", f"/watchers/{args.id}/pause"),
        "resume": ("POST", f"/watchers/{args.id}/resume"),
        "stop": ("DELETE", f"/watchers/{args.id}"),
    }[action]
    body = client.request(method, path)
    if args.json:
        return body
    print(f"watcher {body['watcher_id']} is {body['status']}", file=out)
    return None


# ---- running --------------------------------------------------------------------------------


def _run(
    name: str,
    command: Callable[[NodeClient, Any, TextIO], Any],
    args: Any,
    token: str,
    out: TextIO | None,
    err: TextIO | None,
    transport: httpx.BaseTransport | None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    client = NodeClient(args.url, token, transport)
    try:
        answer = command(client, args, out)
    except NodeError as exc:
        print(f"turnstile {name}: {exc}", file=err)
        return exc.status
    finally:
        client.close()
    if answer is not None:
        print(json.dumps(answer, indent=2, ensure_ascii=False), file=out)
    return EXIT_OK


def run_sessions(args: Any, token: str, *, out=None, err=None, transport=None) -> int:
    """``turnstile sessions``; its exit status."""
    return _run("sessions", _sessions, args, token, out, err, transport)


def run_jobs(args: Any, token: str, *, out=None, err=None, transport=None) -> int:
    """``turnstile jobs [list|show|pause|resume|cancel]``; its exit status."""
    return _run(f"jobs {args.action}", _jobs, args, token, out, err, transport)


def run_watchers(args: Any, token: str, *, out=None, err=None, transport=None) -> int:
    """``turnstile watchers [list|show|pause|resume|stop]``; its exit status."""
    return _run(f"watchers {args.action}", _watchers, args, token, out, err, transport)
