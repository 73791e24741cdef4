"""``turnstile attach``: a terminal client over trio-websocket.

Type a line to send it; ``/stop`` stops the running turn; ``/quit`` leaves at once. At the end
of input (Ctrl-D, or the end of a pipe: ``echo hi | turnstile attach``) it leaves once every
line it sent has been answered and the turns they started have ended, so a script sees its
answers. Turns stream as they happen; the closing status of each turn is printed.

Exit status, as every ``turnstile`` command: 0 left with ``/quit``; 2 refused (a bad token or
origin, a session that is not yours, a name that cannot be created); 1 the node could not be
reached, failed, or closed the connection.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx
import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

__all__ = ["attach", "render"]


class _Refused(Exception):
    """The node refused the attach (an ``error`` frame before ``attached``)."""


class _Sent:
    """What the lines this terminal sent still wait for: each ``send`` is answered by one
    ``ack`` or one ``error``, in the order sent, and an acknowledged input's turn ends with a
    ``stream_end`` (which may come before its ``ack``: replies and events travel apart)."""

    def __init__(self) -> None:
        self.replies = 0  # sends not answered yet
        self.turns: set[int] = set()  # acknowledged inputs whose turn has not ended
        # turns that ended while an ack was still due (None: a turn with no input)
        self._ended: set[int | None] = set()
        self._changed = trio.Event()

    def sent(self) -> None:
        self.replies += 1

    def seen(self, frame: dict[str, Any]) -> None:
        """Account for one server frame."""
        kind = frame.get("type")
        if kind == "ack" and self.replies:
            self.replies -= 1
            input_id: int | None = frame.get("input_id")
            if input_id is not None and input_id not in self._ended:
                self.turns.add(input_id)
        elif kind == "error" and self.replies and not _unprompted(frame):
            self.replies -= 1  # the line was refused (busy, too long, …): no turn to wait for
        elif kind == "stream_end":
            input_id = frame.get("input_id")
            if input_id in self.turns:
                self.turns.discard(input_id)
            elif self.replies:
                self._ended.add(input_id)
        else:
            return
        if not self.replies:
            self._ended.clear()
        self._changed.set()
        self._changed = trio.Event()

    async def settled(self) -> None:
        """Wait until every line sent is answered and every turn they started has ended."""
        while self.replies or self.turns:
            await self._changed.wait()


def _unprompted(frame: dict[str, Any]) -> bool:
    """Whether an ``error`` frame answers no ``send``: a failed ``call`` or ``subscribe``, or a
    client that fell behind (``lagged``)."""
    return frame.get("code") == "lagged" or "id" in frame or "topic" in frame


def render(frame: dict[str, Any]) -> str | None:
    """How one server frame looks on a terminal (None: print nothing)."""
    kind = frame.get("type")
    if kind == "stream_delta":
        return str(frame.get("text", ""))
    if kind == "thinking_delta":
        return f"\x1b[2m{frame.get('text', '')}\x1b[0m"
    if kind == "stream_start":
        return f"\n[{frame.get('source')}] {frame.get('content')}\n> "
    if kind == "stream_end":
        status = frame.get("status")
        error = f": {frame['error']}" if frame.get("error") else ""
        return f"\n[turn {status}{error}]\n"
    if kind == "tool_call":
        outcome = "ok" if frame.get("ok") else f"failed: {frame.get('error')}"
        return f"\n[tool {frame.get('tool')} {outcome}]\n"
    if kind == "error":
        return f"\n[error {frame.get('code')}: {frame.get('message')}]\n"
    if kind == "attached":
        return f"[attached to {frame.get('session_id')} at seq {frame.get('last_seq')}]\n"
    if kind == "turn_queued" and frame.get("ahead"):
        return f"[queued behind {frame['ahead']}]\n"
    return None


async def attach(url: str, token: str, session_id: str | None, after_seq: int | None) -> int:
    """Attach to ``session_id`` (creating a session when None) and relay the terminal."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        if session_id is None:
            async with httpx.AsyncClient(base_url=url, headers=headers) as client:
                response = await client.post("/sessions", json={})
            if response.status_code != 201:
                print(f"turnstile attach: {response.status_code} {response.text}", file=sys.stderr)
                return 2 if response.status_code < 500 else 1
            session_id = response.json()["id"]
            print(f"[new session {session_id}]")
        ws_url = url.replace("http://", "ws://").replace("https://", "wss://") + "/ws"
        async with open_websocket_url(
            ws_url, extra_headers=[(b"authorization", f"Bearer {token}".encode())]
        ) as ws:
            attach_frame = {"type": "attach", "session_id": session_id}
            if after_seq is not None:
                attach_frame["after_seq"] = after_seq
            await ws.send_message(json.dumps(attach_frame))
            sent = _Sent()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_print_frames, ws, sent)
                if await _relay_stdin(ws, session_id, sent):  # end of input: let it answer
                    await sent.settled()
                nursery.cancel_scope.cancel()
    except Exception as exc:  # a group when it came out of the nursery
        return _exit_status(exc, url)
    return 0


def _exit_status(exc: BaseException, url: str) -> int:
    """Say why the attach ended on an error; the exit status it means (or re-raise a bug)."""
    found = _find(exc, (_Refused, ConnectionClosed, httpx.ConnectError, HandshakeError, OSError))
    if isinstance(found, _Refused):
        print(f"turnstile attach: {found}", file=sys.stderr)
        return 2
    if isinstance(found, ConnectionClosed):
        print(f"\n[connection closed: {found.reason}]", file=sys.stderr)
        # the gateway closes with 4401 (bad token) or 4403 (origin) after an error frame
        return 2 if getattr(found.reason, "code", None) in (4401, 4403) else 1
    if found is not None:
        print(f"turnstile attach: cannot reach the node at {url}: {found!r}", file=sys.stderr)
        return 1
    raise exc


def _find(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """``exc``, or the first of ``kinds`` in it when it is a (nested) group."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kinds)
            if found is not None:
                return found
        return None
    return exc if isinstance(exc, kinds) else None


async def _print_frames(ws: WebSocketConnection, sent: _Sent) -> None:
    attached = False
    while True:
        frame = json.loads(await ws.get_message())
        sent.seen(frame)
        kind = frame.get("type")
        if kind == "attached":
            attached = True
        elif kind == "error" and not attached and frame.get("code") != "unauthorized":
            raise _Refused(f"{frame.get('code')}: {frame.get('message')}")
        text = render(frame)
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()


async def _relay_stdin(ws: WebSocketConnection, session_id: str, sent: _Sent) -> bool:
    """Send the terminal's lines until ``/quit`` (False) or the end of input (True)."""
    while True:
        # abandoned, not waited for, when the attach ends on its own (a refusal, a close):
        # a thread blocked reading a terminal cannot be interrupted
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if not line:
            return True
        line = line.rstrip("\n")
        if line == "/quit":
            return False
        if line == "/stop":
            await ws.send_message(json.dumps({"type": "stop", "session_id": session_id}))
        elif line:
            sent.sent()
            await ws.send_message(
                json.dumps({"type": "send", "session_id": session_id, "content": line})
            )
