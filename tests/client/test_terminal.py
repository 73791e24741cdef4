"""``turnstile attach``'s account of the turns its lines started (``client.terminal._Turns``):
at the end of input it leaves once every turn they started ended, whatever order the ``ack``
and the turn's ``stream_end`` come in (on trio's MockClock). The terminal itself is tested
end to end in ``tests/e2e/test_cli.py``."""

from __future__ import annotations

import trio

from turnstile.client.terminal import _Turns


async def settles(turns: _Turns) -> bool:
    """Whether ``settled`` returns without another event."""
    with trio.move_on_after(1):
        await turns.settled()
        return True
    return False


async def test_a_turn_ending_before_its_ack_is_not_waited_for(autojump_clock):
    turns = _Turns()
    turns.finished(7)
    turns.started(7)
    assert await settles(turns)


async def test_an_acknowledged_line_waits_for_its_turn_not_for_others(autojump_clock):
    turns = _Turns()
    turns.started(3)
    turns.finished(2)  # someone else's
    assert not await settles(turns)
    turns.finished(3)
    assert await settles(turns)


async def test_a_waiter_wakes_when_the_last_turn_ends(autojump_clock):
    turns = _Turns()
    turns.started(1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns.settled)
        await trio.testing.wait_all_tasks_blocked()
        turns.finished(1)
