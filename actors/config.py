"""The node's configuration: a TOML file (``--config turnstile.toml``), then flags on top.

Example::

    host = "127.0.0.1"
    port = 8765
    store = "sqlite:///turnstile.db"
    agent = "scripted"                 # or "openai"
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

The node's own settings (address, store, users, limits, agent, tool modules and policies) are
defined here; each feature's section is defined in its package (``<feature>/settings.py``) and
only composed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.console.settings import ConsoleConfig
from turnstile.actors.execution.settings import ExecutionConfig
from turnstile.actors.memory.settings import MemoryConfig
from turnstile.actors.notifications.settings import ChannelSettings, NotificationsConfig
from turnstile.actors.scheduling.settings import HeartbeatDefaults
from turnstile.actors.watchers.settings import WatchersConfig
from turnstile.actors.webhooks.settings import WebhooksConfig
from turnstile.runtime.errors import DecodeError
from turnstile.runtime.membership import DEFAULT_LEASE_SECONDS

__all__ = [
    "ChannelSettings",
    "Config",
    "ConsoleConfig",
    "ExecutionConfig",
    "HeartbeatDefaults",
    "Limits",
    "MemoryConfig",
    "NodeConfig",
    "NotificationsConfig",
    "ScriptedConfig",
    "UserConfig",
    "WatchersConfig",
    "WebhooksConfig",
    "load_config",
]

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
#: What the store accepts as a node id (runtime.store._util.check_node_id).
NodeId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")]


class UserConfig(msgspec.Struct, forbid_unknown_fields=True):
    """A user and the bearer token that authenticates them."""

    #: Session keys are ``<user>/<session name>``, so a name holds no ``/`` (and no spaces or
    #: control characters, which would only confuse logs).
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@+-]+\Z")]
    token: Annotated[str, msgspec.Meta(min_length=16)]


class Limits(msgspec.Struct, forbid_unknown_fields=True):
    """Bounds on every input, so no client can grow the server without limit."""

    max_frame_bytes: Positive = 256 * 1024
    max_content_chars: Positive = 32_000
    max_sessions_per_user: Positive = 100
    max_queued_inputs: Positive = 100
    outbox_frames: Positive = 2048
    max_attached_per_connection: Positive = 64
    mailbox_size: Positive = 1000
    history_entries: Positive = 200
    max_jobs_per_session: Positive = 100
    min_job_interval_seconds: Annotated[float, msgspec.Meta(ge=1)] = 60.0
    max_prompt_chars: Positive = 8000
    #: Seconds an HTTP request's head (request line and headers) may take to arrive, counted
    #: from the connection's start or the end of its previous request (also how long an idle
    #: keep-alive connection stays open). A client that trickles bytes is cut off all the same.
    header_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    #: Seconds an HTTP request's body may take to arrive once the handler reads it; after that
    #: the answer is ``408 request_timeout`` and the connection is closed.
    body_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0
    #: Turns started by a schedule (cron, recall, heartbeat, any job) that may run at once on
    #: this node; the rest wait, still queued in their inboxes, in order (recall.md's limit).
    max_concurrent_scheduled_turns: Positive = 3
    #: Times the turn of an input cut off by a crash runs again at the next start-up (its
    #: tool calls carry the same idempotency keys, so receivers that honour them act once). 0,
    #: the default: it is closed as ``interrupted`` and not run again. Bounded, so a turn that
    #: brings the node down cannot do so forever.
    max_turn_reruns: Annotated[int, msgspec.Meta(ge=0, le=10)] = 0


class NodeConfig(msgspec.Struct, forbid_unknown_fields=True):
    """This node among the nodes that share its store (``[node]``; docs/cluster.md)."""

    #: The node's id in the store's ``nodes`` table. Unset: ``local`` on SQLite (one node per
    #: file); on PostgreSQL ``<host name>:<port>`` when serving on a fixed port, else a
    #: generated one, new at every start. A stable id lets a restarted node recover what its
    #: previous epoch left running at once, instead of when that epoch's lease expires. Two
    #: processes must never share one: the later start takes the id over and the earlier
    #: one stops serving.
    id: NodeId | None = None
    #: Seconds a node stays alive for the others without a heartbeat (it beats every third of
    #: it); a dead node's running inputs are recovered at most a third of it after its lease
    #: expired.
    lease_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = DEFAULT_LEASE_SECONDS
    #: Where the node can be reached, as ``turnstile nodes`` shows it; unset: the gateway's
    #: first URL.
    address: Annotated[str, msgspec.Meta(min_length=1, max_length=500)] | None = None
    #: How sessions are placed: ``auto`` (leases on PostgreSQL, where several nodes may share
    #: the store; none on SQLite), ``leases`` (each session is active on one node at a time,
    #: its writes fenced by its lease; ``runtime.placement``) or ``single`` (no leases: only
    #: when this is the one node on its store, for the cost of one acquisition per activation).
    placement: Literal["auto", "leases", "single"] = "auto"
    #: With leases: on SIGTERM, how long a node drains before it stops: it takes no new
    #: sessions or jobs, lets the turns it runs finish, claims nothing more, then stops (what
    #: is still running then is closed as ``interrupted``). 0: stop at once.
    drain_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 30.0


class ScriptedConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Options of the built-in scripted agent."""

    token_delay: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.0


