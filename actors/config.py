"""The node's configuration: a TOML file (``--config turnstile.toml``), then flags on top.

Example::

    host = "127.0.0.1"
    port = 8765
    store = "sqlite:///turnstile.db"
    agent = "demo"                     # or "scripted" (echo), "openai"
    allowed_origins = ["http://localhost:5173"]

    [[users]]
    name = "ada"
    token = "a-long-random-secret"

    [limits]
    max_sessions_per_user = 100

    [scripted]
    token_delay = 0.02

    [openai]
    base_url = "http://127.0.0.1:11434/v1"
    model = "llama3.1"

    [execution]
    watchers = true                    # watch_* schemas in every turn
    max_context_tokens = 8000

    [watchers]
    max_per_session = 20

    [node]                             # several nodes on one PostgreSQL: docs/cluster.md
    id = "node-a"
    lease_seconds = 15

Unknown keys are errors (a typo should not silently change nothing), reported with their path.

This is the one place, with the composition root (``actors/node.py``) and the CLI, that knows
every feature: the node's own settings (address, store, users, limits, agent, tool modules and
policies) are defined in ``actors/settings.py``, which names no feature, and re-exported here;
each feature's section is defined in its package (``<feature>/settings.py``) and only composed
here. A feature sees the node's settings as ``settings.SharedConfig`` and reads its own section
with ``NodeContext.section``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.console.settings import ConsoleConfig
from turnstile.actors.execution.settings import ExecutionConfig
from turnstile.actors.mcp.settings import McpConfig, McpServerConfig
from turnstile.actors.memory.settings import MemoryConfig
from turnstile.actors.notifications.settings import ChannelSettings, NotificationsConfig
from turnstile.actors.scheduling.settings import HeartbeatDefaults
from turnstile.actors.settings import (
    FilesystemModuleConfig,
    HttpModuleConfig,
    Limits,
    ModulesConfig,
    NodeConfig,
    Port,
    ScriptedConfig,
    SharedConfig,
    ShellModuleConfig,
    UserConfig,
)
from turnstile.actors.watchers.settings import WatchersConfig
from turnstile.actors.webhooks.settings import WebhooksConfig
from turnstile.runtime.errors import DecodeError

__all__ = [
    "ChannelSettings",
    "Config",
    "ConsoleConfig",
    "ExecutionConfig",
    "FilesystemModuleConfig",
    "HeartbeatDefaults",
    "HttpModuleConfig",
    "Limits",
    "McpConfig",
    "McpServerConfig",
    "MemoryConfig",
    "ModulesConfig",
    "NodeConfig",
    "NotificationsConfig",
    "ScriptedConfig",
    "SharedConfig",
    "ShellModuleConfig",
    "UserConfig",
    "WatchersConfig",
    "WebhooksConfig",
    "load_config",
]


class Config(msgspec.Struct, forbid_unknown_fields=True):
    """Everything ``turnstile serve`` can be told."""

    host: str = "127.0.0.1"
    port: Port = 8765
    store: str = "sqlite:///turnstile.db"
    agent: Literal["demo", "scripted", "openai"] = "demo"
    idle_timeout: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    users: list[UserConfig] = msgspec.field(default_factory=list)
    limits: Limits = msgspec.field(default_factory=Limits)
    scripted: ScriptedConfig = msgspec.field(default_factory=ScriptedConfig)
    openai: dict[str, Any] = msgspec.field(default_factory=dict)
    #: Tool policy overrides: ``"module.action"`` or ``"module.*"`` → AUTO | APPROVE | BLOCK.
    policies: dict[str, str] = msgspec.field(default_factory=dict)
    approval_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 300.0
    modules: ModulesConfig = msgspec.field(default_factory=ModulesConfig)
    channels: dict[str, ChannelSettings] = msgspec.field(default_factory=dict)
    notifications: NotificationsConfig = msgspec.field(default_factory=NotificationsConfig)
    heartbeat: HeartbeatDefaults = msgspec.field(default_factory=HeartbeatDefaults)
    execution: ExecutionConfig = msgspec.field(default_factory=ExecutionConfig)
    watchers: WatchersConfig = msgspec.field(default_factory=WatchersConfig)
    memory: MemoryConfig = msgspec.field(default_factory=MemoryConfig)
    webhooks: WebhooksConfig = msgspec.field(default_factory=WebhooksConfig)
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)
    node: NodeConfig = msgspec.field(default_factory=NodeConfig)


def load_config(path: str | Path | None) -> Config:
    """Read a TOML config file (or return the defaults for None).

    Raises:
        DecodeError: the file is not valid TOML or a value is wrong; ``field`` names it.
        OSError: the file cannot be read.
    """
    if path is None:
        return Config()
    data = Path(path).read_bytes()
    try:
        config = msgspec.toml.decode(data, type=Config)
    except msgspec.ValidationError as exc:
        from turnstile.runtime.codec import _decode_error

        raise _decode_error(exc) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(f"{path}: not valid TOML: {exc}") from None
    for pattern, value in config.policies.items():
        if str(value).upper() not in ("AUTO", "APPROVE", "BLOCK"):
            raise DecodeError(
                f"policy must be AUTO, APPROVE or BLOCK, got {value!r}",
                field=f"$.policies.{pattern}",
            )
    names = [user.name for user in config.users]
    if len(set(names)) != len(names):
        raise DecodeError("user names must be unique", field="$.users")
    tokens = [user.token for user in config.users]
    if len(set(tokens)) != len(tokens):
        raise DecodeError("user tokens must be unique", field="$.users")
    return config
