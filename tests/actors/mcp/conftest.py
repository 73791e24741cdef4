"""A node with MCP servers, for the MCP feature's tests: real servers over stdio (the three
from the package index, installed into the test environment by the dev extra, and
``misbehaving.py``), on SQLite, without a gateway unless a test serves one."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from tests.support.http import APP
from turnstile.actors.config import Config
from turnstile.actors.mcp import McpConfig, McpServerConfig
from turnstile.actors.mcp.server import McpServer
from turnstile.actors.node import Node, open_node

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789abc"
TOKENS = {ALICE: "alice", BOB: "bob"}
#: a hang guard on the real clock (servers are real processes: a loaded 2-core box takes
#: seconds to start one), not a promise
WAIT = 60

BIN = Path(sys.executable).parent
MISBEHAVING = [sys.executable, str(Path(__file__).with_name("misbehaving.py"))]


def installed(program: str) -> str:
    """The absolute path of a console script of the test environment."""
    return str(BIN / program)


@asynccontextmanager
async def mcp_node(
    tmp_path: Path, servers: dict[str, McpServerConfig], *, serve: bool = False, **config: Any
) -> AsyncIterator[Node]:
    """A node running ``servers`` (on SQLite in ``tmp_path`` unless ``store=`` says another);
    each is running, its tools registered, when this yields."""
    mcp = McpConfig(servers=servers, **config.pop("mcp", {}))
    config.setdefault("agent", "scripted")
    config.setdefault("store", f"sqlite:///{tmp_path}/node.db")
    settings = Config(port=0, mcp=mcp, **config)
    async with open_node(settings, tokens=TOKENS, serve=serve) as node:
        with trio.fail_after(WAIT):
            for server in servers:
                await mcp_server(node, server).ready()
        yield node


def mcp_server(node: Node, name: str) -> McpServer:
    feature = node.features["mcp"]
    return feature.servers[name]  # type: ignore[attr-defined]


async def until(server: McpServer, condition: Callable[[], bool]) -> None:
    """Wait, without sleeping, until ``condition()`` holds after a change of the server's."""
    with trio.fail_after(WAIT):
        while not condition():
            await server.changed()


async def session_key(node: Node, user: str = "alice", **metadata: Any) -> str:
    session = await node.directory.create_session(user, metadata=metadata or None)
    return f"{user}/{session.id}"


@pytest.fixture
async def site(nursery) -> str:
    """The http module's test site on loopback (``tests.support.http.APP``): its base URL."""
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    (bind,) = await nursery.start(hypercorn_serve, APP, config)
    return bind
