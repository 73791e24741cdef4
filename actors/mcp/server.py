"""One MCP server as the node runs it: started, listed, called, watched, started again.

``McpServer.run`` is the server's long-lived task (one per configured server, owned by the
node's nursery). It waits until the server is wanted (``want``: its first use, or the node's
start when its tools are not known yet), then makes *attempts*: an attempt
starts the program (or opens the HTTP session), completes the MCP handshake and lists the
tools (all within ``start_timeout``), publishes the tools, and then lives until the
connection ends — the process exits, the transport breaks, a call finds the connection
broken, or a server that let a call time out does not answer a ping. Then it waits
(``backoff_delay``: ``backoff_initial`` doubled per failure in a row, at most
``backoff_max``; the count starts again after a run of ``STABLE_SECONDS``) and tries again.
Leaving the node's nursery stops it (the transport's shielded, bounded shutdown).

Calls (``McpServer.call``) run in the caller's task: a call made while the server starts waits
for the attempt; one made while it backs off fails at once with ``mcp_unavailable``, saying
why and when it is tried again; one running when the connection ends fails at once with
``mcp_server_died`` (the connection's end cancels every call in flight), not at its timeout.

A ``notifications/tools/list_changed`` from the server makes it list its tools again and
publish them (the registry follows: ``McpFeature``).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from turnstile.actors.mcp.egress import proxy_environment
from turnstile.actors.mcp.errors import (
    McpProtocolError,
    McpServerDied,
    McpTimeout,
    McpUnavailable,
)
from turnstile.actors.mcp.settings import McpServerConfig
from turnstile.actors.mcp.stdio import EXIT_GRACE, StdioProcess, find_command, open_stdio

__all__ = ["IDEMPOTENCY_META_KEY", "STABLE_SECONDS", "McpServer", "backoff_delay"]

log = logging.getLogger("turnstile.mcp")

#: A run this long resets the count of failures in a row.
STABLE_SECONDS = 60.0
#: Seconds a server that let a call time out has to answer a ping before it is started again.
PING_TIMEOUT = 5.0
#: Pages of ``tools/list`` read at most.
MAX_PAGES = 10
#: Where a turn's call carries its idempotency key (``_meta``, which every transport has).
IDEMPOTENCY_META_KEY = "turnstile/idempotency_key"


def backoff_delay(failures: int, initial: float, maximum: float) -> float:
    """Seconds to wait before the next start after ``failures`` failures in a row (>= 1)."""
    return min(initial * 2 ** max(failures - 1, 0), maximum)


class McpServer:
    """A configured MCP server and its connection (see the module docstring).

    Args:
        name: its name in the config (its tools' module).
        config: its section.
        on_tools: awaited with the server and its listed tools (dicts as MCP describes them)
            after every listing.
        proxy_url: the guard proxy (``egress``); None without one.
        backoff: ``(initial, maximum)`` seconds between starts.

    Attributes:
        state: ``stopped`` (never wanted yet), ``starting``, ``running`` or ``backoff``.
        last_error: why the last attempt ended, if one did.
        starts: attempts made.
        process: the running program (stdio), with its last lines of stderr.
    """

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        on_tools: Callable[[McpServer, list[dict[str, Any]]], Awaitable[None]],
        *,
        proxy_url: str | None = None,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        self.name = name
        self.config = config
        self.on_tools = on_tools
        self.proxy_url = proxy_url
        self.backoff = backoff
        self.state = "stopped"
        self.last_error: str | None = None
        self.starts = 0
        self.retry_at: float | None = None
        self.process: StdioProcess | None = None
        self._client: Client | None = None
        self._wanted = trio.Event()
        self._attempt_done = trio.Event()
        self._limiter = trio.CapacityLimiter(config.max_concurrency)
        self._inflight: set[trio.CancelScope] = set()
        self._scope: trio.CancelScope | None = None
        self._reason: str | None = None
        self._relist = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        #: tool listings published so far
        self.listings = 0

    async def changed(self) -> None:
        """Wait for the next change of state or tool listing (tests, the status)."""
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def want(self) -> None:
        """Ask for the server to be started (its first use); idempotent."""
        self._wanted.set()

    @property
    def wanted(self) -> bool:
        """Whether it was asked to start (it runs, or starts, or will again after a wait)."""
        return self._wanted.is_set()

    def status(self) -> dict[str, Any]:
        """Its state, for the log and the status route."""
        status: dict[str, Any] = {"name": self.name, "state": self.state, "starts": self.starts}
        if self.last_error:
            status["last_error"] = self.last_error
        if self.state == "backoff" and self.retry_at is not None:
            status["retry_in"] = round(max(self.retry_at - trio.current_time(), 0.0), 1)
        return status

    async def run(self) -> None:
        """Run the server for as long as the node runs (its attempts and waits)."""
        failures = 0
        while True:
            await self._wanted.wait()
            self.state, self.starts, self._reason = "starting", self.starts + 1, None
            self._notify()
            began = trio.current_time()
            try:
                await self._attempt()
            except Exception as exc:
                self._reason = self._reason or _describe(exc)
            reached = self.state == "running"
            self._client, self.process = None, None
            self._end_calls()
            self.last_error = self._reason or "the connection ended"
            failures = (
                1 if reached and trio.current_time() - began >= STABLE_SECONDS else failures + 1
            )
            delay = backoff_delay(failures, *self.backoff)
            self.state, self.retry_at = "backoff", trio.current_time() + delay
            self._attempt_done.set()
            self._notify()
            log.warning(
                "mcp server %s stopped (%s); starting it again in %g s",
                self.name,
                self.last_error,
                delay,
            )
            await trio.sleep(delay)
            self._attempt_done = trio.Event()

    async def _attempt(self) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                starting = trio.CancelScope()
                nursery.start_soon(self._watchdog, starting)
                async with self._transport(nursery) as transport:
                    try:
                        await self._connected(transport, starting)
                    except Exception as exc:
                        process = self.process
                        if process is not None and self._reason is None:
                            # a connection that ends with its process says best how: its
                            # watcher ends this attempt, with the exit status and stderr
                            with trio.move_on_after(EXIT_GRACE):
                                await process.exited.wait()
                            if process.exited.is_set() and self._reason is None:
                                self._reason = f"the server {process.describe()}"
                        if self._reason is None:  # said before the transport's end says more
                            self._reason = _describe(exc)
                        raise
        # the scope was cancelled: ``_fail`` said why

    async def _connected(self, transport: Any, starting: trio.CancelScope) -> None:
        """Speak MCP over ``transport`` until the connection ends."""
        client = Client(
            transport,
            mode="legacy",
            cache=None,
            message_handler=self._on_message,
            client_info=mcp_types.Implementation(name="turnstile", version="1"),
        )
        async with client:
            await self._list(client)
            starting.cancel()
            self._client, self.state = client, "running"
            self._attempt_done.set()
            self._notify()
            log.info("mcp server %s is running", self.name)
            while True:
                await self._relist.wait()
                self._relist = trio.Event()
                await self._list(client)

    async def _watchdog(self, starting: trio.CancelScope) -> None:
        with starting:
            await trio.sleep(self.config.start_timeout)
            self._fail(f"it did not start within {self.config.start_timeout:g} s")

    @asynccontextmanager
    async def _transport(self, nursery: trio.Nursery) -> AsyncIterator[Any]:
        config = self.config
        if config.command is not None:
            argv = [find_command(config.command[0]), *config.command[1:]]
            env = {name: os.environ[name] for name in config.inherit_env if name in os.environ}
            env.update(config.env)
            if config.egress == "guarded" and self.proxy_url is not None:
                env.update(proxy_environment(self.proxy_url))
            async with open_stdio(argv, env, config.cwd) as (read, write, process):
                self.process = process

                async def watch_exit() -> None:
                    await process.exited.wait()
                    self._fail(f"the server {process.describe()}")

                nursery.start_soon(watch_exit)
                yield _Streams(read, write)
            return
        assert config.url is not None
        headers = {}
        for header, variable in config.headers_env.items():
            if variable not in os.environ:
                raise McpUnavailable(f"environment variable {variable} (header {header}) is unset")
            headers[header] = os.environ[variable]
        http = httpx2.AsyncClient(
            headers=headers,
            proxy=self.proxy_url,
            trust_env=False,
            timeout=httpx2.Timeout(config.call_timeout, read=None),
        )
        async with http, streamable_http_client(config.url, http_client=http) as streams:
            yield _Streams(*streams)

    async def _list(self, client: Client) -> None:
        """List the tools, as raw JSON. The SDK validates a ``tools/list`` answer as a whole
        (``send_request`` checks every result by its method), so one malformed tool would
        cost all the others; its dispatcher (``send_raw_request``, not part of the SDK's
        documented surface: a dependency pinned below 3 for it) hands over the JSON, and
        ``catalog`` leaves out that one tool and keeps the rest."""
        dispatcher = client.session._dispatcher
        listed: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            params = {} if cursor is None else {"cursor": cursor}
            page = await dispatcher.send_raw_request("tools/list", params, {})
            tools = page.get("tools") if isinstance(page, dict) else None
            listed += tools if isinstance(tools, list) else []
            cursor = page.get("nextCursor") if isinstance(page, dict) else None
            if not isinstance(cursor, str):
                break
        await self.on_tools(self, [tool for tool in listed if isinstance(tool, dict)])
        self.listings += 1
        self._notify()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._relist.set()
        elif isinstance(message, Exception):
            log.warning("mcp server %s sent something unreadable: %s", self.name, message)
        await trio.lowlevel.checkpoint()

    def _fail(self, reason: str) -> None:
        """End the connection (once), for ``reason``; calls in flight end with it."""
        if self._reason is None:
            self._reason = reason
        if self._scope is not None:
            self._scope.cancel()
        self._end_calls()

    def _end_calls(self) -> None:
        for scope in self._inflight:
            scope.cancel()

    async def ready(self) -> None:
        """Start the server if nobody has yet, and wait until it runs with its tools listed.

        Raises:
            McpUnavailable: it did not start, or waits to be started again.
        """
        await self._ready()

    async def _ready(self) -> Client:
        self.want()
        if self._client is None and self.state in ("stopped", "starting"):
            await self._attempt_done.wait()
        if self._client is None:
            when = ""
            if self.retry_at is not None:
                when = (
                    f"; it is started again in {max(self.retry_at - trio.current_time(), 0):.0f} s"
                )
            why = self.last_error or "it is not running"
            raise McpUnavailable(f"mcp server {self.name!r} is not running ({why}){when}")
        return self._client

    async def call(
        self, tool: str, arguments: dict[str, Any], idempotency_key: str | None = None
    ) -> mcp_types.CallToolResult:
        """Call ``tool`` (the server's own name for it).

        Raises:
            McpUnavailable: the server is not running.
            McpServerDied: the connection ended during the call.
            McpTimeout: no answer within ``call_timeout`` (the server is then pinged, and
                started again if it does not answer).
            McpProtocolError: the server answered with a JSON-RPC error.
        """
        async with self._limiter:
            client = await self._ready()
            meta = None if idempotency_key is None else {IDEMPOTENCY_META_KEY: idempotency_key}
            timeout = self.config.call_timeout
            scope = trio.CancelScope()
            self._inflight.add(scope)
            try:
                with scope:
                    with trio.move_on_after(timeout) as timer:
                        try:
                            return await client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]
                        except MCPError as exc:
                            if exc.code != mcp_types.CONNECTION_CLOSED:
                                raise McpProtocolError(
                                    f"mcp server {self.name!r} refused the call: "
                                    f"{exc.message[:500]}"
                                ) from None
                            await self._lost(client, _describe(exc))
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
                            await self._lost(client, _describe(exc))
                    if timer.cancelled_caught:
                        self._check_alive(client)
                        raise McpTimeout(
                            f"mcp server {self.name!r} did not answer within {timeout:g} s"
                        )
            finally:
                self._inflight.discard(scope)
            raise McpServerDied(f"mcp server {self.name!r} died during the call ({self._reason})")

    async def _lost(self, client: Client, why: str) -> None:
        """The connection closed under a call: end it (if it is still this one), once the
        process has said how it ended (bounded: a server may close its stdout and live)."""
        process = self.process
        if process is not None and self._client is client:
            with trio.move_on_after(EXIT_GRACE):
                await process.exited.wait()  # its watcher ends the connection, and this call
        if self._client is client:
            if process is not None and process.exited.is_set():  # before its watcher said so
                self._fail(f"the server {process.describe()}")
            else:
                self._fail(f"the connection broke during a call ({why})")
        raise McpServerDied(f"mcp server {self.name!r} died during the call ({self._reason})")

    def _check_alive(self, client: Client) -> None:
        """After a timeout: a server that does not answer a ping either is started again."""
        nursery = self._nursery
        if nursery is None or self._client is not client:
            return

        async def ping() -> None:
            with trio.move_on_after(PING_TIMEOUT) as timer:
                try:
                    with warnings.catch_warnings():  # deprecated in 2026-07-28: legacy here
                        warnings.simplefilter("ignore", MCPDeprecationWarning)
                        await client.send_ping()
                except Exception as exc:
                    self._fail(f"a ping failed after a call timed out ({_describe(exc)})")
                    return
            if timer.cancelled_caught and self._client is client:
                self._fail(
                    f"it did not answer a ping within {PING_TIMEOUT:g} s after a call timed out"
                )

        nursery.start_soon(ping)


class _Streams:
    """A transport (the SDK's protocol: an async context manager of two streams) over
    streams someone else opened and closes."""

    def __init__(self, read: Any, write: Any) -> None:
        self.streams = (read, write)

    async def __aenter__(self) -> Any:
        return self.streams

    async def __aexit__(self, *exc: object) -> None:
        return None


def _describe(exc: BaseException) -> str:
    """A short account of an exception, the first leaf of a group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    if isinstance(exc, MCPError):
        text = exc.message
    return text[:300]
