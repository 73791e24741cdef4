"""``turnstile sessions``: your sessions (``GET /sessions``), a table or ``--json``."""

from __future__ import annotations

from typing import Any, TextIO

import msgspec

from turnstile.client import Client
from turnstile.client.commands._run import print_table, runner, when

__all__ = ["run_sessions"]

#: The most sessions one page of ``GET /sessions`` holds.
_PAGE = 1000

_HEADERS = ["SESSION", "STATUS", "QUEUED", "POLICY", "RECALL AT", "LAST SEQ", "UPDATED"]


async def _sessions(client: Client, args: Any, out: TextIO) -> Any:
    sessions = await client.list_sessions(limit=_PAGE)
    if args.json:  # the node's answer: it encodes the same Structs
        return {"sessions": msgspec.to_builtins(sessions)}
    if not sessions:
        print("no sessions", file=out)
        return None
    rows = [
        [
            s.id,
            s.status,
            s.queued,
            s.policy,
            when(s.recall_trigger_at) if s.has_recall else "-",
            s.last_seq,
            when(s.updated_at),
        ]
        for s in sessions
    ]
    print_table(out, _HEADERS, rows, right={2, 5})
    return None


#: ``turnstile sessions``; its exit status (``_run.run``).
run_sessions = runner(lambda args: "sessions", _sessions)
