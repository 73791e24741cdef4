"""``turnstile attach``: a terminal client over trio-websocket.

Type a line to send it; ``/stop`` stops the running turn; ``/quit`` (or end of input) leaves.
Turns stream as they happen; the closing status of each turn is printed.
"""

from __future__ import annotations

import json
import sys

import httpx
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

__all__ = ["attach", "render"]


def render(frame: dict) -> str | None:
    """How one server frame looks on a terminal (None: print nothing)."""
    kind = frame.get("type")
    if kind == "stream_delta":
        return frame.get("text", "")
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
    if session_id is None:
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:
            response = await client.post("/sessions", json={})
            if response.status_code != 201:
                print(f"turnstile: {response.status_code} {response.text}", file=sys.stderr)
                return 1
            session_id = response.json()["id"]
            print(f"[new session {session_id}]")
    ws_url = url.replace("http://", "ws://").replace("https://", "wss://") + "/ws"
    try:
        async with open_websocket_url(
            ws_url, extra_headers=[(b"authorization", f"Bearer {token}".encode())]
        ) as ws:
            attach_frame = {"type": "attach", "session_id": session_id}
            if after_seq is not None:
                attach_frame["after_seq"] = after_seq
            await ws.send_message(json.dumps(attach_frame))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_print_frames, ws)
                await _relay_stdin(ws, session_id)
                nursery.cancel_scope.cancel()
    except ConnectionClosed as exc:
        print(f"\n[connection closed: {exc.reason}]", file=sys.stderr)
        return 1
    return 0


async def _print_frames(ws) -> None:
    while True:
        text = render(json.loads(await ws.get_message()))
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()


async def _relay_stdin(ws, session_id: str) -> None:
    stdin = trio.wrap_file(sys.stdin)
    async for line in stdin:
        line = line.rstrip("\n")
        if line == "/quit":
            return
        if line == "/stop":
            await ws.send_message(json.dumps({"type": "stop", "session_id": session_id}))
        elif line:
            await ws.send_message(
                json.dumps({"type": "send", "session_id": session_id, "content": line})
            )
