"""Output channels: notifications into the session, to webhooks, log files and email.

``send_notification`` (``tools/notify.py``), scheduled jobs and watchers all call
``Notifier.notify(session_id, owner, channel, message, …)``. ``channel`` names one of the
channels declared in the config (a ``ChannelConfig`` each); ``llm_notification`` is always
there. The channel types:

* ``llm_notification`` — into the session. The agent gets it as an ``Inject`` (folded into the
  running turn, or a turn of its own when the session is idle) whose text starts with
  ``[NOTIFICATION]``; attached clients get a ``notification`` event (``Publish``).
* ``webhook`` — a JSON ``POST``, retried with exponential backoff (``backoff_seconds``,
  doubled each time: 0.5 s, 1 s, 2 s for ``retries = 3``) on a 5xx answer, a connection error
  or a timeout — never on a 4xx, a redirect or a refused address. Each attempt is bounded by
  ``timeout``. The POST itself is injected (``WebhookPost``): ``actors`` may not import
  ``tools``, and the node passes ``tools.notify.guarded_webhook_post``, which goes through the
  SSRF guard (``tools.netguard``) with the http module's allow-list.
* ``log`` — one JSON object per line, appended to ``path`` from a worker thread.
* ``email`` — ``smtplib`` in a worker thread (STARTTLS or implicit TLS, optional login).

**Fallback.** When a webhook, log or email delivery fails, the notification is delivered through
``llm_notification`` instead and says so: its text carries ``delivery via webhook failed:
<reason>; delivered here instead``, and the result has ``fallback: true`` and
``fallback_reason``. A channel with ``fallback = false`` raises ``NotificationFailed`` instead.

**What is injected, what is buffered.** The agent always gets an ``llm_notification`` (and every
fallback) as an ``Inject``, whether or not a client is attached — the agent never misses one.
The *client-facing* ``notification`` event is published at once when the session has an
attached client; when it has none, the event is not written to the session log but kept in the
store's key-value table (namespace ``notify:<session_id>``, keys zero-padded sequence numbers so
key order is arrival order, expiring after ``buffer_ttl_seconds``, at most ``max_buffered`` per
session, oldest dropped first). ``deliver_buffered`` publishes them, in order, when a client
attaches: a ``notifications_dropped`` event first when some were dropped (``dropped: 5``), then
each as a ``notification`` event with ``buffered: true`` and its original ``created_at``.
Notifications to external channels (webhook, log, email) that succeed produce no session event.

**Order.** Everything the notifier does for one session — the attached-or-not decision, the
publish or buffer, the inject, delivering the buffer — happens under that session's lock, and a
notification for an attached session first flushes anything still buffered, so clients see
notifications in arrival order even if a notification races with an attach.

**Why a service object, not an actor.** Deliveries must run concurrently (one webhook retrying
for seconds must not hold up another session's notification), and every caller needs the
outcome (``fallback``, ``attempts``) — an actor would either serialise them in its mailbox or
spawn tasks and route replies back by hand. The notifier holds no long-lived resource (a client
per webhook delivery, a file opened per line, an SMTP connection per message) and no state
worth restoring after a crash: the buffer is in the store, and the only memory is the
per-session locks. So ``notify`` runs in the caller's task: its errors go to the caller, and a
cancelled caller (an interrupted turn) cancels its delivery. ``max_concurrency`` bounds the
external deliveries in flight.
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import smtplib
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.message import EmailMessage
from typing import Any

import httpx
import trio

from turnstile.actors.sessions.actor import GetStatus, Inject, Publish
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument, LimitExceeded, TurnstileError
from turnstile.runtime.store import Store

__all__ = [
    "CHANNEL_TYPES",
    "PRIORITIES",
    "MAX_MESSAGE_CHARS",
    "ChannelConfig",
    "NotifierConfig",
    "Notifier",
    "NotificationFailed",
    "UnknownChannel",
    "DeliveryError",
    "WebhookPost",
    "notification_text",
]

log = logging.getLogger("turnstile.notifier")

CHANNEL_TYPES = ("llm_notification", "webhook", "log", "email")
PRIORITIES = ("low", "normal", "high", "urgent")
#: Priorities accepted under another name (the reference says ``critical``).
PRIORITY_ALIASES = {"critical": "urgent"}
MAX_MESSAGE_CHARS = 10_000
MAX_TITLE_CHARS = 200
MAX_TAGS = 20
MAX_TAG_CHARS = 64
LLM = "llm_notification"
USER_AGENT = "turnstile-notifier/0.1"
#: ``output_config`` keys each channel type understands.
OUTPUT_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "llm_notification": (),
    "webhook": (),
    "log": (),
    "email": ("to_address",),
}
_EMAIL_PRIORITY = {"urgent": "1 (Highest)", "high": "2 (High)", "normal": "3 (Normal)", "low": "5"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ADDRESS = re.compile(r"[^@\s,;<>\"]+@[^@\s,;<>\"]+\.[^@\s,;<>\"]+|[^@\s,;<>\"]+@localhost")

#: Shielded clean-up after a cancelled buffer delivery is bounded by this.
CLEANUP_GRACE_SECONDS = 5.0


class NotificationFailed(TurnstileError):
    """A notification could not be delivered, not even through the fallback."""

    code = "notification_failed"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class DeliveryError(Exception):
    """A webhook POST failed (raised by a ``WebhookPost``).

    Attributes:
        reason: short and human-readable; it ends up in the fallback note.
        retriable: whether another attempt may succeed (a connection error, a timeout), or
            not (a refused address, a redirect).
    """

    def __init__(self, reason: str, *, retriable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retriable = retriable


#: ``async (url, headers, body, timeout) -> (status code, reason phrase)``: one webhook POST.
#: Raises ``DeliveryError``; ``timeout`` bounds the attempt (the notifier also cancels it then).
WebhookPost = Callable[[str, dict[str, str], bytes, float], Awaitable[tuple[int, str]]]


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
        path: log — the file to append JSON lines to (its directory must exist).
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
            if not self.path:
                raise ValueError(f"channel {self.name!r}: a log channel needs a path")
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


class _DeliveryFailed(Exception):
    def __init__(self, reason: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail or {}


def notification_text(
    *,
    message: str,
    title: str = "",
    priority: str = "normal",
    tags: Sequence[str] = (),
    structured_data: Mapping[str, Any] | None = None,
    failed: tuple[ChannelConfig, str] | None = None,
) -> str:
    """The text the agent gets for a notification.

    ``[NOTIFICATION] <title> (priority=…, tags=…)``, then — for a fallback — ``Note: delivery
    via <type> failed: <reason>; delivered here instead (channel '<name>').``, the message, and
    ``Data: <json>`` when there is structured data.
    """
    head = "[NOTIFICATION]" + (f" {title}" if title else "")
    meta = [f"priority={priority}"]
    if tags:
        meta.append(f"tags={','.join(tags)}")
    lines = [f"{head} ({', '.join(meta)})"]
    if failed is not None:
        channel, reason = failed
        lines.append(
            f"Note: delivery via {channel.type} failed: {reason}; delivered here instead "
            f"(channel '{channel.name}')."
        )
    lines.append(message)
    if structured_data:
        lines.append("Data: " + json.dumps(structured_data, ensure_ascii=False, default=str))
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


class Notifier:
    """Delivers notifications through the configured channels. See the module docstring.

    Args:
        store: keeps the per-session buffer (key-value table).
        clock: wall time for ``created_at`` and buffer expiry (the store's clock).
        ask_session: ``async (session_id, message) -> answer`` — asks a session actor
            (``GetStatus``, ``Publish``, ``Inject``).
        config: channels and bounds.
        webhook_post: sends one webhook POST (``tools.notify.guarded_webhook_post``); needed
            when a webhook channel is configured.

    Raises:
        ValueError: a webhook channel is configured but no ``webhook_post`` given.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        ask_session: Callable[[str, Any], Awaitable[Any]],
        config: NotifierConfig | None = None,
        *,
        webhook_post: WebhookPost | None = None,
    ) -> None:
        config = config or NotifierConfig()
        self.store = store
        self.clock = clock
        self.ask_session = ask_session
        self.config = config
        channels = {c.name: c for c in config.channels}
        channels.setdefault(LLM, ChannelConfig(name=LLM, type=LLM))
        self.channels: dict[str, ChannelConfig] = dict(sorted(channels.items()))
        if webhook_post is None and any(c.type == "webhook" for c in config.channels):
            raise ValueError("webhook channels need a webhook_post")
        self.webhook_post = webhook_post
        self.limiter = trio.CapacityLimiter(config.max_concurrency)
        self._locks: dict[str, list[Any]] = {}  # session or path -> [trio.Lock, users]

    # -- checks (also for scheduled jobs and watchers, at creation time) --

    def check_channel(
        self, channel: str, output_config: Mapping[str, Any] | None = None
    ) -> ChannelConfig:
        """The channel named ``channel``, if ``output_config`` suits it.

        Raises:
            UnknownChannel: no such channel (the message lists the configured ones).
            InvalidArgument: ``output_config`` has a key the channel does not take, or names
                a recipient that is not allowed.
        """
        config = self.channels.get(channel)
        if config is None:
            raise UnknownChannel(channel, list(self.channels))
        self._recipients(config, output_config or {})
        return config

    def _recipients(self, channel: ChannelConfig, output_config: Mapping[str, Any]) -> tuple:
        allowed = OUTPUT_CONFIG_KEYS[channel.type]
        for key in output_config:
            if key not in allowed:
                supported = ", ".join(allowed) if allowed else "none"
                raise InvalidArgument(
                    f"output_config key {key!r} is not supported by {channel.type} channels "
                    f"(supported: {supported})",
                    field="output_config",
                )
        if channel.type != "email":
            return ()
        wanted = output_config.get("to_address")
        if wanted is None:
            if not channel.to:
                raise InvalidArgument(
                    f"channel {channel.name!r} has no default recipient; "
                    "give output_config.to_address",
                    field="output_config.to_address",
                )
            return tuple(channel.to)
        addresses = [wanted] if isinstance(wanted, str) else wanted
        if (
            not isinstance(addresses, list)
            or not 1 <= len(addresses) <= 20
            or not all(isinstance(a, str) for a in addresses)
        ):
            raise InvalidArgument(
                "to_address must be an address or a list of 1-20 addresses",
                field="output_config.to_address",
            )
        for address in addresses:
            if len(address) > 254 or not _ADDRESS.fullmatch(address):
                raise InvalidArgument(
                    f"not an email address: {address!r}", field="output_config.to_address"
                )
            if not self._recipient_allowed(channel, address):
                raise InvalidArgument(
                    f"channel {channel.name!r} may not send to {address!r}",
                    field="output_config.to_address",
                )
        return tuple(addresses)

    @staticmethod
    def _recipient_allowed(channel: ChannelConfig, address: str) -> bool:
        address = address.lower()
        domain = address.rsplit("@", 1)[1]
        for entry in (*channel.to, *channel.allowed_recipients):
            entry = entry.lower()
            if entry == address or entry in (f"*@{domain}", f"@{domain}"):
                return True
        return False

    def _prepare(
        self,
        session_id: str,
        owner: str,
        channel: str,
        message: str,
        *,
        title: str,
        priority: str,
        tags: Sequence[str],
        structured_data: Mapping[str, Any] | None,
        output_config: Mapping[str, Any] | None,
        source: str,
        truncate: bool,
    ) -> _Notification:
        config = self.channels.get(channel)
        if config is None:
            raise UnknownChannel(channel, list(self.channels))
        if not isinstance(message, str) or not message:
            raise InvalidArgument("message must be a non-empty string", field="message")
        if len(message) > MAX_MESSAGE_CHARS:
            if not truncate:
                raise InvalidArgument(
                    f"message is longer than {MAX_MESSAGE_CHARS} characters", field="message"
                )
            note = f"… (truncated from {len(message)} chars)"
            message = message[: MAX_MESSAGE_CHARS - len(note)] + note
        title = _one_line(title or "")
        if len(title) > MAX_TITLE_CHARS:
            raise InvalidArgument(
                f"title is longer than {MAX_TITLE_CHARS} characters", field="title"
            )
        priority = PRIORITY_ALIASES.get(priority, priority)
        if priority not in PRIORITIES:
            raise InvalidArgument(
                f"priority must be one of {', '.join(PRIORITIES)}, got {priority!r}",
                field="priority",
            )
        tags = tuple(tags or ())
        if len(tags) > MAX_TAGS or not all(
            isinstance(t, str) and 0 < len(t) <= MAX_TAG_CHARS for t in tags
        ):
            raise InvalidArgument(
                f"tags must be at most {MAX_TAGS} strings of 1-{MAX_TAG_CHARS} characters",
                field="tags",
            )
        data = dict(structured_data or {})
        try:
            size = len(json.dumps(data, ensure_ascii=False).encode())
        except (TypeError, ValueError):
            raise InvalidArgument("structured_data must be JSON", field="structured_data") from None
        if size > self.config.max_structured_bytes:
            raise LimitExceeded(
                f"structured_data is {size} bytes as JSON; the limit is "
                f"{self.config.max_structured_bytes}",
                field="structured_data",
            )
        recipients = self._recipients(config, output_config or {})
        return _Notification(
            id=f"ntf-{uuid.uuid4().hex[:12]}",
            session_id=session_id,
            owner=owner,
            channel=config,
            message=message,
            title=title,
            priority=priority,
            tags=tags,
            structured_data=data,
            source=source,
            created_at=_iso(self.clock.now()),
            recipients=recipients,
        )

    # -- the entry point --

    async def notify(
        self,
        session_id: str,
        owner: str,
        channel: str,
        message: str,
        *,
        title: str = "",
        priority: str = "normal",
        tags: Sequence[str] = (),
        structured_data: Mapping[str, Any] | None = None,
        output_config: Mapping[str, Any] | None = None,
        source: str = "tool",
        truncate: bool = False,
    ) -> dict[str, Any]:
        """Deliver one notification for ``session_id`` through ``channel``.

        Args:
            session_id, owner: whose notification it is (the session gets the fallback).
            channel: a configured channel name.
            message: plain text, at most ``MAX_MESSAGE_CHARS`` characters.
            title, priority, tags, structured_data, output_config: as ``send_notification``.
            source: who sent it (``tool``, ``schedule``, ``watcher``…); recorded with it.
            truncate: cut a longer message instead of refusing it (jobs and watchers).

        Returns:
            ``notification_id``, ``channel``, ``channel_type``, ``delivered``, ``fallback``
            and what the channel reports (``attempts``/``status_code``, ``path``,
            ``recipients``, or ``injected``/``buffered``). After a fallback: ``channel`` is
            ``llm_notification``, with ``requested_channel`` and ``fallback_reason``.

        Raises:
            UnknownChannel, InvalidArgument, LimitExceeded: the arguments are wrong.
            NotificationFailed: the delivery failed and so did (or may not) the fallback.
            NotFound: the session does not exist (``llm_notification``).
        """
        note = self._prepare(
            session_id,
            owner,
            channel,
            message,
            title=title,
            priority=priority,
            tags=tags,
            structured_data=structured_data,
            output_config=output_config,
            source=source,
            truncate=truncate,
        )
        config = note.channel
        if config.type == LLM:
            return await self._deliver_llm(note)
        try:
            async with self.limiter:
                if config.type == "webhook":
                    detail = await self._deliver_webhook(note)
                elif config.type == "log":
                    detail = await self._deliver_log(note)
                else:
                    detail = await self._deliver_email(note)
        except _DeliveryFailed as exc:
            reason, detail = exc.reason, exc.detail
        except Exception as exc:  # a bug in a channel must not lose the notification
            log.exception("channel %s failed", config.name)
            reason, detail = f"{type(exc).__name__}: {exc}", {}
        else:
            return {
                "notification_id": note.id,
                "channel": config.name,
                "channel_type": config.type,
                "delivered": True,
                "fallback": False,
                **detail,
            }
        log.warning("notification %s via %s failed: %s", note.id, config.name, reason)
        if not config.fallback:
            raise NotificationFailed(f"delivery via {config.type} failed: {reason}")
        try:
            result = await self._deliver_llm(note, failed=(config, reason))
        except TurnstileError as exc:
            raise NotificationFailed(
                f"delivery via {config.type} failed: {reason}; the fallback to {LLM} "
                f"failed too: {exc}"
            ) from None
        return {
            **result,
            "requested_channel": config.name,
            "fallback_reason": reason,
            **{k: v for k, v in detail.items() if k not in result},
        }

    # -- llm_notification and the buffer --

    @asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        """A lock per session (or log path), forgotten when nobody holds or awaits it."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = [trio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[key]

    async def _deliver_llm(
        self, note: _Notification, failed: tuple[ChannelConfig, str] | None = None
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "notification_id": note.id,
            "channel": LLM,
            "title": note.title,
            "message": note.message,
            "priority": note.priority,
            "tags": list(note.tags),
            "structured_data": note.structured_data,
            "source": note.source,
            "created_at": note.created_at,
            "fallback": failed is not None,
        }
        if failed is not None:
            event["requested_channel"] = failed[0].name
            event["fallback_reason"] = failed[1]
        text = notification_text(
            message=note.message,
            title=note.title,
            priority=note.priority,
            tags=note.tags,
            structured_data=note.structured_data,
            failed=failed,
        )
        session_id = note.session_id
        async with self._lock(session_id):
            status = await self.ask_session(session_id, GetStatus())
            buffered = status.subscribers == 0
            if buffered:
                await self._buffer(session_id, event)
            else:
                await self._flush(session_id)  # anything older goes first
                await self.ask_session(session_id, Publish(event="notification", payload=event))
            await self.ask_session(
                session_id,
                Inject(source="notification", content=text, payload={"notification_id": note.id}),
            )
        return {
            "notification_id": note.id,
            "channel": LLM,
            "channel_type": LLM,
            "delivered": True,
            "fallback": failed is not None,
            "injected": True,
            "buffered": buffered,
        }

    def _namespaces(self, session_id: str) -> tuple[str, str]:
        return f"notify:{session_id}", f"notify-meta:{session_id}"

    async def _buffered(self, session_id: str) -> list[tuple[str, dict[str, Any]]]:
        namespace, _ = self._namespaces(session_id)
        items: list[tuple[str, dict[str, Any]]] = []
        after: str | None = None
        while True:
            page = await self.store.kv_list(namespace, after_key=after, limit=500)
            items.extend(page)
            if len(page) < 500:
                return items
            after = page[-1][0]

    async def _buffer(self, session_id: str, event: dict[str, Any]) -> None:
        """Keep ``event`` for the next attach; drop the oldest beyond ``max_buffered``."""
        namespace, meta = self._namespaces(session_id)
        items = await self._buffered(session_id)
        # Expired items are older than every live one (one TTL for all), so numbering on from
        # the newest live key keeps key order = arrival order.
        seq = int(items[-1][0]) + 1 if items else 0
        expires = self.clock.now() + timedelta(seconds=self.config.buffer_ttl_seconds)
        await self.store.kv_put(namespace, [(f"{seq:012d}", event, expires)])
        overflow = len(items) + 1 - self.config.max_buffered
        if overflow > 0:
            await self.store.kv_delete(namespace, [key for key, _ in items[:overflow]])
            previous = await self.store.kv_get(meta, "dropped") or {}
            dropped = int(previous.get("dropped", 0)) + overflow
            await self.store.kv_put(meta, [("dropped", {"dropped": dropped}, expires)])

    async def _flush(self, session_id: str) -> int:
        """Publish the buffered events in order, then forget them (the lock is held)."""
        namespace, meta = self._namespaces(session_id)
        items = await self._buffered(session_id)
        counted = await self.store.kv_get(meta, "dropped")
        dropped = int(counted.get("dropped", 0)) if counted else 0
        if dropped:
            await self.ask_session(
                session_id,
                Publish(
                    event="notifications_dropped",
                    payload={
                        "dropped": dropped,
                        "max_buffered": self.config.max_buffered,
                        "message": f"{dropped} dropped: more than "
                        f"{self.config.max_buffered} notifications arrived while no client "
                        "was attached; the oldest were dropped",
                    },
                ),
            )
            await self.store.kv_delete(meta, ["dropped"])
        delivered = 0
        try:
            for _key, event in items:
                await self.ask_session(
                    session_id,
                    Publish(event="notification", payload={**event, "buffered": True}),
                )
                delivered += 1
        finally:
            if delivered:
                with trio.move_on_after(CLEANUP_GRACE_SECONDS, shield=True):
                    await self.store.kv_delete(namespace, [key for key, _ in items[:delivered]])
        return delivered

    async def deliver_buffered(self, session_id: str) -> int:
        """Publish the notifications buffered while no client was attached, oldest first.

        Call it right after a client attaches (outside the session actor's ``receive``: it
        asks the session). A ``notifications_dropped`` event comes first when the buffer
        overflowed; each notification then arrives as a ``notification`` event with
        ``buffered: true``, and is deleted from the buffer once published.

        Returns:
            How many notifications were delivered.
        """
        async with self._lock(session_id):
            return await self._flush(session_id)

    async def discard_buffered(self, session_id: str) -> int:
        """Forget a session's buffered notifications (when the session is deleted).

        Returns:
            How many were discarded.
        """
        namespace, meta = self._namespaces(session_id)
        async with self._lock(session_id):
            items = await self._buffered(session_id)
            await self.store.kv_delete(meta, ["dropped"])
            return await self.store.kv_delete(namespace, [key for key, _ in items])

    # -- external channels --

    async def _deliver_webhook(self, note: _Notification) -> dict[str, Any]:
        config = note.channel
        post = self.webhook_post
        assert post is not None  # checked at construction
        body = json.dumps(note.record(), ensure_ascii=False).encode()
        headers = {
            "user-agent": USER_AGENT,
            **{k.lower(): v for k, v in config.headers.items()},
            "content-type": "application/json",
        }
        attempts = 0
        reason = ""
        for attempt in range(config.retries + 1):
            if attempt:
                await trio.sleep(config.backoff_seconds * 2 ** (attempt - 1))
            attempts += 1
            answer: tuple[int, str] | None = None
            with trio.move_on_after(config.timeout) as deadline:
                try:
                    answer = await post(config.url, headers, body, config.timeout)
                except DeliveryError as exc:
                    if not exc.retriable:
                        raise _DeliveryFailed(exc.reason, {"attempts": attempts}) from None
                    reason = exc.reason
            if deadline.cancelled_caught:
                reason = f"timed out after {config.timeout:g} s"
            if answer is None:
                continue
            status, phrase = answer
            if 200 <= status < 300:
                return {"attempts": attempts, "status_code": status}
            if status < 500:
                raise _DeliveryFailed(
                    " ".join(f"HTTP {status} {phrase}".split()) + " (not retried)",
                    {"attempts": attempts, "status_code": status},
                )
            reason = " ".join(f"HTTP {status} {phrase}".split())
        raise _DeliveryFailed(
            f"{reason} after {attempts} attempt{'s' if attempts > 1 else ''}",
            {"attempts": attempts},
        )

    async def _deliver_log(self, note: _Notification) -> dict[str, Any]:
        path = note.channel.path
        line = json.dumps({**note.record(), "owner": note.owner}, ensure_ascii=False) + "\n"
        async with self._lock(f"path:{path}"):  # one line at a time per file
            try:
                await trio.to_thread.run_sync(_append_line, path, line)
            except OSError as exc:
                raise _DeliveryFailed(
                    f"cannot write {path}: {exc.strerror or type(exc).__name__}"
                ) from None
        return {"path": path}

    async def _deliver_email(self, note: _Notification) -> dict[str, Any]:
        config = note.channel
        message = _email_message(note, self.clock.now())
        with trio.move_on_after(config.timeout) as deadline:
            try:
                refused = await trio.to_thread.run_sync(
                    _send_email, config, message, note.recipients, abandon_on_cancel=True
                )
            except smtplib.SMTPResponseException as exc:
                text = exc.smtp_error.decode(errors="replace") if exc.smtp_error else ""
                raise _DeliveryFailed(f"SMTP {exc.smtp_code} {text}".strip()) from None
            except smtplib.SMTPRecipientsRefused as exc:
                raise _DeliveryFailed(
                    f"every recipient was refused ({', '.join(exc.recipients)})"
                ) from None
            except (smtplib.SMTPException, OSError) as exc:
                raise _DeliveryFailed(f"{type(exc).__name__}: {exc}") from None
        if deadline.cancelled_caught:
            raise _DeliveryFailed(f"timed out after {config.timeout:g} s")
        accepted = [r for r in note.recipients if r not in refused]
        out: dict[str, Any] = {"recipients": accepted}
        if refused:
            out["refused"] = sorted(refused)
        return out


def _append_line(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


def _email_message(note: _Notification, now: datetime) -> EmailMessage:
    config = note.channel
    message = EmailMessage()
    subject = note.title or _one_line(note.message)[:78]
    message["Subject"] = _one_line(f"{config.subject_prefix}{subject}")
    message["From"] = config.from_address
    message["To"] = ", ".join(note.recipients)
    message["Date"] = email.utils.format_datetime(now)
    domain = config.from_address.rsplit("@", 1)[1]
    message["Message-ID"] = email.utils.make_msgid(idstring=note.id, domain=domain)
    message["X-Priority"] = _EMAIL_PRIORITY[note.priority]
    message["X-Turnstile-Notification"] = note.id
    body = [note.message]
    if note.tags:
        body.append(f"\nTags: {', '.join(note.tags)}")
    if note.structured_data:
        body.append("\nData:\n" + json.dumps(note.structured_data, indent=2, ensure_ascii=False))
    message.set_content("\n".join(body))
    return message


def _send_email(config: ChannelConfig, message: EmailMessage, recipients: tuple) -> dict:
    """Send ``message`` (in a worker thread); returns the refused recipients."""
    if config.ssl:
        smtp: smtplib.SMTP = smtplib.SMTP_SSL(
            config.host,
            config.port,
            local_hostname=config.helo_name,
            timeout=config.timeout,
            context=ssl.create_default_context(),
        )
    else:
        smtp = smtplib.SMTP(
            config.host, config.port, local_hostname=config.helo_name, timeout=config.timeout
        )
    with smtp:
        if config.starttls:
            smtp.starttls(context=ssl.create_default_context())
        if config.username:
            smtp.login(config.username, config.password or "")
        return smtp.send_message(message, to_addrs=list(recipients))
