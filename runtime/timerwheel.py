"""A hierarchical timing wheel: the scheduler's index of every timer, due soon or months out.

Why not ``heapq``: a heap cancels lazily (the entry stays until it reaches the top), so a
session that pushes its timeout back on every message leaves a trail of dead entries, and every
push and pop pays ``log n`` comparisons. Here ``schedule`` and ``cancel`` are O(1), and a
cancelled timer is unlinked at once, so its memory and its payload are freed at once.

How: time is cut into ticks. Level 0 has one slot per tick of the current block of
``2**_SLOT_BITS`` ticks; each level above has one slot per block of the level below, and
timers beyond the top level wait in an overflow list. A slot is a doubly linked ring of the
handles themselves, so unlinking is two stores. When time reaches a slot's block, the slot
cascades: its due timers fire, the others move down to where they now belong. A bitmap of
occupied slots per level lets ``advance`` jump over empty stretches of any length: slot j is
bit ``slots - 1 - j``, so the first occupied slot from a position on is one ``bit_length`` of
the bitmap under a mask. The earliest pending deadline is cached with its ring; firing it when
it is alone there (a scheduler that sleeps until the next deadline, timers sparse) unlinks it,
looks one bitmap step further for the next ring, and cascades nothing.

It is over 400 lines because it is one data structure: schedule, cancel, advance and cascade
maintain the same rings, bitmaps and cursor, and ``advance``'s fast paths only make sense next to
them.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from turnstile.runtime.errors import TimerError
from turnstile.runtime.timerring import _DONE, TimerHandle, _bit_tables, _new_handle, _ring

__all__ = ["TimerHandle", "TimerWheel"]

_deadline_of = attrgetter("deadline")
_payload_of = attrgetter("payload")
_INF = float("inf")


class TimerWheel:
    """Pending timers, indexed by deadline, fired in deadline order.

    The wheel does no I/O and keeps no time of its own: the caller passes the current time
    (``trio.current_time()`` or any other monotonic float) to :meth:`advance`.

    Args:
        now: the current time; deadlines are on the same clock.
        tick: the width of a level-0 slot, in seconds. Timers of one tick share a slot and are
            sorted when they fire, so the tick only trades slot length against cascades. With
            the default, five levels of 256 slots reach 2**40 ms (about 34 years).

    Raises:
        TimerError: ``now`` is not finite, or ``tick`` is not positive and finite.
    """

    # 2**_SLOT_BITS slots per level; tests shrink both to exercise cascades and overflow.
    _SLOT_BITS = 8
    _LEVELS = 5

    __slots__ = (
        "_now",
        "_cur",
        "_origin",
        "_inv",
        "_tick",
        "_len",
        "_next_deadline",
        "_first",
        "_heads",
        "_bits",
        "_overflow",
        "_level_of",
        "_shift_of",
        "_placement",
        "_layout",
        "_fast",
        "_bit",
        "_slot_bits",
        "_levels",
        "_mask",
    )

    def __init__(self, now: float = 0.0, tick: float = 0.001) -> None:
        if not isinstance(tick, int | float) or not 0.0 < tick < _INF:
            raise TimerError("tick must be positive and finite")
        if not isinstance(now, int | float) or now - now != 0:
            raise TimerError("now must be finite")
        slot_bits, levels = self._SLOT_BITS, self._LEVELS
        self._slot_bits = slot_bits
        self._levels = levels
        self._mask = (1 << slot_bits) - 1
        self._now = float(now)
        # Ticks count from the first ``now``, so they are never negative for pending timers.
        self._origin = float(now)
        self._tick = float(tick)
        self._inv = 1.0 / tick
        # The tick that slots are placed relative to. It never passes the tick of ``_now``, so
        # a timer in an earlier slot is always due; advance() moves it when it fires anything.
        self._cur = 0
        self._len = 0
        self._heads = [
            [_ring(lvl, j, slot_bits) for j in range(1 << slot_bits)] for lvl in range(levels)
        ]
        self._bits = [0] * levels
        self._overflow = _ring(-1, 0, 0)
        # The exact earliest pending deadline (inf when empty), or None when unknown; while it
        # is known, _first is the ring that holds it (the overflow ring when empty).
        self._next_deadline: float | None = _INF
        self._first = self._overflow
        # By the bit length of (tick ^ cur): the level a timer belongs to and that level's
        # shift; a table lookup is cheaper than a division on every schedule.
        self._level_of = [0] + [(n - 1) // slot_bits for n in range(1, slot_bits * levels + 1)]
        self._shift_of = [lvl * slot_bits for lvl in self._level_of]
        bit, from_ = _bit_tables(slot_bits)
        self._bit = bit
        # What advance() needs, in tuples: unpacking one beats several attribute loads.
        self._placement = (self._origin, self._inv, self._level_of, self._shift_of)
        self._layout = (
            self._bits,
            self._heads,
            self._mask,
            slot_bits,
            # The levels from each level up (the last one empty).
            tuple(tuple(range(lvl, levels)) for lvl in range(levels + 1)),
            bit,
            from_,
            1 << slot_bits,
        )
        # The few that advance()'s one-timer fast path needs.
        self._fast = (self._bits, self._heads, bit, from_, 1 << slot_bits)

    def __len__(self) -> int:
        """The number of pending timers."""
        return self._len

    def __repr__(self) -> str:
        return f"<TimerWheel now={self._now!r} pending={self._len}>"

    @property
    def now(self) -> float:
        """The ``now`` of the last :meth:`advance` (at first, the constructor's)."""
        return self._now

    @property
    def tick(self) -> float:
        """The width of a level-0 slot, in seconds."""
        return self._tick

    def schedule(self, deadline: float, payload: Any) -> TimerHandle:
        """Schedule ``payload`` to fire at ``deadline``. O(1).

        A deadline at or before the wheel's current time is allowed: the timer fires on the
        next :meth:`advance`, in deadline order with everything else that is due.

        Args:
            deadline: when to fire, on the same clock as ``now``.
            payload: anything; :meth:`advance` returns it when the timer fires.

        Returns:
            The handle, for :meth:`cancel` and :meth:`reschedule`.

        Raises:
            TimerError: ``deadline`` is NaN or infinite.
        """
        try:
            tick = int((deadline - self._origin) * self._inv)
        except (ValueError, OverflowError):
            raise TimerError("deadline must be finite") from None
        handle = _new_handle(TimerHandle)
        handle.deadline = deadline
        handle.payload = payload
        handle._wheel = self
        # _link, inlined: schedule is the hottest call.
        cur = self._cur
        if tick <= cur:
            lvl = 0
            j = cur & self._mask
            head = self._heads[0][j]
        else:
            n = (tick ^ cur).bit_length()
            level_of = self._level_of
            if n < len(level_of):
                lvl = level_of[n]
                j = (tick >> self._shift_of[n]) & self._mask
                head = self._heads[lvl][j]
            else:
                lvl = -1
                head = self._overflow
        prev = head._prev
        handle._prev = prev
        handle._next = head
        prev._next = handle
        head._prev = handle
        if prev is head and lvl >= 0:
            self._bits[lvl] |= self._bit[j]
        self._len += 1
        nd = self._next_deadline
        if nd is not None and deadline < nd:
            if nd == _INF:
                # The wheel was empty, so _cur may lag far behind ``now``: catch it up and
                # place the timer again, relative to the present (fewer cascades later).
                now_tick = int((self._now - self._origin) * self._inv)
                if now_tick > cur:
                    head._prev = prev
                    prev._next = head
                    self._cur = now_tick
                    head = self._link(handle, tick)
            self._next_deadline = deadline
            self._first = head
        return handle

    def _link(self, handle: TimerHandle, tick: int) -> TimerHandle:
        """Append ``handle`` to the ring where ``tick`` belongs now; return the ring."""
        cur = self._cur
        if tick <= cur:
            # Due already, or due in the current tick: the current slot fires first.
            lvl = 0
            j = cur & self._mask
            head = self._heads[0][j]
        else:
            n = (tick ^ cur).bit_length()
            if n < len(self._level_of):
                lvl = self._level_of[n]
                j = (tick >> self._shift_of[n]) & self._mask
                head = self._heads[lvl][j]
            else:
                lvl = -1
                head = self._overflow
        prev = head._prev
        handle._prev = prev
        handle._next = head
        prev._next = handle
        head._prev = handle
        if prev is head and lvl >= 0:
            self._bits[lvl] |= self._bit[j]
        return head

    def cancel(self, handle: TimerHandle) -> bool:
        """Cancel a pending timer. O(1): its slot lets go of it and of its payload at once.

        Args:
            handle: as returned by :meth:`schedule`.

        Returns:
            True if the timer was pending; False if it had already fired or been cancelled.

        Raises:
            TimerError: ``handle`` is pending on another wheel.
        """
        nxt = handle._next
        if nxt is _DONE:
            return False
        if handle._wheel is not self:
            raise TimerError("handle belongs to another wheel")
        prev = handle._prev
        prev._next = nxt
        nxt._prev = prev
        # An emptied slot keeps its bit: the bitmaps are supersets, cleaned when scanned.
        handle._next = handle._prev = _DONE
        handle._wheel = handle.payload = None
        self._len -= 1
        if handle.deadline == self._next_deadline:
            self._next_deadline = None
        return True

    def reschedule(self, handle: TimerHandle, deadline: float) -> None:
        """Move a pending timer to ``deadline``, keeping its handle and payload. O(1).

        For ties it counts as scheduled now: it fires after timers already scheduled for the
        same deadline.

        Args:
            handle: a pending handle of this wheel.
            deadline: the new deadline; as for :meth:`schedule`, it may be in the past.

        Raises:
            TimerError: ``deadline`` is not finite, or ``handle`` is not pending on this wheel.
        """
        try:
            tick = int((deadline - self._origin) * self._inv)
        except (ValueError, OverflowError):
            raise TimerError("deadline must be finite") from None
        nxt = handle._next
        if nxt is _DONE or handle._wheel is not self:
            raise TimerError("handle is not pending on this wheel")
        prev = handle._prev
        prev._next = nxt
        nxt._prev = prev
        old = handle.deadline
        handle.deadline = deadline
        head = self._link(handle, tick)
        nd = self._next_deadline
        if nd is not None:
            if old == nd:
                self._next_deadline = None
            elif deadline < nd:
                self._next_deadline = deadline
                self._first = head

    def next_deadline(self) -> float | None:
        """The earliest pending deadline, exactly; None when nothing is pending.

        It is in the past if a timer was scheduled at or before the current time and
        :meth:`advance` has not run since. Cached: usually an attribute read; after a cancel of
        the earliest timer, a short scan and a walk of one slot.
        """
        nd = self._next_deadline
        if nd is None:
            nd = self._find_next()
        return None if nd == _INF else nd

    def _find_next(self) -> float:
        """Recompute and cache the earliest pending deadline (inf when empty) and its ring."""
        head = self._first = self._scan(self._cur, 0)
        nd = _INF
        h = head._next
        while h is not head:
            d = h.deadline
            if d < nd:
                nd = d
            h = h._next
        self._next_deadline = nd
        return nd

    def _scan(self, cur: int, level: int) -> TimerHandle:
        """The ring of the earliest pending timers relative to ``cur``, from ``level`` up.

        Every timer at level k is later than every timer below it, and the slots of a level run
        in time order from the current position; so the first occupied slot of the lowest
        occupied level holds the earliest timer. When every level is empty, the overflow ring
        (empty too, or holding the earliest). Stale bits left by cancels are cleared here.
        Callers pass a ``level`` below which every level is empty.
        """
        bits, heads, mask, slot_bits, upward, bit, from_, slots = self._layout
        for lvl in upward[level]:
            m = bits[lvl]
            if m:
                m &= from_[(cur >> (lvl * slot_bits)) & mask]
                while m:
                    j = slots - m.bit_length()
                    head = heads[lvl][j]
                    if head._next is not head:
                        return head
                    bits[lvl] ^= bit[j]
                    m ^= bit[j]
        return self._overflow

    def advance(self, now: float) -> list[Any]:
        """Move the wheel's time to ``now`` and fire every timer due by then.

        Args:
            now: the current time; not earlier than the previous ``now``.

        Returns:
            The payloads of all pending timers with ``deadline <= now``, in deadline order
            (ties in schedule order). Each timer fires once; cancelled timers never fire.

        Raises:
            TimerError: ``now`` is not finite, or earlier than the previous ``now``.
        """
        nd = self._next_deadline
        if nd is not None and self._now <= now:
            if now < nd:
                # Nothing is due (the usual case, so it comes first). _cur stays put: slots stay
                # valid relative to it, and the next advance that fires catches up in one go.
                self._now = now
                return []
            head = self._first
            h = head._next
            lvl, j, hi, offset = head.payload
            if h._next is head and lvl >= 0 and now < _INF:
                # The earliest timer is due and alone in its slot (the usual firing when a
                # scheduler sleeps until the next deadline): fire it and find the next ring.
                # _cur moves to the slot's block only (not to ``now``), which keeps every other
                # slot valid: nothing is pending before that block, and nothing moves.
                cur = self._cur >> hi << hi | offset
                bits, heads, bit, from_, slots = self._fast
                # The ring was occupied, so its bit is set: xor clears it.
                b = bits[lvl] ^ bit[j]
                bits[lvl] = b
                head._next = head._prev = head
                h._next = h._prev = _DONE
                self._now = now
                # The next ring is most often a later slot of the same level.
                m = b & from_[j]
                if not m:
                    head = self._scan(cur, lvl + 1)
                else:
                    head = heads[lvl][slots - m.bit_length()]
                    if head._next is head:
                        head = self._scan(cur, lvl)
                g = head._next
                if g._next is head:
                    # One timer, or none: an empty ring's sentinel has an infinite deadline.
                    nd = g.deadline
                else:
                    nd = _INF
                    while g is not head:
                        d = g.deadline
                        if d < nd:
                            nd = d
                        g = g._next
                if nd > now:
                    self._cur = cur
                    self._first = head
                    self._next_deadline = nd
                    self._len -= 1
                    return [h.payload]
                # More is due: go on from that ring, as below.
                return self._fire(now, cur, head, [h])
        if not self._now <= now < _INF:
            if now < self._now:
                raise TimerError("now must not go backwards")
            raise TimerError("now must be finite")
        self._now = now
        if nd is None:
            nd = self._find_next()
            if nd > now:
                return []
        # Something is due, so the wheel is not empty and _first is the ring of the earliest.
        return self._fire(now, self._cur, self._first, [])

    def _fire(self, now: float, cur: int, head: TimerHandle, fired: list[TimerHandle]) -> list[Any]:
        """Fire everything due by ``now``, from ``head``, the earliest ring relative to ``cur``.

        ``fired`` holds the timers fired already (unlinked, and not yet counted out of len).
        """
        target = int((now - self._origin) * self._inv)
        bits, heads, mask, slot_bits, upward, bit, from_, slots = self._layout
        level_ids = upward[0]
        done = _DONE
        # Each turn takes the earliest occupied ring and fires it, or cascades it, or stops
        # when it lies beyond ``now``; then a scan finds the next one.
        while True:
            lvl, j, hi, offset = head.payload
            # Where the ring's block starts (for the overflow ring, hi = offset = 0: at cur).
            t = cur >> hi << hi | offset
            if t > target:
                break
            h = head._next
            if lvl == 0:
                if t < target:
                    # The whole slot is due.
                    while h is not head:
                        fired.append(h)
                        nxt = h._next
                        h._next = h._prev = done
                        h = nxt
                    head._next = head._prev = head
                else:
                    # The slot of ``now`` itself: fire what is due, keep the rest in order.
                    keep = head
                    while h is not head:
                        nxt = h._next
                        if h.deadline <= now:
                            fired.append(h)
                            h._next = h._prev = done
                        else:
                            keep._next = h
                            h._prev = keep
                            keep = h
                        h = nxt
                    keep._next = head
                    head._prev = keep
                    if keep is not head:
                        break
                # The ring was occupied, so its bit is set.
                bits[0] ^= bit[j]
            elif lvl > 0:
                # A higher slot whose block has begun: fire what is due, cascade the rest.
                cur = t
                bits[lvl] ^= bit[j]
                head._next = head._prev = head
                origin, inv, level_of, shift_of = self._placement
                # Most go one level down; cur's index there is 0 (t starts a block), so a
                # timer whose index there is 0 goes lower.
                below = lvl - 1
                shift = below * slot_bits
                row = heads[below]
                while h is not head:
                    nxt = h._next
                    d = h.deadline
                    if d <= now:
                        fired.append(h)
                        h._next = h._prev = done
                    else:
                        # _link, inlined: the tick is in [cur, end of block), a lower level.
                        tick = int((d - origin) * inv)
                        k = (tick >> shift) & mask
                        if k:
                            lv = below
                            dst = row[k]
                        else:
                            n = (tick ^ cur).bit_length()
                            lv = level_of[n]
                            k = (tick >> shift_of[n]) & mask
                            dst = heads[lv][k]
                        prev = dst._prev
                        h._prev = prev
                        h._next = dst
                        prev._next = h
                        dst._prev = h
                        if prev is dst:
                            bits[lv] |= bit[k]
                    h = nxt
            else:
                # The overflow list, as every level is empty. Once time reaches a later
                # top-level block, place the list relative to the start of that block.
                top = slot_bits * len(level_ids)
                if h is head or target >> top == cur >> top:
                    break
                cur = self._cur = target >> top << top
                self._cascade(head)
            # _scan, inlined: the next occupied ring.
            for lvl in level_ids:
                m = bits[lvl]
                if m:
                    m &= from_[(cur >> (lvl * slot_bits)) & mask]
                    while m:
                        j = slots - m.bit_length()
                        head = heads[lvl][j]
                        if head._next is not head:
                            break
                        bits[lvl] ^= bit[j]
                        m ^= bit[j]
                    else:
                        continue
                    break
            else:
                head = self._overflow

        # ``head`` is the first ring left, as much relative to ``target`` as to ``cur``: no
        # slot between them is occupied. Its earliest deadline is the next deadline.
        self._cur = target
        self._first = head
        nd = _INF
        h = head._next
        while h is not head:
            d = h.deadline
            if d < nd:
                nd = d
            h = h._next
        self._next_deadline = nd
        self._len -= len(fired)
        if len(fired) == 1:
            return [fired[0].payload]
        # Slots fire in tick order, but a cascade fires its due timers directly and a slot is
        # unordered within its tick: one stable sort settles it. Ties keep schedule order, as
        # timers of one deadline always share a ring, in the order they were scheduled.
        fired.sort(key=_deadline_of)
        return list(map(_payload_of, fired))

    def _cascade(self, head: TimerHandle) -> None:
        """Re-place every timer of the ring ``head`` relative to the current ``_cur``."""
        origin = self._origin
        inv = self._inv
        link = self._link
        h = head._next
        head._next = head._prev = head
        while h is not head:
            nxt = h._next
            link(h, int((h.deadline - origin) * inv))
            h = nxt