MiB = 1024 * 1024


class HttpModuleConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The ``http`` tool module. Loopback, private and link-local addresses are refused unless
    listed here (checked after DNS resolution and on every redirect)."""

    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    allowed_networks: list[str] = msgspec.field(default_factory=list)
    default_timeout: Annotated[float, msgspec.Meta(gt=0, le=120)] = 30.0
    max_timeout: Annotated[float, msgspec.Meta(gt=0, le=120)] = 120.0
    default_max_bytes: Positive = 1 * MiB
    max_bytes: Annotated[int, msgspec.Meta(ge=1, le=10 * MiB)] = 10 * MiB
    max_download_bytes: Positive = 100 * MiB
    max_request_bytes: Positive = 1 * MiB
    max_redirects: Annotated[int, msgspec.Meta(ge=0, le=20)] = 5
    max_concurrency: Positive = 16


class FilesystemModuleConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The ``filesystem`` tool module: every path stays under ``root``."""

    root: str = "workspace"
    max_read_bytes: Positive = 1 * MiB
    max_write_bytes: Positive = 1 * MiB
    max_list_entries: Positive = 1000
    max_concurrency: Positive = 8


class ShellModuleConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The ``shell`` tool module (BLOCK unless a policy opens it). No shell: argv only."""

    default_timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    max_timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 600.0
    max_output_bytes: Positive = 65536
    inherit_env: list[str] = msgspec.field(
        default_factory=lambda: ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ"]
    )
    allowed_env: list[str] = msgspec.field(
        default_factory=lambda: [
            "LANG",
            "LC_ALL",
            "LC_CTYPE",
            "TZ",
            "TERM",
            "NO_COLOR",
            "PYTHONUNBUFFERED",
        ]
    )
    max_concurrency: Positive = 2


class ModulesConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Tool modules and their limits."""

    http: HttpModuleConfig = msgspec.field(default_factory=HttpModuleConfig)
    filesystem: FilesystemModuleConfig = msgspec.field(default_factory=FilesystemModuleConfig)
    shell: ShellModuleConfig = msgspec.field(default_factory=ShellModuleConfig)


class Config(msgspec.Struct, forbid_unknown_fields=True):
    """Everything ``turnstile serve`` can be told."""

    host: str = "127.0.0.1"
    port: Port = 8765
    store: str = "sqlite:///turnstile.db"
    agent: Literal["scripted", "openai"] = "scripted"
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
