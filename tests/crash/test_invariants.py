"""The crash invariants catch what they name (tests/crash/invariants.py), on made-up stores."""

from __future__ import annotations

from tests.crash.invariants import Record, check
from tests.crash.stores import Snapshot


def _turn(session: str, seq: int, kind: str, input_id: int, **payload) -> dict:
    return {
        "session_id": session,
        "seq": seq,
        "type": kind,
        "payload": {"input_id": input_id, **payload},
    }


def _store(events, inputs=None, last_seq=None, **tables) -> Snapshot:
    inputs = inputs or [
        {
            "id": 1,
            "session_id": "dev/s",
            "source": "user",
            "state": "done",
            "detail": None,
            "idempotency_key": "client:m1",
        }
    ]
    return Snapshot(
        {
            "sessions": [
                {"id": "dev/s", "last_seq": len(events) if last_seq is None else last_seq}
            ],
            "inbox": inputs,
            "events": events,
            **tables,
        }
    )


def _acked(*ids: int) -> Record:
    record = Record()
    record.acked[("dev/s", "client:m1")].update(ids)
    return record


def test_one_turn_per_input_holds():
    snap = _store([_turn("dev/s", 1, "stream_start", 1), _turn("dev/s", 2, "stream_end", 1)])
    assert check(snap, _acked(1)) == []


def test_a_turn_run_twice_is_caught():
    snap = _store(
        [
            _turn("dev/s", 1, "stream_start", 1),
            _turn("dev/s", 2, "stream_end", 1, status="completed"),
            _turn("dev/s", 3, "stream_start", 1),
            _turn("dev/s", 4, "stream_end", 1, status="interrupted"),
        ]
    )
    assert check(snap, _acked(1)) == [
        "input 1 (user, done) has ['stream_start', 'stream_end', 'stream_start', 'stream_end']"
        " instead of one stream_start then one stream_end"
    ]


def test_a_queued_input_a_gap_and_a_lost_key_are_caught():
    inputs = [
        {
            "id": 2,
            "session_id": "dev/s",
            "source": "user",
            "state": "queued",
            "detail": None,
            "idempotency_key": "client:m2",
        }
    ]
    snap = _store(
        [_turn("dev/s", 1, "stream_start", 9), _turn("dev/s", 3, "stream_end", 9)],
        inputs,
        last_seq=3,
    )
    assert check(snap, _acked(1)) == [
        "input 2 (user) stays queued",
        "events name input 9, which the inbox does not hold",
        "session dev/s: seqs 1,3 with last_seq 3 (expected 1..3 without a gap)",
        "key 'client:m1' of dev/s: acknowledged as input(s) [1], stored as nothing",
    ]


def test_an_occurrence_run_twice_and_a_deleted_session_left_behind_are_caught():
    snap = _store(
        [_turn("dev/s", 1, "stream_start", 1), _turn("dev/s", 2, "stream_end", 1)],
        jobs=[{"id": "j", "session_id": "dev/s", "run_count": 2}],
        job_runs=[
            {
                "id": 1,
                "job_id": "j",
                "scheduled_for": "t",
                "state": "turn_completed",
                "input_id": 1,
            },
            {"id": 2, "job_id": "j", "scheduled_for": "t", "state": "queued", "input_id": 1},
        ],
    )
    record = _acked(1)
    record.deleted.add("dev/s")
    assert check(snap, record) == [
        "job j: 2 runs for the occurrence at t",
        "input 1: 2 job runs name it",
        "job j: run 2 stays queued (never settled)",
        "deleted session dev/s left sessions (1), inbox (1), events (2), jobs (1)",
    ]
