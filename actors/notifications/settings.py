"""The notifications feature's config sections: ``[channels.<name>]`` and ``[notifications]``.

Read by ``turnstile.actors.config.Config`` (the node's file) and turned into the notifier's own
``ChannelConfig``/``NotifierConfig`` when the feature starts.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = ["ChannelSettings", "NotificationsConfig"]

Positive = Annotated[int, msgspec.Meta(ge=1)]


class ChannelSettings(msgspec.Struct, forbid_unknown_fields=True):
    """One output channel, ``[channels.<name>]`` (see docs/tools.md)."""

    type: Literal["llm_notification", "webhook", "log", "email"]
    fallback: bool = True
    url: str = ""  # webhook
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    timeout: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    backoff_seconds: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.5
    path: str = ""  # log: a file, and/or
    logger_name: str = ""  # a Python logger
    level: str = "INFO"
    format: Literal["json", "text"] = "json"
    host: str = ""  # email
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 25
    from_address: str = ""
    to: list[str] = msgspec.field(default_factory=list)
    starttls: bool = False
    ssl: bool = False
    username: str | None = None
    password: str | None = None
    allowed_recipients: list[str] = msgspec.field(default_factory=list)
    subject_prefix: str = ""
    helo_name: str = "localhost"
    user_resolver: Literal["", "users"] = ""  # email: the session owner's [[users]] email


class NotificationsConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Buffering of notifications for sessions nobody is watching."""

    max_buffered: Positive = 100
    buffer_ttl_seconds: Annotated[float, msgspec.Meta(gt=0)] = 86400.0
    max_concurrency: Positive = 16
    max_structured_bytes: Annotated[int, msgspec.Meta(ge=2)] = 16384
