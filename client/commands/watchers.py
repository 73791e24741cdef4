"""``turnstile watchers [list|show|pause|resume|stop]``: your watchers (``/watchers``).

``list [--session S]`` every session's watchers (or one's), ``show W`` one with its recent
checks, ``pause|resume|stop W`` change one; a table, or ``--json``.
"""

from __future__ import annotations

from typing import Any, TextIO

from turnstile.client import Client
from turnstile.client.commands._run import print_table, runner, when

__all__ = ["run_watchers"]

_HEADERS = [
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
_CHECK_HEADERS = ["CHECK", "AT", "OUTCOME", "ESCALATED", "RESULT"]


def _rows(watchers: list[dict[str, Any]]) -> list[list[Any]]:
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


def _check_rows(checks: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            c["check"],
            when(c["at"]),
            "ok" if c["ok"] else "error",
            "yes" if c["escalated"] else "no",
            c.get("result", c.get("error")),
        ]
        for c in checks
    ]


async def _watchers(client: Client, args: Any, out: TextIO) -> Any:
    action = args.action
    if action == "list":
        body = await client.watchers(args.session)
        if args.json:
            return body
        if not body["watchers"]:
            print("no watchers", file=out)
            return None
        print_table(out, _HEADERS, _rows(body["watchers"]), right={6})
        print(f"{body['running']} running, {body['paused']} paused", file=out)
        return None
    if action == "show":
        watcher = await client.get_watcher(args.id)
        if args.json:
            return watcher
        print_table(out, _HEADERS, _rows([watcher]), right={6})
        if watcher["recent_history"]:
            print(file=out)
            print_table(out, _CHECK_HEADERS, _check_rows(watcher["recent_history"]), {0})
        return None
    change = {
        "pause": client.pause_watcher,
        "resume": client.resume_watcher,
        "stop": client.stop_watcher,
    }
    watcher = await change[action](args.id)
    if args.json:
        return watcher
    print(f"watcher {watcher['watcher_id']} is {watcher['status']}", file=out)
    return None


#: ``turnstile watchers [list|show|pause|resume|stop]``; its exit status (``_run.run``).
run_watchers = runner(lambda args: f"watchers {args.action}", _watchers)
