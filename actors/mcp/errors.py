"""The MCP feature's errors, each a tool result's ``code`` (``TurnstileError`` subclasses).

::

    TurnstileError
    ├── McpUnavailable        mcp_unavailable   the server is not running (starting, backing off)
    ├── McpServerDied         mcp_server_died   the server died (or broke the protocol) mid-call
    ├── McpTimeout            timeout           the call took longer than ``call_timeout``
    ├── McpToolError          tool_error        the server answered the call with ``isError``
    ├── McpProtocolError      mcp_error         the server answered with a JSON-RPC error
    ├── McpBadArguments       bad_arguments     the arguments do not fit the tool's schema
    └── McpNotAllowed         not_allowed       the user, or the session, may not use the server
"""

from __future__ import annotations

from turnstile.runtime.errors import TurnstileError

__all__ = [
    "McpBadArguments",
    "McpNotAllowed",
    "McpProtocolError",
    "McpServerDied",
    "McpTimeout",
    "McpToolError",
    "McpUnavailable",
]


class McpUnavailable(TurnstileError):
    """The server is not running: it could not be started, or waits to be started again."""

    code = "mcp_unavailable"


class McpServerDied(TurnstileError):
    """The server died, or broke the protocol, while the call ran."""

    code = "mcp_server_died"


class McpTimeout(TurnstileError):
    """The call took longer than the server's ``call_timeout``."""

    code = "timeout"


class McpToolError(TurnstileError):
    """The server ran the tool and reported a failure (``isError``); the message is its text."""

    code = "tool_error"


class McpProtocolError(TurnstileError):
    """The server refused the request with a JSON-RPC error."""

    code = "mcp_error"


class McpBadArguments(TurnstileError):
    """The arguments do not fit the tool's input schema; ``field`` is the JSON path."""

    code = "bad_arguments"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class McpNotAllowed(TurnstileError):
    """The user may not use the server, or the session's metadata narrows it out."""

    code = "not_allowed"
