"""The external channels: webhook, log file and email deliveries.

``ExternalChannelsMixin`` is the part of ``Notifier`` that delivers outside the session:

* ``webhook`` — a JSON ``POST``, retried with exponential backoff (``backoff_seconds``,
  doubled each time: 0.5 s, 1 s, 2 s for ``retries = 3``) on a 5xx answer, a connection error
  or a timeout — never on a 4xx, a redirect or a refused address. Each attempt is bounded by
  ``timeout``. Every attempt carries the same ``Idempotency-Key``: the tool call's key when a
  turn sent the notification (the same again if the turn runs again after a crash, and then
  so is the body's ``id``), else the notification's id; a receiver that honours it acts once.
  The POST itself is injected (``WebhookPost``): the node passes
  ``notifications.tools.guarded_webhook_post``, which goes through the SSRF guard
  (``tools.netguard``) with the http module's allow-list.
* ``log`` — one line per notification (a JSON object, or text with ``format = "text"``),
  appended to ``path`` from a worker thread and/or logged to the Python logger
  ``logger_name`` at ``level`` (the reference's ``logger_name``, ``level``, ``format``).
* ``email`` — ``smtplib`` in a worker thread (STARTTLS or implicit TLS, optional login).

A failed delivery raises ``_DeliveryFailed`` with its reason; ``Notifier.notify`` then falls
back to ``llm_notification`` (or raises). This module is separate from the notifier because it
is the only part that does I/O of its own (HTTP through the injected ``WebhookPost``, files,
SMTP in worker threads). The mixin uses the notifier's ``webhook_post``, ``clock`` and
``_lock``.
"""

from __future__ import annotations

import email.utils
import json
import logging
import smtplib
import ssl
from datetime import datetime
from email.message import EmailMessage
from typing import Any

import trio

from turnstile.actors.notifications.base import NotifierBase
from turnstile.actors.notifications.config import ChannelConfig, _Notification, _one_line

USER_AGENT = "turnstile-notifier/0.1"
_EMAIL_PRIORITY = {"urgent": "1 (Highest)", "high": "2 (High)", "normal": "3 (Normal)", "low": "5"}


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


class _DeliveryFailed(Exception):
    def __init__(self, reason: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail or {}


class ExternalChannelsMixin(NotifierBase):
    """``Notifier``'s webhook, log and email deliveries. See the module docstring."""

    async def _deliver_webhook(self, note: _Notification) -> dict[str, Any]:
        config = note.channel
        post = self.webhook_post
        assert post is not None  # checked at construction
        body = json.dumps(note.record(), ensure_ascii=False).encode()
        headers = {
            "user-agent": USER_AGENT,
            **{k.lower(): v for k, v in config.headers.items()},
            "content-type": "application/json",
            "idempotency-key": note.idempotency_key or note.id,
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
        config = note.channel
        text = _log_line(note)
        out: dict[str, Any] = {}
        if config.logger_name:
            level = logging.getLevelName(config.level.upper())
            logging.getLogger(config.logger_name).log(level, "%s", text)
            out["logger"] = config.logger_name
        if path := config.path:
            async with self._lock(f"path:{path}"):  # one line at a time per file
                try:
                    await trio.to_thread.run_sync(_append_line, path, text + "\n")
                except OSError as exc:
                    raise _DeliveryFailed(
                        f"cannot write {path}: {exc.strerror or type(exc).__name__}"
                    ) from None
            out["path"] = path
        return out

    async def _deliver_email(self, note: _Notification) -> dict[str, Any]:
        config = note.channel
        message = _email_message(note, self.clock.now())
        with trio.move_on_after(config.timeout) as deadline:
            try:
                refused = await trio.to_thread.run_sync(
                    _send_email, config, message, note.recipients, abandon_on_cancel=True
                )
            except smtplib.SMTPResponseException as exc:
                reply = exc.smtp_error  # bytes from smtplib; typeshed allows str
                text = reply.decode(errors="replace") if isinstance(reply, bytes) else reply
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


def _log_line(note: _Notification) -> str:
    """A log channel's line for ``note``, without its line break: the JSON record (with the
    owner), or ``[priority] title: message (session …, from source)`` on one line."""
    if note.channel.format == "json":
        return json.dumps({**note.record(), "owner": note.owner}, ensure_ascii=False)
    title = f"{note.title}: " if note.title else ""
    message = note.message.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return (
        f"[{note.priority}] {title}{message} "
        f"(session {note.session_id}, user {note.owner}, from {note.source}, id {note.id})"
    )


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
