"""A fake OpenAI-compatible server for agent tests: real HTTP, scripted answers.

``FakeOpenAI`` is a Starlette app with ``POST /v1/chat/completions``. Each request pops the
next scripted reply (``Stream``, ``Reply`` or ``Stall``) and is recorded (JSON body and
headers) in ``requests``. ``start_fake_openai(nursery)`` serves it with hypercorn on
127.0.0.1, port 0, and returns it with ``base_url`` set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Stream:
    """An SSE answer: each chunk (a dict, or a raw ``data:`` payload) then ``[DONE]``.

    ``split`` sends every event in two pieces of bytes, cut mid-line.
    """

    chunks: list[dict[str, Any] | str]
    split: bool = False
    done: bool = True


@dataclass
class Reply:
    """A plain HTTP answer."""

    status: int
    body: str
    content_type: str = "application/json"


@dataclass
class Stall:
    """Never answer (until the server is cancelled)."""


@dataclass
class Seen:
    """A request the fake received."""

    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class FakeOpenAI:
    replies: list[Stream | Reply | Stall] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    base_url: str = ""

    def script(self, *replies: Stream | Reply | Stall) -> None:
        self.replies.extend(replies)

    async def _completions(self, request: Request) -> Response:
        self.requests.append(Seen(await request.json(), dict(request.headers)))
        no_reply = Reply(500, '{"error": {"message": "no scripted reply"}}')
        reply = self.replies.pop(0) if self.replies else no_reply
        if isinstance(reply, Stall):
            await trio.sleep_forever()
        if isinstance(reply, Reply):
            return Response(reply.body, reply.status, media_type=reply.content_type)
        return StreamingResponse(_events(reply), media_type="text/event-stream")

    @property
    def app(self) -> Starlette:
        route = Route("/v1/chat/completions", self._completions, methods=["POST"])
        return Starlette(routes=[route])


async def _events(stream: Stream):
    payloads = [c if isinstance(c, str) else json.dumps(c) for c in stream.chunks]
    if stream.done:
        payloads.append("[DONE]")
    for payload in payloads:
        event = f"data: {payload}\n\n".encode()
        if stream.split:
            yield event[: len(event) // 2]
            await trio.sleep(0.001)
            yield event[len(event) // 2 :]
        else:
            yield event


async def start_fake_openai(nursery: trio.Nursery) -> FakeOpenAI:
    """Serve a fresh fake in ``nursery`` (cancel the nursery to stop it)."""
    fake = FakeOpenAI()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    (bind,) = await nursery.start(hypercorn_serve, fake.app, config)
    fake.base_url = f"{bind}/v1"
    return fake


def chunk(**delta: Any) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice whose delta is ``delta``."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }


def text_stream(*pieces: str, split: bool = False) -> Stream:
    """A stream answering ``pieces`` as content deltas."""
    return Stream([chunk(role="assistant", content="")] + [chunk(content=p) for p in pieces], split)


def tool_piece(
    index: int, *, id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    """A delta fragment of tool call ``index`` (name and id come only in the first one)."""
    piece: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if id is not None:
        piece["id"] = id
        piece["type"] = "function"
    if name is not None:
        piece["function"]["name"] = name
    return piece
