"""The MCP feature: tools from MCP servers, and the node's sessions as an MCP server."""

from turnstile.actors.mcp.feature import McpFeature
from turnstile.actors.mcp.settings import McpConfig, McpServerConfig

__all__ = ["McpConfig", "McpFeature", "McpServerConfig"]
