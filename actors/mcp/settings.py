"""The MCP feature's config section, ``[mcp]``: the MCP servers whose tools the node offers,
who may use them, and where their network traffic may go.

Example::

    [mcp.servers.time]                 # a program spoken to over its stdin and stdout
    command = ["mcp-server-time", "--local-timezone", "UTC"]
    env = {}                           # its whole environment, with inherit_env
    inherit_env = []                   # names of the node's variables passed on (e.g. PATH)

    [mcp.servers.docs]                 # a streamable HTTP endpoint
    url = "https://mcp.example.com/mcp"
    headers_env = { Authorization = "DOCS_MCP_TOKEN" }
    users = ["ada"]                    # who may use it ("*": everyone, the default)
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = ["McpConfig", "McpServerConfig"]

#: A server's name is the module part of its tools' names (``time.get_current_time``).
SERVER_NAME = r"^[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*\Z"
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*\Z", max_length=128)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=3600)]


class McpServerConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[mcp.servers.<name>]``: one MCP server; exactly one of ``command`` and ``url``.

    Attributes:
        command: the program and its arguments (no shell); its name is looked up in the
            node's ``PATH``.
        env: the server's environment: these variables and those named in ``inherit_env``,
            nothing else (not the node's ``PATH``, ``HOME`` or secrets).
        inherit_env: names of the node's own variables passed on as they are.
        cwd: its working directory (the node's when unset).
        egress: ``guarded`` (default): the server's ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``
            point at the node's guard proxy, which refuses private, loopback and link-local
            destinations (``[mcp] allowed_hosts`` / ``allowed_networks`` open some);
            ``none``: no proxy variables (a server that needs no network).
        url: a streamable HTTP endpoint, reached through the guard proxy.
        headers_env: HTTP headers sent to ``url``, each value read from the node's environment
            variable named here (a secret stays out of the config file).
        users: users who may use the server's tools; ``["*"]`` (default) for everyone.
        call_timeout: seconds a tool call may take (then ``timeout``).
        start_timeout: seconds the server may take to start and list its tools.
        max_concurrency: calls running at once on the server; the others wait.
        max_result_chars: a result larger than this (as JSON) is cut, and says so.
    """

    command: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    env: dict[EnvName, str] = msgspec.field(default_factory=dict)
    inherit_env: list[EnvName] = msgspec.field(default_factory=list)
    cwd: str | None = None
    egress: Literal["guarded", "none"] = "guarded"
    url: Annotated[str, msgspec.Meta(pattern=r"^https?://", max_length=2000)] | None = None
    headers_env: dict[str, EnvName] = msgspec.field(default_factory=dict)
    users: list[str] = msgspec.field(default_factory=lambda: ["*"])
    call_timeout: Seconds = 60.0
    start_timeout: Seconds = 30.0
    max_concurrency: Annotated[int, msgspec.Meta(ge=1, le=256)] = 4
    max_result_chars: Annotated[int, msgspec.Meta(ge=100, le=10_000_000)] = 100_000


class McpConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[mcp]``.

    Attributes:
        servers: the MCP servers by name (the module part of their tools' names).
        allowed_hosts: destinations the guard proxy lets the servers reach besides the public
            internet: host names (``*.example.com`` for subdomains) or IP literals.
        allowed_networks: CIDR blocks the guard proxy lets them reach.
        backoff_initial: seconds before a server that died is started again the first time;
            it doubles with each failure in a row.
        backoff_max: the longest wait between two starts.
        endpoint: serve ``/mcp``, the node's sessions as an MCP server (docs/mcp.md).
    """

    servers: dict[str, McpServerConfig] = msgspec.field(default_factory=dict)
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    allowed_networks: list[str] = msgspec.field(default_factory=list)
    backoff_initial: Seconds = 1.0
    backoff_max: Seconds = 60.0
    endpoint: bool = True
