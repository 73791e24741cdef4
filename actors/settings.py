"""The node's own settings: what every feature may read, defined without naming any feature.

``actors/config.py`` composes these with every feature's section (``<feature>/settings.py``)
into the node's ``Config``; a feature sees that whole only as :class:`SharedConfig`, the node's
own settings (``NodeContext.config``), and reads its own section through
``NodeContext.section``. So no feature, and not the hub, imports another feature's settings
through the node's configuration; the import contracts in pyproject.toml check it, imports
under ``TYPE_CHECKING`` included.

Every name here is also importable from ``turnstile.actors.config``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol

import msgspec

from turnstile.runtime.membership import DEFAULT_LEASE_SECONDS

__all__ = [
    "FilesystemModuleConfig",
    "HttpModuleConfig",
    "Limits",
    "ModulesConfig",
    "NodeConfig",
    "NodeId",
    "Port",
    "Positive",
    "ScriptedConfig",
    "SharedConfig",
    "ShellModuleConfig",
    "UserConfig",
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
    #: the user's own address: email channels with ``user_resolver = "users"`` send there
    #: when a notification names no ``to_address`` (docs/tools.md, output channels)
    email: Annotated[
        str, msgspec.Meta(max_length=254, pattern=r"^(|[^@\s,;<>\"]+@[^@\s,;<>\"]+)\Z")
    ] = ""


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
    #: Background tasks (``background_run``, ``http.download`` moved to the background) one
    #: session may have running at once, on every node together.
    max_background_tasks_per_session: Positive = 20
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
    """Options of the built-in agents without a model, `demo` and `scripted`."""

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
    #: Seconds an idle connection is kept for the next call to its origin (0: one per call).
    keepalive_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 30.0


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


class SharedConfig(Protocol):
    """The node's own settings, as every feature reads them (``NodeContext.config``): the
    node's ``Config`` without the features' sections. A feature reads its own section with
    ``NodeContext.section``; another feature's it does not read. Read, never written."""

    host: str
    port: Port
    store: str
    agent: Literal["demo", "scripted", "openai"]
    idle_timeout: float
    allowed_origins: list[str]
    users: list[UserConfig]
    limits: Limits
    scripted: ScriptedConfig
    #: the ``openai`` agent's options (``base_url``, ``model``, …), as the file gives them.
    openai: dict[str, Any]
    #: tool policy overrides: ``"module.action"`` or ``"module.*"`` → AUTO | APPROVE | BLOCK.
    policies: dict[str, str]
    approval_timeout_seconds: float
    modules: ModulesConfig
    node: NodeConfig
