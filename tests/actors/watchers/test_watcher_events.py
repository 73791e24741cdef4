"""The watchers feature's event encodes to exactly the frames clients always received."""

from __future__ import annotations

from tests.support.events import frame
from turnstile.actors.watchers.events import WatcherUpdate

TAIL = ',"session_id":"s1","seq":1,"ts":"2025-01-01T00:00:00Z"}'


def test_a_lifecycle_update_carries_the_watchers_settings():
    event = WatcherUpdate(
        watcher_id="w1",
        what="started",
        status="running",
        label="API health",
        tool_name="http.get",
        notify_when="on_error",
        interval=30,
    )
    assert (
        frame(event)
        == (
            '{"watcher_id":"w1","what":"started","status":"running","label":"API health",'
            '"tool_name":"http.get","notify_when":"on_error","interval":30,'
            '"type":"watcher_update"' + TAIL
        ).encode()
    )


def test_an_escalation_carries_the_check_and_its_result_or_error():
    common = dict(watcher_id="w1", what="escalated", label="", tool_name="t", notify_when="always")
    ok = WatcherUpdate(**common, check=4, notification_count=2, ok=True, result='{"a":1}')
    assert (
        frame(ok)
        == (
            '{"watcher_id":"w1","what":"escalated","label":"","tool_name":"t",'
            '"notify_when":"always","check":4,"notification_count":2,"ok":true,'
            '"result":"{\\"a\\":1}","type":"watcher_update"' + TAIL
        ).encode()
    )
    failed = WatcherUpdate(**common, check=5, notification_count=3, ok=False, error="refused")
    assert (
        frame(failed)
        == (
            '{"watcher_id":"w1","what":"escalated","label":"","tool_name":"t",'
            '"notify_when":"always","check":5,"notification_count":3,"ok":false,'
            '"error":"refused","type":"watcher_update"' + TAIL
        ).encode()
    )
