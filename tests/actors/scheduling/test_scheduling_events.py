"""The scheduling feature's events encode to exactly the frames clients always received."""

from __future__ import annotations

from tests.support.events import frame
from turnstile.actors.scheduling.events import JobUpdate, RecallUpdate

TAIL = ',"session_id":"s1","seq":1,"ts":"2025-01-01T00:00:00Z"}'
RECALL = (
    '{"recall_id":"rc1","call_type":"recurring","status":"pending",'
    '"trigger_at":"2025-01-01T00:10:00Z","interval_seconds":600,"internal_comment":"poll",'
    '"additional_context_message":"check the build","fired_count":1,'
    '"created_at":"2025-01-01T00:00:00Z","updated_at":"2025-01-01T00:00:05Z"'
)


def recall(action: str, **extra) -> RecallUpdate:
    return RecallUpdate(
        recall_id="rc1",
        call_type="recurring",
        status="pending",
        trigger_at="2025-01-01T00:10:00Z",
        interval_seconds=600,
        internal_comment="poll",
        additional_context_message="check the build",
        fired_count=1,
        created_at="2025-01-01T00:00:00Z",
        updated_at="2025-01-01T00:00:05Z",
        action=action,
        **extra,
    )


def test_a_job_update_without_a_run():
    event = JobUpdate(
        job_id="j1",
        kind="once",
        event="cancelled",
        state="cancelled",
        label="",
        next_fire_at=None,
        run_count=0,
    )
    assert (
        frame(event)
        == (
            '{"job_id":"j1","kind":"once","event":"cancelled","state":"cancelled","label":"",'
            '"next_fire_at":null,"run_count":0,"type":"job_update"' + TAIL
        ).encode()
    )


def test_a_fired_job_update_names_its_run():
    event = JobUpdate(
        job_id="j1",
        kind="cron",
        event="fired",
        state="active",
        label="daily",
        next_fire_at="2025-01-02T09:00:00+00:00",
        run_count=1,
        run_id=7,
    )
    assert (
        frame(event)
        == (
            '{"job_id":"j1","kind":"cron","event":"fired","state":"active","label":"daily",'
            '"next_fire_at":"2025-01-02T09:00:00+00:00","run_count":1,"run_id":7,'
            '"type":"job_update"' + TAIL
        ).encode()
    )


def test_recall_updates_are_the_recall_view_then_what_happened():
    assert (
        frame(recall("scheduled"))
        == (RECALL + ',"action":"scheduled","type":"recall_update"' + TAIL).encode()
    )
    skipped = recall("skipped", skipped_trigger_at="2025-01-01T00:00:10Z")
    assert (
        frame(skipped)
        == (
            RECALL + ',"action":"skipped","skipped_trigger_at":"2025-01-01T00:00:10Z",'
            '"type":"recall_update"' + TAIL
        ).encode()
    )
    fired = recall("rescheduled", fired_at="2025-01-01T00:00:00Z", run_id=3)
    assert (
        frame(fired)
        == (
            RECALL + ',"action":"rescheduled","fired_at":"2025-01-01T00:00:00Z","run_id":3,'
            '"type":"recall_update"' + TAIL
        ).encode()
    )
