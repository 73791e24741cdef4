"""Output channels: notifications into the session, to webhooks, log files and email.

``send_notification`` (``tools.py``), scheduled jobs and watchers all call
``Notifier.notify(session_id, owner, channel, message, …)``. ``channel`` names one of the
channels declared in the config (a ``ChannelConfig`` each); ``llm_notification`` is always
there. The channel types:

* ``llm_notification`` — into the session (``buffer.py``).
* ``webhook``, ``log``, ``email`` — outside it (``channels.py``).

This module holds ``Notifier`` itself: the checks of a notification's arguments, the entry
point ``notify`` with its fallback, and the per-session locks. The rest lives beside it:

* ``config.py`` — channel types, bounds, ``ChannelConfig``/``NotifierConfig``, the errors.
* ``buffer.py`` — ``llm_notification`` and the buffer (``SessionBufferMixin``).
* ``channels.py`` — webhook, log and email (``ExternalChannelsMixin``).

The names other modules imported from here before that split are still importable from here.

**Fallback.** When a webhook, log or email delivery fails, the notification is delivered through
``llm_notification`` instead and says so: its text carries ``delivery via webhook failed:
<reason>; delivered here instead``, and the result has ``fallback: true`` and
``fallback_reason``. A channel with ``fallback = false`` raises ``NotificationFailed`` instead.

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

import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import trio

from turnstile.actors.notifications.buffer import SessionBufferMixin, notification_text
from turnstile.actors.notifications.channels import (
    DeliveryError,
    ExternalChannelsMixin,
    _DeliveryFailed,
)
from turnstile.actors.notifications.config import (
    _ADDRESS,
    CHANNEL_TYPES,
    LLM,
    MAX_MESSAGE_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    OUTPUT_CONFIG_KEYS,
    PRIORITIES,
    PRIORITY_ALIASES,
    ChannelConfig,
    NotificationFailed,
    NotifierConfig,
    UnknownChannel,
    UserResolver,
    WebhookPost,
    _Notification,
    _one_line,
)
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
    # Imported from here by the notify tool before the split; they live in config.py now.
    "MAX_TITLE_CHARS",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
]

log = logging.getLogger("turnstile.notifier")


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


class Notifier(SessionBufferMixin, ExternalChannelsMixin):
    """Delivers notifications through the configured channels. See the module docstring.

    Args:
        store: keeps the per-session buffer (key-value table).
        clock: wall time for ``created_at`` and buffer expiry (the store's clock).
        ask_session: ``async (session_id, message) -> answer`` — asks a session actor
            (``GetStatus``, ``Publish``, ``Inject``).
        config: channels and bounds.
        webhook_post: sends one webhook POST (``notifications.tools.guarded_webhook_post``);
            needed when a webhook channel is configured.
        tell_session: ``async (session_id, message)`` that reaches a session another node
            holds (``NodeContext.tell_session``): a notification for it is buffered here and
            its ``Inject`` stored as the session's input there. None: one node.
        user_resolver: ``async (user) -> address or None``, the email address of a session's
            owner, for email channels with a ``user_resolver`` (the feature passes the
            ``[[users]]`` ``email`` lookup).

    Raises:
        ValueError: a webhook channel is configured but no ``webhook_post`` given, or an
            email channel has a ``user_resolver`` but no ``user_resolver`` is given.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        ask_session: Callable[[str, Any], Awaitable[Any]],
        config: NotifierConfig | None = None,
        *,
        webhook_post: WebhookPost | None = None,
        tell_session: Callable[[str, Any], Awaitable[Any]] | None = None,
        user_resolver: UserResolver | None = None,
    ) -> None:
        config = config or NotifierConfig()
        self.store = store
        self.clock = clock
        self.ask_session = ask_session
        self.tell_session = tell_session
        self.config = config
        channels = {c.name: c for c in config.channels}
        channels.setdefault(LLM, ChannelConfig(name=LLM, type=LLM))
        self.channels: dict[str, ChannelConfig] = dict(sorted(channels.items()))
        if webhook_post is None and any(c.type == "webhook" for c in config.channels):
            raise ValueError("webhook channels need a webhook_post")
        if user_resolver is None and any(c.user_resolver for c in config.channels):
            raise ValueError("channels with a user_resolver need one")
        self.webhook_post = webhook_post
        self.user_resolver = user_resolver
        self.limiter = trio.CapacityLimiter(config.max_concurrency)
        self._locks = {}
        self._retrying = set()

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

    def _recipients(
        self,
        channel: ChannelConfig,
        output_config: Mapping[str, Any],
        owner: str | None = None,
        owner_address: str | None = None,
    ) -> tuple:
        """The recipients of an email: ``output_config.to_address`` (checked against ``to``
        and ``allowed_recipients``), else the session owner's own address when the channel
        resolves users (``owner_address``; checking a job's channel at its creation, before
        any address is looked up, ``owner`` is None and that is enough), else ``to``."""
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
            if channel.user_resolver and owner_address:
                return (owner_address,)
            if channel.user_resolver and owner is None:
                return tuple(channel.to)  # a job's check: the address is found when it fires
            if not channel.to:
                whose = (
                    f"user {owner!r} has no email address ([[users]] email) and "
                    if channel.user_resolver
                    else ""
                )
                raise InvalidArgument(
                    f"{whose}channel {channel.name!r} has no default recipient; "
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
        idempotency_key: str | None = None,
        owner_address: str | None = None,
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
        recipients = self._recipients(config, output_config or {}, owner, owner_address)
        if idempotency_key is None:
            note_id = f"ntf-{uuid.uuid4().hex[:12]}"
        else:  # the same notification when its turn runs again: the same id
            note_id = f"ntf-{hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]}"
        return _Notification(
            id=note_id,
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
            idempotency_key=idempotency_key,
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
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Deliver one notification for ``session_id`` through ``channel``.

        Args:
            session_id, owner: whose notification it is (the session gets the fallback).
            channel: a configured channel name.
            message: plain text, at most ``MAX_MESSAGE_CHARS`` characters.
            title, priority, tags, structured_data, output_config: as ``send_notification``.
            source: who sent it (``tool``, ``schedule``, ``watcher``…); recorded with it.
            truncate: cut a longer message instead of refusing it (jobs and watchers).
            idempotency_key: the key of the turn's call that sends it (``ToolCall``): the
                webhook channel sends it as ``Idempotency-Key`` and the notification's id is
                derived from it, so the same call run again is the same notification to the
                receiver. Without one, the id is random and is the key.

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
        owner_address = None
        config = self.channels.get(channel)
        if (
            config is not None
            and config.user_resolver
            and self.user_resolver is not None
            and "to_address" not in (output_config or {})
        ):
            owner_address = await self.user_resolver(owner)
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
            idempotency_key=idempotency_key,
            owner_address=owner_address,
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
