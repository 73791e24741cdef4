"""Signatures over the raw body: GitHub's and Standard Webhooks', with their published vectors."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from turnstile.actors.config import Config
from turnstile.actors.webhooks.settings import HookConfig, decode_whsec
from turnstile.actors.webhooks.signatures import (
    SignatureRefused,
    github_signature,
    standard_signature,
    verify_github,
    verify_standard,
)

# GitHub's documented test vector ("Validating webhook deliveries").
GH_SECRET = b"It's a Secret to Everybody"
GH_BODY = b"Hello, World!"
GH_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

# The Standard Webhooks specification's example.
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SW_TIMESTAMP = "1614265330"
SW_BODY = b'{"test": 2432232314}'
SW_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
SW_NOW = datetime.fromtimestamp(1614265330, UTC)


def test_github_documented_test_vector():
    assert github_signature(GH_SECRET, GH_BODY) == GH_SIGNATURE
    verify_github(GH_SECRET, GH_BODY, {"x-hub-signature-256": GH_SIGNATURE})


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing_signature"),
        ({"x-hub-signature-256": ""}, "missing_signature"),
        ({"x-hub-signature-256": GH_SIGNATURE[:-1] + "0"}, "bad_signature"),
        ({"x-hub-signature-256": GH_SIGNATURE.removeprefix("sha256=")}, "bad_signature"),
        ({"x-hub-signature-256": "sha1=" + "0" * 40}, "bad_signature"),
        ({"x-hub-signature-256": "sha256=\u00e9"}, "bad_signature"),
    ],
)
def test_github_refuses_a_missing_or_wrong_signature(headers, reason):
    with pytest.raises(SignatureRefused) as refused:
        verify_github(GH_SECRET, GH_BODY, headers)
    assert (refused.value.reason, refused.value.field) == (reason, "X-Hub-Signature-256")
    assert "757107" not in str(refused.value)  # never quotes the expected signature


def test_github_signature_covers_every_byte_of_the_body():
    with pytest.raises(SignatureRefused):
        verify_github(GH_SECRET, GH_BODY + b" ", {"x-hub-signature-256": GH_SIGNATURE})


def _headers(**overrides: str) -> dict[str, str]:
    headers = {
        "webhook-id": SW_ID,
        "webhook-timestamp": SW_TIMESTAMP,
        "webhook-signature": SW_SIGNATURE,
    }
    headers.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return headers


def test_standard_webhooks_specification_example():
    key = decode_whsec(SW_SECRET)
    assert standard_signature(key, SW_ID, SW_TIMESTAMP, SW_BODY) == SW_SIGNATURE
    assert verify_standard(key, SW_BODY, _headers(), SW_NOW, 300) == SW_ID


def test_any_one_of_several_signatures_suffices_as_in_a_secret_rotation():
    key = decode_whsec(SW_SECRET)
    rotated = f"v1,bm90IHRoaXMgb25l {SW_SIGNATURE} v2,whatever"
    assert verify_standard(key, SW_BODY, _headers(webhook_signature=rotated), SW_NOW, 300)


@pytest.mark.parametrize(
    ("overrides", "reason", "field"),
    [
        ({"webhook_id": ""}, "missing_signature", "webhook-id"),
        ({"webhook_timestamp": ""}, "missing_signature", "webhook-timestamp"),
        ({"webhook_signature": ""}, "missing_signature", "webhook-signature"),
        ({"webhook_timestamp": "soon"}, "bad_timestamp", "webhook-timestamp"),
        ({"webhook_signature": "v1,AAAA"}, "bad_signature", "webhook-signature"),
        # the signature covers the id and the timestamp: changing either breaks it
        ({"webhook_id": "msg_other"}, "bad_signature", "webhook-signature"),
        ({"webhook_timestamp": "1614265331"}, "bad_signature", "webhook-signature"),
    ],
)
def test_standard_webhooks_refusals_name_the_header(overrides, reason, field):
    with pytest.raises(SignatureRefused) as refused:
        verify_standard(decode_whsec(SW_SECRET), SW_BODY, _headers(**overrides), SW_NOW, 300)
    assert (refused.value.reason, refused.value.field) == (reason, field)


def test_an_authentic_message_replayed_outside_the_tolerance_is_refused():
    key = decode_whsec(SW_SECRET)
    for seconds in (301, -301):
        later = datetime.fromtimestamp(int(SW_TIMESTAMP) + seconds, UTC)
        with pytest.raises(SignatureRefused) as refused:
            verify_standard(key, SW_BODY, _headers(), later, 300)
        assert refused.value.reason == "stale_timestamp"
    at_the_edge = datetime.fromtimestamp(int(SW_TIMESTAMP) + 300, UTC)
    assert verify_standard(key, SW_BODY, _headers(), at_the_edge, 300) == SW_ID


def test_a_forged_message_counts_as_bad_signature_whatever_its_age():
    late = datetime.fromtimestamp(int(SW_TIMESTAMP) + 10_000, UTC)
    with pytest.raises(SignatureRefused) as refused:
        verify_standard(decode_whsec(SW_SECRET), b"{}", _headers(), late, 300)
    assert refused.value.reason == "bad_signature"


def test_secrets_are_checked_when_the_config_is_read_and_never_shown():
    for bad in ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not base64!", "whsec_AAAA"):
        with pytest.raises(msgspec.ValidationError) as refused:
            msgspec.convert({"webhooks": {"hooks": {"h": {"user": "ada", "secret": bad}}}}, Config)
        assert bad not in str(refused.value)
    hook = HookConfig(user="ada", secret=SW_SECRET)
    assert SW_SECRET not in repr(hook)
    config = msgspec.convert({"webhooks": {"github": {"secret": "s3cr3t-value"}}}, Config)
    assert "s3cr3t-value" not in repr(config)
