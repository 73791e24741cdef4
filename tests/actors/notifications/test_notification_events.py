"""The notifications feature's events encode to exactly the frames clients always received,
and a buffered notification comes back from its stored row with ``buffered: true``."""

from __future__ import annotations

from tests.support.events import frame
from turnstile.actors.notifications.buffer import _from_buffer
from turnstile.actors.notifications.events import Notification, NotificationsDropped

TAIL = ',"session_id":"s1","seq":1,"ts":"2025-01-01T00:00:00Z"}'
HEAD = (
    '{"notification_id":"n1","channel":"llm_notification","title":"Build","message":"done",'
    '"priority":"high","tags":["ci"],"structured_data":{"ok":true},"source":"agent",'
    '"created_at":"2025-01-01T00:00:00Z"'
)


def note(**extra) -> Notification:
    return Notification(
        notification_id="n1",
        channel="llm_notification",
        title="Build",
        message="done",
        priority="high",
        tags=["ci"],
        structured_data={"ok": True},
        source="agent",
        created_at="2025-01-01T00:00:00Z",
        **extra,
    )


def test_a_notification():
    assert (
        frame(note(fallback=False))
        == (HEAD + ',"fallback":false,"type":"notification"' + TAIL).encode()
    )


def test_a_fallback_notification_says_where_it_was_meant_to_go():
    event = note(fallback=True, requested_channel="ops", fallback_reason="HTTP 500")
    assert (
        frame(event)
        == (
            HEAD + ',"fallback":true,"requested_channel":"ops","fallback_reason":"HTTP 500",'
            '"type":"notification"' + TAIL
        ).encode()
    )


def test_a_buffered_notification_is_its_stored_row_plus_buffered():
    stored = note(fallback=True, requested_channel="ops", fallback_reason="x").stored()[1]
    event = _from_buffer("s1", "000000000000", stored)
    assert (
        frame(event)
        == (
            HEAD + ',"fallback":true,"requested_channel":"ops","fallback_reason":"x",'
            '"buffered":true,"type":"notification"' + TAIL
        ).encode()
    )


def test_a_buffered_row_that_is_not_a_notification_is_dropped():
    assert _from_buffer("s1", "000000000001", {"message": 3}) is None


def test_notifications_dropped():
    event = NotificationsDropped(dropped=5, max_buffered=100, message="5 dropped")
    assert (
        frame(event)
        == (
            '{"dropped":5,"max_buffered":100,"message":"5 dropped","type":"notifications_dropped"'
            + TAIL
        ).encode()
    )
