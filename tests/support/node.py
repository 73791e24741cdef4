"""A real node (hypercorn + Starlette + SQLite) on loopback, and a real trio-websocket client.

Nothing here sleeps to synchronise: tests wait for the frames they expect.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import trio
from trio_websocket import open_websocket_url

from turnstile.actors.config import Config
from turnstile.actors.node import open_node

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
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {token}"})


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
        await self.ws.send_message(json.dumps(frame))

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
                self.frames.append(json.loads(await self.ws.get_message()))

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
