"""``turnstile memory``: an HTTP client of a running node's ``/memory`` routes.

Each command is one request (``list``, ``extraction`` and ``changes`` one page) made with the
caller's bearer token, so it sees and changes exactly what the token's user could over HTTP; an
admin's ``--all-users`` is the server's ``all_users=true``. Output is a readable table, or with
``--json`` the server's answer as it is, for scripts. ``watch`` subscribes to the ``memory``
topic over the WebSocket and prints each change as it happens (``--json``: one frame a line).

Exit status: 0 done; 2 the node refused the request (a 4xx: bad token, nothing to forget, a bad
value; the server's own message is printed, with the field it names) or the command line is
wrong; 1 the node could not be reached or failed (5xx). Messages go to stderr.

``turnstile memory backfill`` is not here: it opens the store itself (``actors/cli.py``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

import httpx
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from turnstile.actors.clients import NodeClient, NodeError, cell, reason, table, when

__all__ = ["MemoryClient", "NodeError", "run"]


class MemoryClient(NodeClient):
    """The ``/memory`` routes of one node, for one token (``NodeClient``, which also knows the
    token again for the WebSocket of ``watch``)."""

    def token(self) -> str:
        return self._http.headers["Authorization"].removeprefix("Bearer ")


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


# ---- commands -------------------------------------------------------------------------------


def _list(client: MemoryClient, args: Any, out: TextIO) -> Any:
    body = client.request(
        "GET",
        "/memory/facts",
        params={
            "search": args.search,
            "category": args.category,
            "sort_by": args.sort,
            "sort_order": args.order,
            "limit": args.limit,
            "offset": args.offset,
            "all_users": args.all_users or None,
        },
    )
    if args.json:
        return body
    facts, total, offset = body["facts"], body["total"], body["offset"]
    if not facts:
        print(
            "no facts" if total == 0 else f"no facts at offset {offset} ({total} in all)", file=out
        )
        return None
    for line in _fact_rows(facts, args.all_users):
        print(line, file=out)
    end = offset + len(facts)
    footer = f"facts {offset + 1}-{end} of {total}"
    if end < total:
        footer += f"; next page: --offset {end}"
    print(footer, file=out)
    return None


def _search(client: MemoryClient, args: Any, out: TextIO) -> Any:
    body = client.request(
        "GET", "/memory/search", params={"query": args.query, "limit": args.limit}
    )
    if args.json:
        return body
    if not body["facts"]:
        print("no facts found", file=out)
        return None
    for line in _fact_rows(body["facts"], False):
        print(line, file=out)
    return None


def _put(client: MemoryClient, args: Any, out: TextIO) -> Any:
    fact = {"category": args.category, "key": args.key, "value": args.value}
    optional = {
        "source": args.source,
        "confidence": args.confidence,
        "expires_days": args.expires_days,
        "source_context": args.context,
    }
    fact.update({k: v for k, v in optional.items() if v is not None})
    body = client.request("PUT", "/memory/facts", body=fact)
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


def _forget(client: MemoryClient, args: Any, out: TextIO) -> Any:
    body = client.request(
        "DELETE", "/memory/facts", params={"key": args.key, "category": args.category}
    )
    if args.json:
        return body
    count = body["deleted"]
    print(f"forgot {count} fact{'s' if count != 1 else ''}", file=out)
    return None


def _summary(client: MemoryClient, args: Any, out: TextIO, stdin: TextIO) -> Any:
    if args.set is not None:
        content = stdin.read() if args.set == "-" else args.set
        body = client.request("PUT", "/memory/summary", body={"content": content})
        if not args.json:
            print(f"summary saved ({len(body['summary'])} characters)", file=out)
            return None
        return body
    body = client.request("GET", "/memory/summary")
    if args.json:
        return body
    if body["summary"] is None:
        print("no summary", file=out)
    else:
        print(body["summary"], file=out)
    return None


def _extraction(client: MemoryClient, args: Any, out: TextIO) -> Any:
    body = client.request(
        "GET",
        "/memory/extraction",
        params={
            "due": True if args.due else None,
            "limit": args.limit,
            "after": args.after,
            "all_users": args.all_users or None,
        },
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
    for line in table(headers, rows):
        print(line, file=out)
    if body["next_after"] is not None:
        print(f"next page: --after {body['next_after']}", file=out)
    return None


def _delete_all(client: MemoryClient, args: Any, out: TextIO) -> Any:
    if not args.yes:
        raise NodeError(
            "delete-all deletes every fact, the summary and the extraction state memory holds"
            " about you; add --yes to do it",
            2,
        )
    body = client.request("DELETE", "/memory")
    if args.json:
        return body
    deleted = body["deleted"]
    print(
        f"deleted {deleted['facts']} facts, {deleted['summary']} summary,"
        f" {deleted['sessions']} session extraction states",
        file=out,
    )
    return None


def describe_change(change: dict[str, Any]) -> str:
    """One line for a change of the ``memory`` topic (``docs/memory.md``)."""
    kind = change.get("type")
    head = f"#{change.get('seq')} {when(change.get('ts'))}"
    if kind == "fact_saved":
        fact = change["fact"]
        how = "new" if change.get("created") else "replaced"
        return (
            f"{head} saved {fact['category']} / {fact['key']}: {cell(fact['value'])}"
            f" ({how}, confidence {fact['confidence']})"
        )
    if kind == "fact_forgotten":
        why = " (expired)" if change.get("reason") == "expired" else ""
        return f"{head} forgot {change['category']} / {change['key']}{why}"
    if kind == "summary_changed":
        return f"{head} summary changed ({len(change['summary'])} characters)"
    if kind == "memory_deleted":
        d = change["deleted"]
        return (
            f"{head} deleted everything: {d['facts']} facts, {d['summary']} summary,"
            f" {d['sessions']} session extraction states"
        )
    return f"{head} {kind}"


def _changes(client: MemoryClient, args: Any, out: TextIO) -> Any:
    body = client.request(
        "GET", "/memory/changes", params={"after_seq": args.after_seq, "limit": args.limit}
    )
    if args.json:
        return body
    if body["reset"]:
        print(
            f"the log no longer holds every change after {args.after_seq or 0}: reload"
            f" (turnstile memory list, summary); the latest is #{body['last_seq']}",
            file=out,
        )
        return None
    changes = body["changes"]
    if not changes:
        print(f"no changes after {args.after_seq or 0} (latest #{body['last_seq']})", file=out)
        return None
    for change in changes:
        print(describe_change(change), file=out)
    if changes[-1]["seq"] < body["last_seq"]:
        print(f"more: --after-seq {changes[-1]['seq']}", file=out)
    return None


def _watch(client: MemoryClient, args: Any, out: TextIO) -> Any:
    try:
        trio.run(_follow, client.url, client.token(), args.after_seq, args.count, args.json, out)
    except KeyboardInterrupt:
        pass
    return None


async def _follow(
    url: str, token: str, after_seq: int | None, count: int | None, as_json: bool, out: TextIO
) -> None:
    """Subscribe to the ``memory`` topic and print its events until ``count`` were printed
    (forever when None); a ``lagged`` drop subscribes again from the last one printed."""
    ws_url = url.replace("https://", "wss://").replace("http://", "ws://") + "/ws"
    headers = [(b"authorization", f"Bearer {token}".encode())]
    printed = 0
    try:
        async with open_websocket_url(ws_url, extra_headers=headers) as ws:
            frame: dict[str, Any] = {"type": "subscribe", "topic": "memory"}
            if after_seq is not None:
                frame["after_seq"] = after_seq
            await ws.send_message(json.dumps(frame))
            while count is None or printed < count:
                message = json.loads(await ws.get_message())
                kind = message.get("type")
                if kind == "error" and message.get("code") == "lagged":
                    again = {"type": "subscribe", "topic": "memory"}
                    await ws.send_message(json.dumps({**again, "after_seq": message["last_seq"]}))
                    continue
                if kind == "error":
                    status = 2 if message.get("code") in ("unauthorized", "bad_message") else 1
                    raise NodeError(f"{message.get('code')}: {message.get('message')}", status)
                if message.get("topic") != "memory" or kind in ("topic_sync", "unsubscribed"):
                    continue
                if kind == "subscribed":
                    if not as_json:
                        note = " (reset: reload, the log no longer holds it all)"
                        print(
                            f"watching memory changes after #{message['last_seq']}"
                            f"{note if message.get('reset') else ''}",
                            file=out,
                            flush=True,
                        )
                    continue
                line = json.dumps(message, ensure_ascii=False) if as_json else None
                print(line or describe_change(message), file=out, flush=True)
                printed += 1
    except HandshakeError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, OSError):  # nobody listens there
            raise NodeError(f"cannot reach the node at {url}: connection refused", 1) from None
        raise NodeError(f"cannot open a WebSocket to {ws_url}: {exc!r}", 1) from None
    except OSError as exc:
        raise NodeError(f"cannot reach the node at {url}: {reason(exc)}", 1) from None
    except ConnectionClosed as exc:
        # the gateway closes with 4401 (bad token) or 4403 (origin) after an error frame
        code = getattr(exc.reason, "code", None)
        if code == 4401:
            raise NodeError("unauthorized: invalid token", 2) from None
        if code == 4403:
            raise NodeError("unauthorized: origin not allowed", 2) from None
        raise NodeError("the node closed the connection", 1) from None


COMMANDS: dict[str, Callable[..., Any]] = {
    "list": _list,
    "search": _search,
    "put": _put,
    "forget": _forget,
    "summary": _summary,
    "extraction": _extraction,
    "delete-all": _delete_all,
    "changes": _changes,
    "watch": _watch,
}


def run(
    args: Any,
    token: str,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
    transport: httpx.BaseTransport | None = None,
) -> int:
    """Run the ``turnstile memory`` command ``args.memory_command``; its exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    command = COMMANDS[args.memory_command]
    client = MemoryClient(args.url, token, transport)
    try:
        if command is _summary:
            answer = command(client, args, out, stdin or sys.stdin)
        else:
            answer = command(client, args, out)
    except NodeError as exc:
        print(f"turnstile memory {args.memory_command}: {exc}", file=err)
        return exc.status
    finally:
        client.close()
    if answer is not None:
        print(json.dumps(answer, indent=2, ensure_ascii=False), file=out)
    return 0
