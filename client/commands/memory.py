"""``turnstile memory list | search | put | forget | summary | extraction | delete-all |
changes | watch``: your long-term memory, from a running node (``docs/memory.md``).

Each command is one request (``list``, ``extraction`` and ``changes`` one page) with the
caller's token, so it sees and changes exactly what the token's user could over HTTP; an
admin's ``--all-users`` is the node's ``all_users=true``. Output is a table, or with ``--json``
the node's answer as it is. ``watch`` subscribes to the ``memory`` topic
(``Client.subscribe``) and prints each change as it happens (``--json``: one frame a line);
after a drop it goes on from the last change printed.

``turnstile memory backfill`` is not here: it opens the store itself (``actors/cli.py``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, TextIO

import anyio
import httpx
import msgspec

from turnstile.client import (
    Client,
    ConnectionLost,
    FactForgotten,
    FactSaved,
    MemoryDeleted,
    SummaryChanged,
    TopicEvent,
    TopicReset,
    TopicStream,
    decode_topic_event,
)
from turnstile.client.commands._run import Command, UsageError, cell, run, table, when

__all__ = ["describe_change", "run_memory"]


def _fact_rows(facts: list[dict[str, Any]], owners: bool) -> list[str]:
    headers = ["CATEGORY", "KEY", "VALUE", "CONF", "SOURCE", "UPDATED"]
    rows = [
        [f["category"], f["key"], f["value"], f["confidence"], f["source"], when(f["updated_at"])]
        for f in facts
    ]
    if owners:
        headers.insert(0, "OWNER")
        rows = [[f.get("owner", ""), *row] for f, row in zip(facts, rows, strict=True)]
    return table(headers, rows, right={headers.index("CONF")})


def _print(lines: list[str], out: TextIO) -> None:
    for line in lines:
        print(line, file=out)


# ---- facts, the summary, extraction ---------------------------------------------------------


async def _list(client: Client, args: Any, out: TextIO) -> Any:
    body = await client.facts(
        search=args.search,
        category=args.category,
        sort_by=args.sort,
        sort_order=args.order,
        limit=args.limit,
        offset=args.offset,
        all_users=args.all_users,
    )
    if args.json:
        return body
    facts, total, offset = body["facts"], body["total"], body["offset"]
    if not facts:
        print(
            "no facts" if total == 0 else f"no facts at offset {offset} ({total} in all)", file=out
        )
        return None
    _print(_fact_rows(facts, args.all_users), out)
    end = offset + len(facts)
    footer = f"facts {offset + 1}-{end} of {total}"
    if end < total:
        footer += f"; next page: --offset {end}"
    print(footer, file=out)
    return None


async def _search(client: Client, args: Any, out: TextIO) -> Any:
    body = await client.search_memory(args.query, limit=args.limit)
    if args.json:
        return body
    if not body["facts"]:
        print("no facts found", file=out)
        return None
    _print(_fact_rows(body["facts"], False), out)
    return None


async def _put(client: Client, args: Any, out: TextIO) -> Any:
    optional = {
        "source": args.source,
        "confidence": args.confidence,
        "expires_days": args.expires_days,
        "source_context": args.context,
    }
    fields = {k: v for k, v in optional.items() if v is not None}
    body = await client.put_fact(args.category, args.key, args.value, **fields)
    if args.json:
        return body
    saved = body["fact"]
    expiry = f", expires {when(saved['expires_at'])}" if saved.get("expires_at") else ""
    print(
        f"saved {saved['category']} / {saved['key']}: {saved['value']}"
        f" (confidence {saved['confidence']}, {saved['source']}{expiry})",
        file=out,
    )
    return None


async def _forget(client: Client, args: Any, out: TextIO) -> Any:
    body = await client.forget_fact(args.key, category=args.category)
    if args.json:
        return body
    count = body["deleted"]
    print(f"forgot {count} fact{'s' if count != 1 else ''}", file=out)
    return None


def _summary(stdin: TextIO) -> Command:
    async def summary(client: Client, args: Any, out: TextIO) -> Any:
        if args.set is not None:
            content = stdin.read() if args.set == "-" else args.set
            body = await client.put_memory_summary(content)
            if args.json:
                return body
            print(f"summary saved ({len(body['summary'])} characters)", file=out)
            return None
        body = await client.memory_summary()
        if args.json:
            return body
        print("no summary" if body["summary"] is None else body["summary"], file=out)
        return None

    return summary


async def _extraction(client: Client, args: Any, out: TextIO) -> Any:
    body = await client.memory_extraction(
        due=args.due, limit=args.limit, after=args.after, all_users=args.all_users
    )
    if args.json:
        return body
    info = body["extraction"]
    if info["enabled"]:
        print(
            f"extraction on: sessions idle {info['stale_after_minutes']} min,"
            f" swept every {info['interval_seconds']:g} s",
            file=out,
        )
    else:
        print(f"extraction off: {info.get('reason', 'not running')}", file=out)
    sessions = body["sessions"]
    if not sessions:
        print("no sessions", file=out)
        return None
    headers = ["SESSION", "STATE", "LAST ACTIVITY", "EXTRACTED", "DUE AT"]
    rows = [
        [s["id"], s["state"], when(s["updated_at"]), when(s["extracted_at"]), when(s["due_at"])]
        for s in sessions
    ]
    if args.all_users:
        headers.insert(0, "OWNER")
        rows = [[s["owner"], *row] for s, row in zip(sessions, rows, strict=True)]
    _print(table(headers, rows), out)
    if body["next_after"] is not None:
        print(f"next page: --after {body['next_after']}", file=out)
    return None


async def _delete_all(client: Client, args: Any, out: TextIO) -> Any:
    if not args.yes:
        raise UsageError(
            "delete-all deletes every fact, the summary and the extraction state memory holds"
            " about you; add --yes to do it"
        )
    body = await client.delete_memory()
    if args.json:
        return body
    deleted = (body or {})["deleted"]
    print(
        f"deleted {deleted['facts']} facts, {deleted['summary']} summary,"
        f" {deleted['sessions']} session extraction states",
        file=out,
    )
    return None


# ---- the change log -------------------------------------------------------------------------


def describe_change(event: TopicEvent) -> str:
    """One line for an event of the ``memory`` topic (``docs/memory.md``): ``#seq time what``."""
    head = f"#{event.seq} {when(event.ts)}"
    change = event.data
    if isinstance(change, FactSaved):
        fact = change.fact
        how = "new" if change.created else "replaced"
        return (
            f"{head} saved {fact['category']} / {fact['key']}: {cell(fact['value'])}"
            f" ({how}, confidence {fact['confidence']})"
        )
    if isinstance(change, FactForgotten):
        why = " (expired)" if change.reason == "expired" else ""
        return f"{head} forgot {change.category} / {change.key}{why}"
    if isinstance(change, SummaryChanged):
        return f"{head} summary changed ({len(change.summary)} characters)"
    if isinstance(change, MemoryDeleted):
        d = change.deleted
        return (
            f"{head} deleted everything: {d['facts']} facts, {d['summary']} summary,"
            f" {d['sessions']} session extraction states"
        )
    return f"{head} {event.type}"


