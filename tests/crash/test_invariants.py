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


def _beat(state: str, detail: dict | None) -> list[dict]:
    return [
        {
            "id": 1,
            "session_id": "dev/s",
            "source": "heartbeat",
            "state": state,
            "detail": detail,
            "idempotency_key": None,
        }
    ]


def test_a_suppressed_heartbeat_is_done_with_one_heartbeat_suppressed_and_no_stream():
    quiet = {"status": "completed", "suppressed": True}
    held = _store([_turn("dev/s", 1, "heartbeat_suppressed", 1)], _beat("done", quiet))
    assert check(held, Record()) == []
    streamed = _store(
        [
            _turn("dev/s", 1, "heartbeat_suppressed", 1),
            _turn("dev/s", 2, "stream_start", 1),
            _turn("dev/s", 3, "stream_end", 1),
        ],
        _beat("done", quiet),
    )
    silent = _store([], _beat("done", quiet))
    assert check(streamed, Record()) + check(silent, Record()) == [
        "suppressed input 1 (heartbeat, done) has ['heartbeat_suppressed', 'stream_start',"
        " 'stream_end'] instead of one heartbeat_suppressed, done",
        "suppressed input 1 (heartbeat, done) has no events instead of one"
        " heartbeat_suppressed, done",
    ]


def test_a_heartbeat_cut_after_its_heartbeat_suppressed_is_closed_interrupted_once():
    events = [
        _turn("dev/s", 1, "heartbeat_suppressed", 1),
        _turn("dev/s", 2, "stream_start", 1),
        _turn("dev/s", 3, "stream_end", 1, status="interrupted"),
    ]
    assert check(_store(events, _beat("interrupted", {"status": "interrupted"})), Record()) == []
    assert check(_store(events, _beat("done", {"status": "completed"})), Record()) == [
        "input 1 (heartbeat, done) has ['heartbeat_suppressed', 'stream_start', 'stream_end']:"
        " a heartbeat_suppressed with a turn that was not cut by a crash"
    ]


def test_a_delivery_lost_or_run_twice_and_a_buffer_left_behind_are_caught():
    inputs = [
        {
            "id": i,
            "session_id": "dev/s",
            "source": "github",
            "state": "done",
            "detail": None,
            "idempotency_key": None,
            "payload": {"delivery_id": "github:d1"},
        }
        for i in (1, 2)
    ]
    events = [
        _turn("dev/s", n + 1, k, i)
        for i in (1, 2)
        for n, k in enumerate(["stream_start", "stream_end"], start=2 * (i - 1))
    ]
    snap = _store(
        events,
        inputs,
        webhook_deliveries=[{"id": "github:d1"}],
        kv=[{"namespace": "notify:dev/s", "key": "00000000000000000001"}],
    )
    record = Record(deliveries={"github:d1", "github:d2"})
    record.deleted.add("dev/s")
    assert check(snap, record) == [
        "delivery github:d2 was answered 2xx and is not stored",
        "delivery github:d1 made 2 inputs in dev/s (one turn each)",
        "deleted session dev/s left sessions (1), inbox (2), events (4), kv (1)",
    ]


def test_a_deleted_sessions_watcher_rows_are_caught():
    snap = Snapshot(
        {
            "kv": [
                {"namespace": "watchers", "key": "w1", "value": {"session_id": "dev/s"}},
                {"namespace": "watchers-index", "key": "dev/s\x1fw1", "value": {}},
                {"namespace": "watchers", "key": "w2", "value": {"session_id": "dev/other"}},
            ]
        }
    )
    record = Record(deleted={"dev/s"})
    assert check(snap, record) == ["deleted session dev/s left kv (2)"]


def _folding(user_message_seq: int, ran_alone: bool) -> Snapshot:
    """Input 1's turn (seq 1 and 3); input 2, a notice folded into it, its user_message at
    ``user_message_seq``; with ``ran_alone``, input 3 ran it as a turn of its own."""
    notice = {"content": "the task ended", "background_tasks": ["bg-1"]}
    inputs = [
        {
            "id": 1,
            "session_id": "dev/s",
            "source": "user",
            "state": "done",
            "detail": None,
            "payload": {"content": "hi"},
            "idempotency_key": "client:m1",
        },
        {
            "id": 2,
            "session_id": "dev/s",
            "source": "notification",
            "state": "done",
            "detail": {"injected_into": 1},
            "payload": notice,
            "idempotency_key": "background:bg-1",
        },
    ]
    events = [
        _turn("dev/s", 1, "stream_start", 1),
        _turn("dev/s", 3, "stream_end", 1, status="completed"),
        {
            "session_id": "dev/s",
            "seq": user_message_seq,
            "type": "user_message",
            "payload": {"source": "notification", "injected_into": 1, **notice},
        },
    ]
    if ran_alone:
        inputs.append(
            {
                "id": 3,
                "session_id": "dev/s",
                "source": "notification",
                "state": "done",
                "detail": None,
                "payload": {**notice, "was_injected": True},
                "idempotency_key": None,
            }
        )
        events += [_turn("dev/s", 5, "stream_start", 3), _turn("dev/s", 6, "stream_end", 3)]
    events.sort(key=lambda e: e["seq"])
    return _store(events, inputs, last_seq=max(e["seq"] for e in events))


def test_an_input_folded_into_a_turn_that_closed_first_is_caught_unless_it_ran_alone():
    record = _acked(1)
    assert check(_folding(2, ran_alone=False), record) == []  # inside its turn
    (violation,) = [v for v in check(_folding(4, ran_alone=False), record) if "folded" in v]
    assert "was folded into the turn of input 1 but is not inside it" in violation
    assert not [v for v in check(_folding(4, ran_alone=True), record) if "folded" in v]
