"""The MCP feature: tools from MCP servers, and (``/mcp``) the node's sessions as an MCP server.

**Tools from MCP servers** (``[mcp.servers.<name>]``, ``actors.mcp.settings``). Each server is an
``McpServer`` (``actors.mcp.server``) run by a task of the node's. Its tools are registered as
``<name>.<tool>`` (``actors.mcp.catalog`` says what is checked and left out) from its last
listing, which the store keeps (kv namespace ``mcp.tools``, with the ``command`` or ``url`` it
came from): such a server is started on first use, the first call of one of its tools. A
server without a kept listing (its first run, a new command) is started when the node opens,
in the background (the node does not wait), since a model can call only the tools it was
shown. Once running, it is started again with backoff when it dies, listed again on
``tools/list_changed`` (the registry follows: tools gone are unregistered, new ones
registered, the store keeps the new list), and stopped with the node. Several nodes each run
their own.

A registered MCP tool is a tool like any other: policies (default from its annotations),
approvals, run_parallel, background_run, watchers, ``tool_search``. Its precheck (run before
an approval is asked) checks who may use it — the user must be among the server's ``users``,
and a session whose ``metadata.mcp.servers`` lists servers may use only those — and the
arguments against the tool's schema; the handler calls the server under its limits
(``max_concurrency``, ``call_timeout``) and shapes the answer (``result_data``): its text,
its structured content, other blocks described, cut at ``max_result_chars``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from turnstile.actors.feature import NodeContext
from turnstile.actors.mcp.catalog import McpTool, catalog
from turnstile.actors.mcp.egress import GuardProxy
from turnstile.actors.mcp.errors import McpBadArguments, McpNotAllowed, McpToolError
from turnstile.actors.mcp.lazy_endpoint import EndpointOnFirstUse
from turnstile.actors.mcp.settings import SERVER_NAME, McpConfig
from turnstile.runtime.errors import InvalidArgument, StoreError
from turnstile.runtime.gateway.routes import HttpRoute
from turnstile.tools.netguard import NetPolicy
from turnstile.tools.registry import ToolCall, ToolRegistry

if TYPE_CHECKING:  # imported where used: the SDK is loaded only by a node that runs servers
    from turnstile.actors.mcp.server import McpServer

__all__ = ["McpFeature", "result_data"]

log = logging.getLogger("turnstile.mcp")

#: What an MCP tool's error message keeps of the server's text.
MAX_ERROR_CHARS = 2_000
#: The store's kv namespace where each server's last tool list is kept (key: its name).
KEPT_TOOLS = "mcp.tools"
#: A tool list larger than this (as JSON) is not kept: the server is started at each start.
MAX_KEPT_BYTES = 1024 * 1024


class McpFeature:
    """``[mcp]``: MCP servers' tools on the node, and the ``/mcp`` endpoint."""

    name = "mcp"
    needs: tuple[str, ...] = ("sessions",)
    after: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.servers: dict[str, McpServer] = {}
        self.proxy: GuardProxy | None = None
        #: registered tool name -> the McpTool it stands for, per server
        self.registered: dict[str, dict[str, McpTool]] = {}
        self._node: NodeContext | None = None
        self.endpoint: EndpointOnFirstUse | None = None

    async def start(self, node: NodeContext) -> None:
        config = node.section("mcp", McpConfig)
        self._node = node
        taken = {name.partition(".")[0] for name in node.tools.names() if "." in name}
        taken |= set(node.tools.names())
        for name, server in config.servers.items():
            where = f"$.mcp.servers.{name}"
            if not re.match(SERVER_NAME, name):
                raise InvalidArgument(
                    "a server's name must be ASCII letters and digits joined by single "
                    f"underscores, got {name!r}",
                    field=where,
                )
            if name in taken:
                raise InvalidArgument(
                    f"server name {name!r} is already the name of tools on the node",
                    field=where,
                )
            if (server.command is None) == (server.url is None):
                raise InvalidArgument("give either command or url", field=where)
            if server.command is not None:
                from turnstile.actors.mcp.stdio import find_command  # (the SDK: see above)

                try:
                    find_command(server.command[0])
                except FileNotFoundError as exc:
                    raise InvalidArgument(str(exc), field=f"{where}.command") from None
            users = set(server.users)
            if "*" in users and len(users) > 1:
                raise InvalidArgument('"*" stands alone in users', field=f"{where}.users")
        try:
            policy = NetPolicy(tuple(config.allowed_hosts), tuple(config.allowed_networks))
        except ValueError as exc:
            raise InvalidArgument(str(exc), field="$.mcp.allowed_networks") from None
        if config.servers:
            self.proxy = GuardProxy(policy)
            node.tools.hiders.append(self.hidden)
        if config.servers:  # the SDK is loaded only here (and by ``/mcp``'s first request)
            from turnstile.actors.mcp.server import McpServer
        for name, server in config.servers.items():
            mcp_server = self.servers[name] = McpServer(
                name,
                server,
                self._publish,
                backoff=(config.backoff_initial, config.backoff_max),
            )
            self.registered[name] = {}
            # tools are registered in ``start``, like every feature's: those of the server's
            # last listing, which the store keeps; it is then started on first use
            kept = await node.store.kv_get(KEPT_TOOLS, name)
            if kept is not None and kept.get("origin") == _origin(mcp_server):
                await self._register_all(mcp_server, kept.get("tools") or [])
                log.info("mcp server %s: tools from its last listing, started on first use", name)
            else:
                mcp_server.want()  # to learn its tools, once the node is open

    async def open(self, node: NodeContext) -> None:
        """Serve ``/mcp``; start the guard proxy and each server's task. A server whose tool
        list the store kept (from an earlier run with the same ``command`` or ``url``; its
        tools were registered in ``start``) is started on first use; any other is started
        now, in the background, to learn its tools."""
        if node.section("mcp", McpConfig).endpoint:
            self.endpoint = EndpointOnFirstUse(
                node.directory, node.tools, node.config.limits.max_frame_bytes
            )
            node.start_soon(self.endpoint.run, name="mcp endpoint")
        if not self.servers:
            return
        assert self.proxy is not None
        proxy_url = await _start(node, self.proxy.serve)
        for server in self.servers.values():
            server.proxy_url = proxy_url
            node.start_soon(server.run, name=f"mcp server {server.name}")

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        if self.endpoint is None:
            return ()
        return self.endpoint.routes()

    # -- the registry follows the servers' tool lists ------------------------------------

    async def _publish(self, server: McpServer, listed: list[dict[str, Any]]) -> None:
        """A listing from the server: the registry follows it, and the store keeps it (what
        passed the catalog), for the node's next start."""
        assert self._node is not None
        taken = await self._register_all(server, listed)
        kept = {"origin": _origin(server), "tools": taken}
        if len(msgspec.json.encode(kept)) <= MAX_KEPT_BYTES:
            try:
                await self._node.store.kv_put(KEPT_TOOLS, [(server.name, kept, None)])
            except StoreError as exc:  # it is started at the next start instead
                log.warning("mcp server %s: its tool list was not kept: %s", server.name, exc)

    async def _register_all(
        self, server: McpServer, listed: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Register the tools of ``listed`` that pass the catalog, unregister the server's
        others; returns the entries that passed."""
        assert self._node is not None
        registry = self._node.tools
        found = catalog(server.name, listed)
        for mcp_name, reason in found.skipped:
            log.warning("mcp server %s: tool %r left out: %s", server.name, mcp_name, reason)
        mine = self.registered[server.name]
        wanted = {tool.name: tool for tool in found.tools}
        for name, tool in list(mine.items()):
            if wanted.get(name) != tool:
                registry.unregister(name)
                del mine[name]
        for name, tool in wanted.items():
            if name in mine:
                continue
            try:
                self._register(registry, server, tool)
            except ValueError as exc:  # a name another feature took meanwhile
                log.warning("mcp server %s: tool %r left out: %s", server.name, name, exc)
                continue
            mine[name] = tool
        log.info("mcp server %s: %d tool(s)", server.name, len(mine))
        passed = {tool.mcp_name for tool in found.tools}
        return [entry for entry in listed if entry.get("name") in passed]

    def _register(self, registry: ToolRegistry, server: McpServer, tool: McpTool) -> None:
        import jsonschema  # only with MCP servers (~0.04 s of every node's start otherwise)

        validator_class = jsonschema.validators.validator_for(
            tool.schema, default=jsonschema.Draft202012Validator
        )
        validator = validator_class(tool.schema)

        async def precheck(call: ToolCall, arguments: dict[str, Any]) -> None:
            await self.check_access(server.name, call)
            error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
            if error is not None:
                path = "$" + "".join(
                    f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.path
                )
                raise McpBadArguments(f"{error.message[:300]} at {path}", field=path)

        async def handler(call: ToolCall, arguments: dict[str, Any]) -> Any:
            await precheck(call, arguments)  # again: what was allowed may have changed
            result = await server.call(tool.mcp_name, arguments, call.idempotency_key)
            data = result_data(result.model_dump(by_alias=True, exclude_none=True))
            if result.is_error:
                text = data.get("text") or "the tool failed"
                raise McpToolError(f"{tool.name}: {text[:MAX_ERROR_CHARS]}")
            return cap(data, server.config.max_result_chars)

        registry.register(
            tool.name,
            dict,
            handler,
            tool.description,
            tool.policy,
            precheck,
            schema=tool.schema,
        )

    # -- who may use a server ---------------------------------------------------------------

    def hidden(self, owner: str, metadata: Mapping[str, Any]) -> frozenset[str]:
        """The tools a session of ``owner`` with ``metadata`` may not use, so its model is
        not shown them (``ToolRegistry.hiders``); ``check_access`` refuses them anyway."""
        narrowed = session_servers(metadata)
        hidden: set[str] = set()
        for name, server in self.servers.items():
            users = server.config.users
            if ("*" not in users and owner not in users) or (
                narrowed is not None and name not in narrowed
            ):
                hidden.update(self.registered[name])
        return frozenset(hidden)

    async def check_access(self, server: str, call: ToolCall) -> None:
        """Refuse a call by a user the server is not for, or in a session that narrows it
        out (``metadata.mcp.servers``).

        Raises:
            McpNotAllowed: the call may not use the server.
        """
        assert self._node is not None
        users = self.servers[server].config.users
        if "*" not in users and call.owner not in users:
            raise McpNotAllowed(f"mcp server {server!r} is not available to this user")
        session = await self._node.store.get_session(call.session_id)
        narrowed = session_servers(session.metadata)
        if narrowed is not None and server not in narrowed:
            raise McpNotAllowed(f"mcp server {server!r} is not among this session's servers")


def _origin(server: McpServer) -> str:
    """What a kept tool list was listed from: a server configured otherwise lists anew."""
    config = server.config
    return msgspec.json.encode([config.command, config.url]).decode()


def session_servers(metadata: Mapping[str, Any]) -> frozenset[str] | None:
    """The servers a session's metadata narrows it to (``{"mcp": {"servers": [...]}}``), or
    None when it does not narrow. Anything malformed there narrows to nothing."""
    mcp = metadata.get("mcp")
    if mcp is None:
        return None
    if not isinstance(mcp, dict) or "servers" not in mcp:
        return frozenset() if not isinstance(mcp, dict) else None
    servers = mcp["servers"]
    if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
        return frozenset()
    return frozenset(servers)


def result_data(result: Mapping[str, Any]) -> dict[str, Any]:
    """A ``CallToolResult`` (as MCP's JSON) as a tool's data: ``text`` (the text blocks,
    joined), ``structured`` (its structured content, if any), ``content`` (the other blocks,
    described but not carried: an image is its type, MIME type and size)."""
    texts: list[str] = []
    others: list[dict[str, Any]] = []
    for block in result.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind in ("image", "audio"):
            others.append(
                {
                    "type": kind,
                    "mimeType": block.get("mimeType"),
                    "bytes": len(block.get("data", "")) * 3 // 4,
                }
            )
        elif kind == "resource_link":
            others.append({"type": kind, "uri": block.get("uri"), "name": block.get("name")})
        elif kind == "resource":
            resource = block.get("resource") or {}
            if "text" in resource:
                texts.append(str(resource["text"]))
            else:
                others.append({"type": kind, "uri": resource.get("uri")})
        else:
            others.append({"type": str(kind)[:50]})
    data: dict[str, Any] = {"text": "\n\n".join(texts)}
    structured = result.get("structuredContent")
    if structured is not None:
        data["structured"] = structured
        try:  # the text is most often the same JSON (as MCP asks of servers): sent once
            if msgspec.json.decode(data["text"]) == structured:
                del data["text"]
        except msgspec.DecodeError:
            pass
    if others:
        data["content"] = others
    return data


#: What ends a cut text.
CUT_MARK = "… [truncated]"


def cap(data: dict[str, Any], limit: int) -> dict[str, Any]:
    """``data`` within ``limit`` characters of JSON: the structured content goes (the text
    says the same; when there is no text, its JSON becomes the text), then the text is cut; a
    cut result says ``truncated`` and how long it was (``chars``)."""
    size = len(msgspec.json.encode(data))
    if size <= limit:
        return data
    text = data.get("text") or ""
    if not text and data.get("structured") is not None:
        text = msgspec.json.encode(data["structured"]).decode()
    cut: dict[str, Any] = {"text": "", "truncated": True, "chars": size}
    if data.get("content"):
        cut["content"] = data["content"][:20]
    if len(msgspec.json.encode(cut)) + len(CUT_MARK) * 2 > limit:
        cut.pop("content", None)
    room = limit - len(msgspec.json.encode(cut)) - len(CUT_MARK) * 2
    kept = text[: max(room, 0)]
    while kept and len(msgspec.json.encode({**cut, "text": kept + CUT_MARK})) > limit:
        kept = kept[: len(kept) * 3 // 4]  # escapes made it longer as JSON
    cut["text"] = kept + CUT_MARK
    return cut


async def _start(node: NodeContext, serve: Any) -> str:
    """Start ``serve`` (a ``task_status`` starter) as a task of the node; its started value."""
    started: list[str] = []
    ready = trio.Event()

    async def run() -> None:
        async with trio.open_nursery() as inner:
            started.append(await inner.start(serve))
            ready.set()

    node.start_soon(run, name="mcp guard proxy")
    await ready.wait()
    return started[0]