async def _changes(client: Client, args: Any, out: TextIO) -> Any:
    after = args.after_seq or 0
    body = await client.memory_changes(after_seq=after, limit=args.limit)
    if args.json:
        return body
    if body["reset"]:
        print(
            f"the log no longer holds every change after {after}: reload"
            f" (turnstile memory list, summary); the latest is #{body['last_seq']}",
            file=out,
        )
        return None
    changes = [decode_topic_event(frame) for frame in body["changes"]]
    if not changes:
        print(f"no changes after {after} (latest #{body['last_seq']})", file=out)
        return None
    for change in changes:
        print(describe_change(change), file=out)
    if changes[-1].seq < body["last_seq"]:
        print(f"more: --after-seq {changes[-1].seq}", file=out)
    return None


def _frame(event: TopicEvent) -> dict[str, Any]:
    """The event as the node sent it: its fields, then ``type``, ``topic``, ``seq``, ``ts``."""
    ts = msgspec.to_builtins(event.ts)  # as the node's msgspec wrote it
    return {**event.fields, "type": event.type, "topic": event.topic, "seq": event.seq, "ts": ts}


def _watching(last_seq: int, reset: bool) -> str:
    note = " (reset: reload, the log no longer holds it all)" if reset else ""
    return f"watching memory changes after #{last_seq}{note}"


async def _follow(stream: TopicStream, args: Any, out: TextIO) -> None:
    """Print the stream's changes until ``args.count`` were printed (forever when None)."""
    first: TopicEvent | TopicReset | None = None
    with contextlib.suppress(anyio.WouldBlock):
        first = stream.receive_nowait()  # a reset is the first thing a subscription gives
    reset = isinstance(first, TopicReset)
    if reset:
        first = None  # said on the first line
    if not args.json:
        head = stream.statistics().head_seq or 0
        print(_watching(head, reset), file=out, flush=True)
    printed = 0
    while args.count is None or printed < args.count:
        event = first if first is not None else await stream.receive()
        first = None
        if isinstance(event, TopicReset):  # resumed after a drop, past what the log holds
            if not args.json:
                print(_watching(event.last_seq, True), file=out, flush=True)
            continue
        line = json.dumps(_frame(event), ensure_ascii=False) if args.json else None
        print(line or describe_change(event), file=out, flush=True)
        printed += 1


async def _watch(client: Client, args: Any, out: TextIO) -> Any:
    try:
        async with client.subscribe("memory", after_seq=args.after_seq) as stream:
            await _follow(stream, args, out)
    except ConnectionLost as exc:  # at the start, or after the reconnection attempts
        raise ConnectionLost(f"cannot reach the node at {client.url}: {exc.message}") from None
    return None


_COMMANDS: dict[str, Command] = {
    "list": _list,
    "search": _search,
    "put": _put,
    "forget": _forget,
    "extraction": _extraction,
    "delete-all": _delete_all,
    "changes": _changes,
    "watch": _watch,
}


def run_memory(
    args: Any,
    token: str,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> int:
    """Run the ``turnstile memory`` command ``args.memory_command``; its exit status
    (``_run.run``). ``watch`` stopped with Ctrl-C exits 0."""
    name = args.memory_command
    command = _summary(stdin or sys.stdin) if name == "summary" else _COMMANDS[name]
    try:
        return run(f"memory {name}", command, args, token, out=out, err=err, transport=transport)
    except KeyboardInterrupt:
        if name != "watch":
            raise
        return 0
