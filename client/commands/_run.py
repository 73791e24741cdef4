"""What every client command shares: running it against the node with ``trio.run``, its exit
status from the client's error, and the tables it prints.

The client's errors carry the protocol's code and, over HTTP, the status
(``turnstile.client``'s ``TurnstileClientError``): a 4xx, or over the WebSocket a refusal
(``BadRequest``, ``Unauthorized``, ``NotFound`` …), exits ``EXIT_USAGE``; a 5xx, a failure of
the node's (``ServerError``) or no connection (``ConnectionLost``) exits ``EXIT_FAILED``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import datetime
from typing import Any, Protocol, TextIO

import httpx
import trio

from turnstile.client import (
    BadRequest,
    Client,
    Conflict,
    ConnectionLost,
    Forbidden,
    LimitExceeded,
    NotFound,
    PlacedElsewhere,
    TurnstileClientError,
    Unauthorized,
    open_client,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "MAX_CELL",
    "Command",
    "Runner",
    "UsageError",
    "cell",
    "describe",
    "exit_status",
    "print_table",
    "run",
    "runner",
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

#: A command: what to print as JSON (the node's answer, with ``--json``), or None when it
#: printed for people itself.
Command = Callable[[Client, Any, TextIO], Awaitable[Any]]

#: The refusals a WebSocket answers without an HTTP status: the request's fault, as a 4xx is.
_REFUSED = (BadRequest, Unauthorized, Forbidden, NotFound, Conflict, PlacedElsewhere, LimitExceeded)


class UsageError(Exception):
    """A command line the command refuses before asking the node (exit ``EXIT_USAGE``)."""


def describe(error: TurnstileClientError) -> str:
    """The line that says why the node refused or failed: ``<status> <code>: <message>
    (field <field>)``, the status when it came over HTTP; for no connection, the reason."""
    if isinstance(error, ConnectionLost):
        return error.message
    if error.code == f"http_{error.status}":  # an answer without the node's error body
        text = error.message
    else:
        text = f"{error.code}: {error.message}"
    if error.field:
        text += f" (field {error.field})"
    return text if error.status is None else f"{error.status} {text}"


def exit_status(error: TurnstileClientError) -> int:
    """``EXIT_USAGE`` for a request the node refused, ``EXIT_FAILED`` for one it failed or
    that did not reach it."""
    if error.status is not None:
        return EXIT_USAGE if error.status < 500 else EXIT_FAILED
    return EXIT_USAGE if isinstance(error, _REFUSED) else EXIT_FAILED


def run(
    name: str,
    command: Command,
    args: Any,
    token: str,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> int:
    """Run ``command`` against the node at ``args.url`` as ``token``'s user; its exit status.

    Args:
        name: the command as messages name it (``jobs cancel``).
        command: the command.
        args: the parsed command line (``url``, ``json`` and the command's own).
        token: the user's bearer token.
        out: where answers go (stdout).
        err: where messages go (stderr).
        transport: an httpx transport (tests); None talks to ``args.url`` over the network.
    """
    out = out or sys.stdout
    err = err or sys.stderr

    async def main() -> Any:
        async with open_client(args.url, token, transport=transport) as client:
            return await command(client, args, out)

    try:
        answer = trio.run(main)
    except UsageError as exc:
        print(f"turnstile {name}: {exc}", file=err)
        return EXIT_USAGE
    except TurnstileClientError as exc:
        print(f"turnstile {name}: {describe(exc)}", file=err)
        return exit_status(exc)
    if answer is not None:
        print(json.dumps(answer, indent=2, ensure_ascii=False), file=out)
    return EXIT_OK


class Runner(Protocol):
    """A command as ``actors/cli.py`` runs it (``runner``): its exit status."""

    def __call__(
        self,
        args: Any,
        token: str,
        *,
        out: TextIO | None = None,
        err: TextIO | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> int: ...


def runner(name: Callable[[Any], str], command: Command) -> Runner:
    """``command`` as a ``Runner``: ``run`` with the name ``name(args)`` gives it in messages
    (``jobs cancel``)."""

    def run_command(args: Any, token: str, **options: Any) -> int:
        return run(name(args), command, args, token, **options)

    return run_command


# ---- rendering ------------------------------------------------------------------------------


def when(value: str | datetime | None) -> str:
    """A time from the node (ISO text or a datetime) as ``YYYY-MM-DD HH:MM`` (UTC); ``-`` for
    none."""
    if not value:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
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


def print_table(
    out: TextIO,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    right: Collection[int] = (),
) -> None:
    """Print ``table(headers, rows, right)`` to ``out``."""
    for line in table(headers, rows, right):
        print(line, file=out)
