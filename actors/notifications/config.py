"""What the notifier is configured with and what it accepts: channels, bounds, errors.

This module holds the channel types and priorities, the bounds a notification is checked
against, ``ChannelConfig`` and ``NotifierConfig`` (validated when built), the errors a caller
sees (``UnknownChannel``, ``NotificationFailed``) and ``_Notification``, the checked
notification every delivery path takes. It is separate from the notifier so that the data and its
validation read apart from the delivery code, and so that the delivery modules (``buffer.py``,
``channels.py``) share it without importing each other or the notifier.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from turnstile.runtime.errors import InvalidArgument, TurnstileError

CHANNEL_TYPES = ("llm_notification", "webhook", "log", "email")
PRIORITIES = ("low", "normal", "high", "urgent")
#: Priorities accepted under another name (the reference says ``critical``).
PRIORITY_ALIASES = {"critical": "urgent"}
MAX_MESSAGE_CHARS = 10_000
MAX_TITLE_CHARS = 200
MAX_TAGS = 20
MAX_TAG_CHARS = 64
LLM = "llm_notification"
#: ``output_config`` keys each channel type understands.
OUTPUT_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "llm_notification": (),
    "webhook": (),
    "log": (),
    "email": ("to_address",),
}
#: What a log channel's ``level`` may be (``logging``'s names, any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: How a log channel writes a notification: one JSON object, or one line of text.
LOG_FORMATS = ("json", "text")
#: Where an email channel's ``user_resolver`` finds the session owner's address: ``users``,
#: the node's ``[[users]]`` ``email``.
USER_RESOLVERS = ("users",)
#: ``async (user) -> address or None``: the email address of a session's owner.
UserResolver = Callable[[str], Awaitable[str | None]]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ADDRESS = re.compile(r"[^@\s,;<>\"]+@[^@\s,;<>\"]+\.[^@\s,;<>\"]+|[^@\s,;<>\"]+@localhost")


#: ``async (url, headers, body, timeout) -> (status code, reason phrase)``: one webhook POST.
#: Raises ``DeliveryError`` (``channels.py``); ``timeout`` bounds the attempt (the notifier
#: also cancels it then). Here, not in ``channels.py``, so that ``base.py`` declares it without
#: importing the module that builds on it.
WebhookPost = Callable[[str, dict[str, str], bytes, float], Awaitable[tuple[int, str]]]


class NotificationFailed(TurnstileError):
    """A notification could not be delivered, not even through the fallback."""

    code = "notification_failed"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownChannel(InvalidArgument):
    """No channel has that name; the message lists the configured ones.

    Attributes:
        channels: the configured channel names, sorted.
    """

    code = "unknown_channel"

    def __init__(self, name: str, channels: Sequence[str]) -> None:
        super().__init__(
            f"no channel named {name!r}; configured channels: {', '.join(channels)}",
            field="channel",
        )
        self.channels = list(channels)


@dataclass(frozen=True)
class ChannelConfig:
    """One output channel, as declared in the config.

    Attributes:
        name: what ``send_notification(channel=…)`` calls it.
        type: ``llm_notification``, ``webhook``, ``log`` or ``email``.
        fallback: deliver through ``llm_notification`` when this channel fails (else raise).
        url: webhook — the http(s) URL to POST to.
        headers: webhook — extra request headers (e.g. an authorization token).
        timeout: webhook and email — seconds per attempt.
        retries: webhook — attempts after the first, on 5xx / connection errors / timeouts.
        backoff_seconds: webhook — the first wait between attempts, doubled each time.
        path: log — the file to append lines to (its directory must exist).
        logger_name: log — a Python logger to log each notification to (``logging``), as
            well as or instead of ``path``; the host application's handlers take it from there.
        level: log — the level of those records (``DEBUG`` … ``CRITICAL``).
        format: log — ``json`` (one JSON object a line, the default) or ``text`` (one
            human-readable line: priority, title, message, session).
        host, port: email — the SMTP server.
        from_address: email — the sender.
        to: email — default recipients.
        starttls: email — upgrade the connection with STARTTLS.
        ssl: email — implicit TLS (SMTPS, usually port 465); not with ``starttls``.
        username, password: email — SMTP login, if the server needs one.
        allowed_recipients: email — addresses ``output_config.to_address`` may name besides
            ``to``: exact (case-insensitive) or a whole domain as ``*@example.com``.
        subject_prefix: email — put before every subject.
        helo_name: email — the name announced in EHLO (no DNS lookup of our own name).
        user_resolver: email — ``users``: with no ``output_config.to_address``, send to the
            session owner's own address (``[[users]] email``), before ``to``.
    """

    name: str
    type: str
    fallback: bool = True
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 10.0
    retries: int = 3
    backoff_seconds: float = 0.5
    path: str = ""
    host: str = ""
    port: int = 25
    from_address: str = ""
    to: tuple[str, ...] = ()
    starttls: bool = False
    ssl: bool = False
    username: str | None = None
    password: str | None = None
    allowed_recipients: tuple[str, ...] = ()
    subject_prefix: str = ""
    helo_name: str = "localhost"
    logger_name: str = ""
    level: str = "INFO"
    format: str = "json"
    user_resolver: str = ""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(
                f"channel name must be 1-64 letters, digits, '_', '.' or '-', got {self.name!r}"
            )
        if self.type not in CHANNEL_TYPES:
            raise ValueError(
                f"channel {self.name!r}: type must be one of {', '.join(CHANNEL_TYPES)}, "
                f"got {self.type!r}"
            )
        if self.name == LLM and self.type != LLM:
            raise ValueError(f"channel {LLM!r} must have type {LLM!r}")
        if not 0 < self.timeout <= 300:
            raise ValueError(f"channel {self.name!r}: timeout must be > 0 and <= 300")
        if self.type == "webhook":
            if not self.url:
                raise ValueError(f"channel {self.name!r}: a webhook needs a url")
            try:
                url = httpx.URL(self.url)
            except (httpx.InvalidURL, TypeError, ValueError) as exc:
                raise ValueError(f"channel {self.name!r}: not a valid url: {exc}") from None
            if url.scheme not in ("http", "https") or not url.host:
                raise ValueError(f"channel {self.name!r}: the url must be http(s) with a host")
            if not 0 <= self.retries <= 10:
                raise ValueError(f"channel {self.name!r}: retries must be >= 0 and <= 10")
            if not 0 <= self.backoff_seconds <= 60:
                raise ValueError(f"channel {self.name!r}: backoff_seconds must be >= 0, <= 60")
            for name, value in self.headers.items():
                if any(c in f"{name}{value}" for c in "\r\n\x00"):
                    raise ValueError(f"channel {self.name!r}: header {name!r} has a line break")
        elif self.type == "log":
            if not self.path and not self.logger_name:
                raise ValueError(
                    f"channel {self.name!r}: a log channel needs a path or a logger_name"
                )
            if self.level.upper() not in LOG_LEVELS:
                raise ValueError(
                    f"channel {self.name!r}: level must be one of {', '.join(LOG_LEVELS)}, "
                    f"got {self.level!r}"
                )
            if self.format not in LOG_FORMATS:
                raise ValueError(
                    f"channel {self.name!r}: format must be json or text, got {self.format!r}"
                )
        elif self.type == "email":
            if not self.host or not self.from_address:
                raise ValueError(f"channel {self.name!r}: email needs host and from_address")
            if not 0 < self.port <= 65535:
                raise ValueError(f"channel {self.name!r}: port must be 1-65535")
            if self.starttls and self.ssl:
                raise ValueError(f"channel {self.name!r}: starttls and ssl are exclusive")
            for address in (self.from_address, *self.to):
                if not _ADDRESS.fullmatch(address):
                    raise ValueError(f"channel {self.name!r}: not an address: {address!r}")
            if self.user_resolver and self.user_resolver not in USER_RESOLVERS:
                raise ValueError(
                    f"channel {self.name!r}: user_resolver must be 'users', "
                    f"got {self.user_resolver!r}"
                )
        if self.user_resolver and self.type != "email":
            raise ValueError(f"channel {self.name!r}: only an email channel has a user_resolver")


@dataclass(frozen=True)
class NotifierConfig:
    """The notifier's channels and bounds.

    Attributes:
        channels: the declared channels (``llm_notification`` is added when missing).
        max_buffered: notification events kept per session while no client is attached.
        buffer_ttl_seconds: how long a buffered event is kept (default 24 h).
        max_concurrency: external deliveries (webhook, log, email) in flight at once.
        max_structured_bytes: largest ``structured_data``, JSON-encoded.
    """

    channels: tuple[ChannelConfig, ...] = ()
    max_buffered: int = 100
    buffer_ttl_seconds: float = 86400.0
    max_concurrency: int = 16
    max_structured_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise ValueError("channel names must be unique")
        if self.max_buffered < 1 or self.max_concurrency < 1:
            raise ValueError("max_buffered and max_concurrency must be >= 1")
        if self.buffer_ttl_seconds <= 0 or self.max_structured_bytes < 2:
            raise ValueError("buffer_ttl_seconds must be > 0 and max_structured_bytes >= 2")


@dataclass(frozen=True)
class _Notification:
    id: str
    session_id: str
    owner: str
    channel: ChannelConfig
    message: str
    title: str
    priority: str
    tags: tuple[str, ...]
    structured_data: dict[str, Any]
    source: str
    created_at: str
    recipients: tuple[str, ...] = ()
    #: Sent as ``Idempotency-Key`` by the webhook channel: the turn's tool call key when the
    #: notification comes from one, else the notification's id (the same for every retry).
    idempotency_key: str | None = None

    def record(self) -> dict[str, Any]:
        """What webhooks and log lines carry."""
        return {
            "id": self.id,
            "channel": self.channel.name,
            "session_id": self.session_id,
            "source": self.source,
            "priority": self.priority,
            "title": self.title,
            "message": self.message,
            "tags": list(self.tags),
            "structured_data": self.structured_data,
            "created_at": self.created_at,
        }


def _one_line(text: str) -> str:
    return " ".join(text.split())
