"""Helpers for the tests that limits hold under concurrency (issue 23, "Limits that hold"):
nodes on one store with an HTTP client each, and many calls started at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import httpx
import trio

from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import Node, open_node

T = TypeVar("T")

#: The bearer token of user ``ada`` on the nodes :func:`nodes` opens.
ADA = "limits-race-ada-token-0123456789"
#: How many requests a test starts at once.
PARALLEL = 50


def node_config(url: str, node_id: str | None = None, **sections: Any) -> Config:
    """A node's config on ``url``; with ``node_id``, one of several nodes (session leases)."""
    node = NodeConfig() if node_id is None else NodeConfig(id=node_id, placement="leases")
    return Config(store=url, node=node, **sections)


@asynccontextmanager
async def nodes(configs: list[Config]) -> AsyncIterator[list[tuple[Node, httpx.AsyncClient]]]:
    """A node per config (not serving), each with an in-process HTTP client as ada."""
    async with AsyncExitStack() as stack:
        out = []
        for i, cfg in enumerate(configs):
            node = await stack.enter_async_context(open_node(cfg, tokens={ADA: "ada"}, serve=False))
            http = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=node.app),
                    base_url=f"http://n{i}",
                    headers={"Authorization": f"Bearer {ADA}"},
                )
            )
            out.append((node, http))
        yield out


async def at_once(n: int, call: Callable[[int], Awaitable[T]]) -> list[T]:
    """``call(0)`` … ``call(n - 1)`` started together; their answers, in the order they came."""
    answers: list[T] = []

    async def one(i: int) -> None:
        answers.append(await call(i))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return answers
