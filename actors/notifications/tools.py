"""``send_notification``: notify the user through an output channel (as in the
execution-primitives reference), and the SSRF-guarded POST the notifier's webhooks use.

The channels are those the notifier was configured with (``actors/notifications/actor.py``);
``llm_notification`` is always one of them. An unknown channel is an ``unknown_channel`` error
that lists the configured ones. A channel that fails falls back to ``llm_notification`` and the
result says so (``fallback: true``, ``fallback_reason``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import httpcore
import httpx
import msgspec

from turnstile.actors.notifications.actor import (
    MAX_MESSAGE_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    DeliveryError,
    Notifier,
    WebhookPost,
)
from turnstile.runtime.errors import TurnstileError
from turnstile.tools.netguard import (
    NetPolicy,
    Resolver,
    TooManyRedirects,
    guarded_client,
    open_response,
)
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = ["SendNotification", "guarded_webhook_post", "register_notify_tools"]


class SendNotification(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``send_notification``."""

    message: Annotated[
        str,
        msgspec.Meta(
            min_length=1, max_length=MAX_MESSAGE_CHARS, description="plain text, the body"
        ),
    ]
    channel: Annotated[
        str, msgspec.Meta(min_length=1, max_length=64, description="a configured channel")
    ] = "llm_notification"
    title: Annotated[str, msgspec.Meta(max_length=MAX_TITLE_CHARS)] = ""
    priority: Literal["low", "normal", "high", "urgent", "critical"] = "normal"
    tags: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TAG_CHARS)]],
        msgspec.Meta(max_length=MAX_TAGS),
    ] = msgspec.field(default_factory=list)
    structured_data: Annotated[
        dict[str, Any], msgspec.Meta(max_length=100, description="machine-readable JSON")
    ] = msgspec.field(default_factory=dict)
    output_config: Annotated[
        dict[str, Any],
        msgspec.Meta(max_length=10, description='per delivery, e.g. {"to_address": "…"}'),
    ] = msgspec.field(default_factory=dict)


def guarded_webhook_post(
    policy: NetPolicy,
    *,
    resolver: Resolver | None = None,
    backend: httpcore.AsyncNetworkBackend | None = None,
) -> WebhookPost:
    """The notifier's webhook POST, through the SSRF guard (``tools.netguard``).

    Every connection is vetted after DNS resolution; redirects are not followed (a redirect is
    a failure that is not retried), nor is a refused address retried. Connection errors and
    timeouts are retriable.

    Args:
        policy: the allow-list (the http module's ``allowed_hosts`` / ``allowed_networks``).
        resolver, backend: replace DNS resolution and the socket layer (tests).
    """

    async def post(
        url: str,
        headers: dict[str, str],
        body: bytes,
        timeout: float,  # noqa: ASYNC109 (httpx's own per-operation timeout)
    ) -> tuple[int, str]:
        try:
            async with guarded_client(
                policy, timeout=timeout, resolver=resolver, backend=backend
            ) as client:
                async with open_response(
                    client, "POST", url, headers=headers, content=body, max_redirects=0
                ) as (response, _hops):
                    return response.status_code, response.reason_phrase
        except TooManyRedirects:
            raise DeliveryError(
                "the webhook answered with a redirect, which is not followed", retriable=False
            ) from None
        except TurnstileError as exc:  # a refused address, a bad URL
            raise DeliveryError(str(exc), retriable=False) from None
        except httpx.TimeoutException:
            raise DeliveryError(f"timed out after {timeout:g} s", retriable=True) from None
        except httpx.HTTPError as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise DeliveryError(detail, retriable=True) from None

    return post


def register_notify_tools(registry: ToolRegistry, notifier: Notifier) -> None:
    """Register ``send_notification`` for the notifier's channels."""
    described = ", ".join(f"{c.name} ({c.type})" for c in notifier.channels.values())

    async def send_notification(call: ToolCall, args: SendNotification) -> dict[str, Any]:
        return await notifier.notify(
            call.session_id,
            call.owner,
            args.channel,
            args.message,
            title=args.title,
            priority=args.priority,
            tags=args.tags,
            structured_data=args.structured_data,
            output_config=args.output_config,
            source="tool",
            idempotency_key=call.idempotency_key,
        )

    registry.register(
        "send_notification",
        SendNotification,
        send_notification,
        "Send a notification through an output channel (message up to 10,000 chars; "
        "priority low|normal|high|urgent). A channel that fails falls back to "
        f"llm_notification and the result says so. Channels: {described}.",
    )
