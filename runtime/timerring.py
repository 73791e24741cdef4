"""The timer wheel's building blocks: a timer's handle, which is also the node of its slot's
ring, the empty ring that stands for a slot, and the bitmap masks that find the next occupied
slot (``runtime/timerwheel.py`` is the wheel that keeps them).

They are apart from the wheel because they are what a timer *is* (the one object allocated
per timer, and the sentinel its links point to once it is done), while the wheel is what is
done with them; the wheel reads them as module globals, as fast as its own.
"""

from __future__ import annotations

from functools import cache
from typing import Any

__all__ = ["TimerHandle"]

_INF = float("inf")


class TimerHandle:
    """One scheduled timer, as returned by :meth:`TimerWheel.schedule`.

    Attributes:
        deadline: when the timer is due, on the wheel's clock (seconds).
        payload: what :meth:`TimerWheel.advance` returns when the timer fires; ``None`` once
            the timer is cancelled (the reference is dropped at once).
    """

    # The handle is also the node of its slot's ring: nothing else is allocated per timer.
    __slots__ = ("deadline", "payload", "_prev", "_next", "_wheel")

    deadline: float
    payload: Any
    # The links of its slot's ring; a ring's sentinel points to itself when the slot is empty.
    # Once the timer has fired or been cancelled both point to _DONE rather than None, so a link
    # is always a handle and the ring walks need no None checks (nor do the type checker's).
    _prev: TimerHandle
    _next: TimerHandle
    _wheel: Any  # the TimerWheel that holds it; None once done (typed loosely: no import loop)

    @property
    def active(self) -> bool:
        """True while the timer is pending (neither fired nor cancelled)."""
        return self._next is not _DONE

    def __repr__(self) -> str:
        state = "active" if self._next is not _DONE else "done"
        return f"<TimerHandle deadline={self.deadline!r} {state}>"


_new_handle = object.__new__

# What the links of a fired or cancelled handle point to (itself linked to itself).
_DONE = _new_handle(TimerHandle)
_DONE.deadline = _INF
_DONE.payload = _DONE._wheel = None
_DONE._prev = _DONE._next = _DONE


@cache
def _bit_tables(slot_bits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The bitmap masks for ``2**slot_bits`` slots, shared by every wheel of that size.

    Returns:
        ``(bit, from_)``: ``bit[j]`` is slot j's bit; ``from_[j]`` has the bits of slots j and
        after, so the first occupied one is ``slots - (bits & from_[j]).bit_length()``.
    """
    slots = 1 << slot_bits
    return (
        tuple(1 << (slots - 1 - j) for j in range(slots)),
        tuple((1 << (slots - j)) - 1 for j in range(slots)),
    )


def _ring(level: int, index: int, slot_bits: int) -> TimerHandle:
    """An empty slot: a sentinel handle linked to itself.

    Its payload is its address, precomputed for advance(): ``(level, index, hi, offset)``,
    where the slot's block starts at tick ``cur >> hi << hi | offset``.
    """
    head = _new_handle(TimerHandle)
    head.deadline = _INF
    shift = level * slot_bits
    head.payload = (level, index, shift + slot_bits, index << shift)
    head._wheel = None
    head._prev = head._next = head
    return head
