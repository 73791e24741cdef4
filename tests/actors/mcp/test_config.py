"""[mcp] as the node reads it: what stops a node at start-up, naming the key, and a TOML
file's [mcp.servers.<name>] sections."""

from __future__ import annotations

import pytest

from tests.actors.mcp.conftest import MISBEHAVING, TOKENS
from turnstile.actors.config import Config, load_config
from turnstile.actors.mcp import McpConfig, McpServerConfig
from turnstile.actors.node import open_node
from turnstile.runtime.errors import DecodeError, InvalidArgument


@pytest.mark.parametrize(
    ("servers", "field", "message"),
    [
        (
            {"bad-name": McpServerConfig(command=MISBEHAVING)},
            "$.mcp.servers.bad-name",
            "a server's name must be ASCII letters and digits joined by single underscores, "
            "got 'bad-name'",
        ),
        (
            {"http": McpServerConfig(command=MISBEHAVING)},
            "$.mcp.servers.http",
            "server name 'http' is already the name of tools on the node",
        ),
        ({"x": McpServerConfig()}, "$.mcp.servers.x", "give either command or url"),
        (
            {"x": McpServerConfig(command=MISBEHAVING, url="http://a/mcp")},
            "$.mcp.servers.x",
            "give either command or url",
        ),
        (
            {"x": McpServerConfig(command=["no-such-program-here"])},
            "$.mcp.servers.x.command",
            "command 'no-such-program-here' is not found in the node's PATH",
        ),
        (
            {"x": McpServerConfig(command=MISBEHAVING, users=["*", "ada"])},
            "$.mcp.servers.x.users",
            '"*" stands alone in users',
        ),
    ],
)
async def test_what_stops_a_node_at_start(tmp_path, servers, field, message):
    config = Config(store=f"sqlite:///{tmp_path}/n.db", agent="scripted", mcp=McpConfig(servers))
    with pytest.raises(BaseExceptionGroup) as caught:
        async with open_node(config, tokens=TOKENS, serve=False):
            pass  # pragma: no cover
    error, _ = caught.value.split(InvalidArgument)
    while isinstance(error, BaseExceptionGroup):  # the supervisors' nurseries wrap it
        (error,) = error.exceptions
    assert (error.field, str(error)) == (field, message)


def test_a_config_file(tmp_path):
    path = tmp_path / "turnstile.toml"
    path.write_text(
        """
[mcp]
allowed_hosts = ["127.0.0.1"]

[mcp.servers.time]
command = ["mcp-server-time", "--local-timezone", "UTC"]
env = {}

[mcp.servers.docs]
url = "https://mcp.example.com/mcp"
headers_env = { Authorization = "DOCS_MCP_TOKEN" }
users = ["ada"]
call_timeout = 10
"""
    )
    config = load_config(path)
    assert config.mcp.servers["time"].command == ["mcp-server-time", "--local-timezone", "UTC"]
    assert config.mcp.servers["docs"].headers_env == {"Authorization": "DOCS_MCP_TOKEN"}
    assert config.mcp.servers["docs"].users == ["ada"]
    assert config.mcp.servers["time"].users == ["*"]
    assert config.mcp.allowed_hosts == ["127.0.0.1"]
    path.write_text('[mcp.servers.x]\ncommand = ["a"]\nshell = true\n')
    with pytest.raises(DecodeError) as caught:  # unknown keys are errors, with their path
        load_config(path)
    assert caught.value.field == "$.mcp.servers[...].shell"  # msgspec's path through a dict
