"""``turnstile attach``'s account of what its lines still wait for (``runtime.attach._Sent``):
at the end of input it leaves once every line is answered and every turn they started ended,
whatever order the replies and the events come in (on trio's MockClock)."""

from __future__ import annotations

import trio

from turnstile.runtime.attach import _Sent


async def settles(sent: _Sent) -> bool:
    """Whether ``settled`` returns without another frame."""
    with trio.move_on_after(1):
        await sent.settled()
        return True
    return False


async def test_a_turn_ending_before_its_ack_is_not_waited_for_again(autojump_clock):
    sent = _Sent()
    sent.sent()
    sent.seen({"type": "stream_end", "input_id": 7, "status": "completed"})
    assert not await settles(sent)  # the send is not answered yet
    sent.seen({"type": "ack", "session_id": "s", "input_id": 7})
    assert await settles(sent)


async def test_an_acknowledged_line_waits_for_its_turn_not_for_others(autojump_clock):
    sent = _Sent()
    sent.sent()
    sent.seen({"type": "ack", "session_id": "s", "input_id": 3})
    sent.seen({"type": "stream_end", "input_id": 2, "status": "completed"})  # someone else's
    assert not await settles(sent)
    sent.seen({"type": "stream_end", "input_id": 3, "status": "completed"})
    assert await settles(sent)


async def test_a_refused_line_has_no_turn_and_unprompted_errors_answer_no_line(autojump_clock):
    sent = _Sent()
    sent.sent()
    sent.seen({"type": "error", "code": "lagged", "session_id": "s", "message": "behind"})
    sent.seen({"type": "error", "code": "not_found", "id": "call-1", "message": "no tool"})
    assert not await settles(sent)
    sent.seen({"type": "error", "code": "busy", "session_id": "s", "message": "a turn runs"})
    assert await settles(sent)


async def test_a_line_folded_into_the_running_turn_waits_for_nothing_more(autojump_clock):
    sent = _Sent()
    sent.sent()
    sent.seen({"type": "ack", "session_id": "s", "injected": True})
    assert await settles(sent)


async def test_a_waiter_wakes_when_the_last_turn_ends(autojump_clock):
    sent = _Sent()
    sent.sent()
    sent.seen({"type": "ack", "session_id": "s", "input_id": 1})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sent.settled)
        await trio.testing.wait_all_tasks_blocked()
        sent.seen({"type": "stream_end", "input_id": 1, "status": "stopped"})
