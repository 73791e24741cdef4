"""A real node (hypercorn + Starlette + SQLite) on loopback, and a WebSocket client that keeps
every frame it received, for the tests of the protocol itself.

The frames it sends are the protocol's own Structs (``turnstile.protocol``): ``send(type=...,
**fields)`` builds one and fails on a frame no client could build (a test of what the node does
with such a frame says so with ``send_raw``). Every frame it receives is checked against the
Structs ``turnstile.client`` reads it with: a server answer (``ack``, ``result``, ``error`` …)
against ``turnstile.protocol``'s, a session event of a known type against its feature's Struct;
so every end-to-end test also checks that the client understands what the node sends. Tests
read the frames as dicts, as they arrive. Tests that only drive sessions use
``turnstile.client`` itself.

Nothing here sleeps to synchronise: tests wait for the frames they expect.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import trio
from trio_websocket import open_websocket_url

from turnstile.actors.config import Config
from turnstile.actors.node import open_node
from turnstile.client import UnknownEvent, decode_event
from turnstile.protocol import ClientFrame, ServerFrame

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789abc"
TOKENS = {ALICE: "alice", BOB: "bob"}
#: How long any single expected frame may take, on the real clock: a hang guard, not a
#: promise (a loaded 2-core box takes seconds where a quiet one takes milliseconds)
WAIT = 60


@dataclass
class Node:
    url: str
    ws_url: str

    def http(self, token: str = ALICE) -> httpx.AsyncClient:
        # httpx's own 5 s timeout is a bound, not a hang guard: a hundred posts at once on a
        # box at load 8 waited longer for their answers (test_idempotent_ingress)
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=WAIT
        )


@asynccontextmanager
async def running_node(tmp_path, agent=None, **config: Any) -> AsyncIterator[Node]:
    """A node on ``tmp_path``: the scripted agent (its echo, ``You said: …``, is what the tests
    read) unless ``agent`` (an agent) or ``config`` (``agent="openai"``) names another."""
    config.setdefault("agent", "scripted")
    settings = Config(port=0, store=f"sqlite:///{tmp_path}/node.db", **config)
    async with open_node(settings, tokens=TOKENS, agent=agent) as node:
        yield Node(url=node.url, ws_url=node.url.replace("http://", "ws://") + "/ws")


class Client:
    """A WebSocket client that keeps every frame it received."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.frames: list[dict] = []
        self._matched: set[int] = set()

    async def send(self, **frame: Any) -> None:
        """Send ``frame`` (``type`` and its fields) as the protocol's Struct.

        Raises:
            msgspec.ValidationError: no client frame has these fields and values (use
                ``send_raw`` to send one on purpose).
        """
        struct = msgspec.convert(frame, ClientFrame)  # type: ignore[arg-type]
        await self.ws.send_message(_encoder.encode(struct).decode())

    async def send_raw(self, text: str) -> None:
        await self.ws.send_message(text)

    async def expect(self, predicate: Callable[[dict], bool] | str, **fields: Any) -> dict:
        """The first frame not matched before that matches, waiting for it if needed."""
        if isinstance(predicate, str):
            kind = predicate
            predicate = lambda f: f.get("type") == kind  # noqa: E731
        checked = 0
        with trio.fail_after(WAIT):
            while True:
                for index in range(checked, len(self.frames)):
                    frame = self.frames[index]
                    if index in self._matched:
                        continue
                    if predicate(frame) and all(frame.get(k) == v for k, v in fields.items()):
                        self._matched.add(index)
                        return frame
                checked = len(self.frames)
                self.frames.append(checked_frame(json.loads(await self.ws.get_message())))

    def events(self, session_id: str) -> list[dict]:
        """The session events received so far (frames with a seq), in arrival order: not the
        attach-time ``session_sync`` frame, but the stored one a headless turn ends with (it
        names the turn's ``input_id``)."""
        return [
            f
            for f in self.frames
            if f.get("session_id") == session_id
            and "seq" in f
            and (f["type"] != "session_sync" or "input_id" in f)
        ]


_encoder = msgspec.json.Encoder()
#: The ``type`` of every server answer ``turnstile.protocol`` has a Struct for.
_ANSWERS = {t.__struct_config__.tag for t in ServerFrame.__args__}  # type: ignore[attr-defined]


def checked_frame(frame: Any) -> Any:
    """``frame``, once ``turnstile.client`` reads it as what it is.

    Raises:
        AssertionError: a server answer or a session event of a known type that does not match
            its Struct.
    """
    if not isinstance(frame, dict):
        return frame
    kind = frame.get("type")
    if "ts" in frame and "seq" in frame and "session_id" in frame:
        try:
            event = decode_event(frame)
        except msgspec.ValidationError as exc:
            raise AssertionError(
                f"an event frame the client cannot read ({exc}): {frame}"
            ) from None
        if isinstance(event.data, UnknownEvent):
            from turnstile.actors.sessions.event_types import event_types

            if kind in event_types():
                raise AssertionError(f"a {kind!r} event that does not match its Struct: {frame}")
    elif kind in _ANSWERS:
        try:
            msgspec.convert(frame, ServerFrame)  # type: ignore[arg-type]
        except msgspec.ValidationError as exc:
            raise AssertionError(
                f"a {kind!r} frame the client cannot read ({exc}): {frame}"
            ) from None
    return frame


@asynccontextmanager
async def connect(node: Node, token: str = ALICE, **headers: str) -> AsyncIterator[Client]:
    extra = [(b"authorization", f"Bearer {token}".encode())] if token else []
    extra += [(k.encode(), v.encode()) for k, v in headers.items()]
    async with open_websocket_url(node.ws_url, extra_headers=extra) as ws:
        yield Client(ws)


async def new_session(node: Node, session_id: str, token: str = ALICE, **body: Any) -> dict:
    async with node.http(token) as http:
        response = await http.post("/sessions", json={"id": session_id, **body})
        assert response.status_code == 201, response.text
        return response.json()
