"""Webhook signatures, checked over the raw body before anything parses it.

* **GitHub** (``X-Hub-Signature-256``): ``sha256=`` and the hex HMAC-SHA256 of the body under
  the webhook's secret (GitHub's "Validating webhook deliveries").
* **Standard Webhooks** (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``): the
  base64 HMAC-SHA256 of ``<id>.<timestamp>.<body>`` under the ``whsec_`` secret's bytes; the
  signature header lists one or more space-separated ``v1,<base64>`` (several during a secret
  rotation) and one match suffices; the timestamp (Unix seconds) must lie within the hook's
  tolerance of the node's clock, which is what stops a captured delivery being replayed later.

Every comparison is ``hmac.compare_digest``. A refusal is :class:`SignatureRefused`, a 401
whose ``reason`` is what ``/metrics`` counts; its message never quotes a secret or a signature.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping
from datetime import datetime

from turnstile.runtime.errors import Unauthorized

__all__ = ["SignatureRefused", "github_signature", "verify_github", "verify_standard"]

#: The longest ``webhook-id`` taken: it becomes part of the delivery's key
#: (``hook:<name>:<id>``), which an inbox idempotency key (at most 255 characters) may carry.
MAX_ID_CHARS = 180
_VISIBLE = re.compile(r"[!-~]+\Z")


class SignatureRefused(Unauthorized):
    """A webhook whose signature is missing, wrong, or (Standard Webhooks) out of its time.

    Attributes:
        reason: ``missing_signature``, ``bad_signature``, ``bad_timestamp`` or
            ``stale_timestamp`` (what ``turnstile_webhook_refusals_total`` counts).
        field: the header at fault.
    """

    code = "bad_signature"

    def __init__(self, message: str, reason: str, field: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field


def github_signature(secret: bytes, body: bytes) -> str:
    """``X-Hub-Signature-256`` as GitHub sends it for ``body``: ``sha256=<hex>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_github(secret: bytes, body: bytes, headers: Mapping[str, str]) -> None:
    """Check GitHub's ``X-Hub-Signature-256`` over ``body``.

    Raises:
        SignatureRefused: the header is missing (``missing_signature``) or does not match
            (``bad_signature``).
    """
    field = "X-Hub-Signature-256"
    sent = headers.get("x-hub-signature-256")
    if not sent:
        raise SignatureRefused(f"missing {field}", "missing_signature", field)
    expected = github_signature(secret, body)
    if not hmac.compare_digest(expected.encode("ascii"), sent.strip().encode("utf-8", "replace")):
        raise SignatureRefused(f"{field} does not match the body", "bad_signature", field)


def standard_signature(key: bytes, webhook_id: str, timestamp: str, body: bytes) -> str:
    """One ``webhook-signature`` entry for ``body``: ``v1,<base64>``."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def verify_standard(
    key: bytes, body: bytes, headers: Mapping[str, str], now: datetime, tolerance: float
) -> str:
    """Check a Standard Webhooks delivery; answers its ``webhook-id``.

    The signature is checked first, so a forged delivery counts as ``bad_signature`` whatever
    its timestamp, and ``stale_timestamp`` means an authentic delivery replayed (or a sender's
    clock far off).

    Raises:
        SignatureRefused: a header missing or malformed, no entry matching, or a timestamp
            outside ``tolerance`` seconds of ``now``.
    """
    values = {}
    for name in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        value = headers.get(name, "").strip()
        if not value:
            raise SignatureRefused(f"missing {name}", "missing_signature", name)
        values[name] = value
    webhook_id, timestamp = values["webhook-id"], values["webhook-timestamp"]
    if len(webhook_id) > MAX_ID_CHARS or not _VISIBLE.match(webhook_id):
        raise SignatureRefused(
            f"webhook-id must be 1-{MAX_ID_CHARS} visible ASCII characters",
            "bad_signature",
            "webhook-id",
        )
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        raise SignatureRefused(
            "webhook-timestamp must be Unix seconds", "bad_timestamp", "webhook-timestamp"
        )
    expected = standard_signature(key, webhook_id, timestamp, body).encode("ascii")
    sent = [entry.encode("utf-8", "replace") for entry in values["webhook-signature"].split()]
    matched = False
    for entry in sent:  # every entry compared, so the time taken says nothing of which matched
        matched |= hmac.compare_digest(expected, entry)
    if not matched:
        raise SignatureRefused(
            "no webhook-signature entry matches the body", "bad_signature", "webhook-signature"
        )
    if abs(now.timestamp() - int(timestamp)) > tolerance:
        raise SignatureRefused(
            f"webhook-timestamp is more than {tolerance:g} s from now (a replay?)",
            "stale_timestamp",
            "webhook-timestamp",
        )
    return webhook_id
