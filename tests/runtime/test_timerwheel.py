"""The timer wheel: ordering, cancel, cascades, far deadlines, misuse; and a model-based test.

The stateful test drives the wheel and a ``heapq`` reference model with the same random
interleavings of schedule, cancel, reschedule and advance, on the default wheel and on a tiny
one (4 slots, 3 levels) where every few ticks cross a cascade boundary or the overflow list.
"""

from __future__ import annotations

import gc
import heapq
import math
import tracemalloc
import weakref

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from turnstile.runtime.errors import TimerError
from turnstile.runtime.timerwheel import TimerHandle, TimerWheel

DAY = 86400.0


class TinyWheel(TimerWheel):
    """4 slots a level, 3 levels: level boundaries every 4, 16 and 64 ticks, overflow beyond."""

    _SLOT_BITS = 2
    _LEVELS = 3


class Payload:
    """Something a weak reference can point at."""


# --- scheduling and firing ------------------------------------------------------------------


def test_fires_in_deadline_order_none_early():
    wheel = TimerWheel()
    for d in [5.0, 0.5, 3.25, 0.0015, 60.0, 0.001]:
        wheel.schedule(d, d)
    assert wheel.advance(0.0009) == []
    assert wheel.advance(3.25) == [0.001, 0.0015, 0.5, 3.25]
    assert wheel.advance(59.999) == [5.0]
    assert wheel.advance(60.0) == [60.0]
    assert len(wheel) == 0


def test_timers_within_one_tick_fire_in_deadline_order_and_only_when_due():
    wheel = TimerWheel(tick=1.0)
    for d in [10.9, 10.1, 10.5, 10.3]:
        wheel.schedule(d, d)
    assert wheel.advance(10.4) == [10.1, 10.3]
    assert wheel.next_deadline() == 10.5
    assert wheel.advance(10.95) == [10.5, 10.9]


def test_ties_fire_in_schedule_order_even_across_a_cascade():
    wheel = TimerWheel(tick=1.0)
    wheel.schedule(70_000.0, "first")  # far enough for level 2
    wheel.advance(69_990.0)  # the first has cascaded to level 0 by now
    wheel.schedule(70_000.0, "second")
    wheel.schedule(69_999.5, "earlier")
    wheel.schedule(70_000.0, "third")
    assert wheel.advance(70_000.0) == ["earlier", "first", "second", "third"]


def test_reschedule_counts_as_scheduled_now_for_ties():
    wheel = TimerWheel()
    a = wheel.schedule(1.0, "a")
    wheel.schedule(1.0, "b")
    wheel.reschedule(a, 1.0)
    assert wheel.advance(1.0) == ["b", "a"]


def test_deadline_in_the_past_fires_on_the_next_advance_in_order():
    wheel = TimerWheel(now=100.0)
    wheel.schedule(100.5, "later")
    wheel.advance(100.2)
    wheel.schedule(100.2, "now")
    wheel.schedule(3.0, "long ago")
    wheel.schedule(100.1, "just before")
    assert wheel.next_deadline() == 3.0
    assert wheel.advance(100.2) == ["long ago", "just before", "now"]
    assert wheel.advance(100.5) == ["later"]


def test_advance_returns_everything_due_after_a_long_jump():
    wheel = TimerWheel()
    deadlines = [i * 7.3 for i in range(1, 2000)]
    for d in reversed(deadlines):
        wheel.schedule(d, d)
    assert wheel.advance(deadlines[-1]) == deadlines
    assert wheel.next_deadline() is None


def test_advance_to_the_same_time_is_allowed():
    wheel = TimerWheel()
    wheel.schedule(1.0, "x")
    assert wheel.advance(0.5) == []
    assert wheel.advance(0.5) == []
    assert wheel.now == 0.5


def test_new_timers_after_an_idle_stretch_are_placed_from_the_present():
    wheel = TimerWheel()
    wheel.advance(10 * DAY)  # empty all along: nothing to fire
    wheel.schedule(10 * DAY + 0.002, "soon")
    assert wheel._bits[0], "placed on level 0, not relative to day 0"  # white box: no cascades
    assert wheel.advance(10 * DAY + 0.001) == []
    assert wheel.advance(10 * DAY + 0.002) == ["soon"]


# --- far deadlines and cascade boundaries ---------------------------------------------------


def test_deadline_ninety_days_out_at_1ms_tick():
    wheel = TimerWheel(tick=0.001)
    far = 90 * DAY
    wheel.schedule(far, "far")
    wheel.schedule(1.0, "near")
    assert wheel.advance(1.0) == ["near"]
    assert wheel.next_deadline() == far
    for day in range(1, 90):
        assert wheel.advance(day * DAY) == []
    assert wheel.advance(far - 0.0005) == []
    assert wheel.advance(far) == ["far"]


def test_overflow_beyond_the_top_level():
    # 2**40 µs is 12.7 days: ninety days lies beyond the top level, in the overflow list.
    wheel = TimerWheel(tick=1e-6)
    far = 90 * DAY
    wheel.schedule(far, "far")
    wheel.schedule(far + 1e-6, "later")
    wheel.schedule(30 * DAY, "month")
    assert wheel.next_deadline() == 30 * DAY
    assert wheel.advance(30 * DAY) == ["month"]
    assert wheel.next_deadline() == far
    assert wheel.advance(far - 1e-6) == []
    assert wheel.advance(far + 1e-6) == ["far", "later"]


@pytest.mark.parametrize("boundary", [256, 256**2, 256**3, 256**4, 256**5])
def test_each_level_boundary(boundary):
    wheel = TimerWheel(tick=1.0)
    for d in (boundary - 1, boundary, boundary + 0.5, boundary + 1):
        wheel.schedule(float(d), d)
    assert wheel.advance(boundary - 1.5) == []
    assert wheel.next_deadline() == boundary - 1
    assert wheel.advance(boundary - 1) == [boundary - 1]
    assert wheel.advance(boundary - 0.5) == []
    assert wheel.advance(boundary) == [boundary]
    assert wheel.advance(boundary + 0.75) == [boundary + 0.5]
    assert wheel.advance(boundary + 1) == [boundary + 1]


def test_a_cascade_fires_only_what_is_due():
    # At 1 ms ticks, 0.2565 s and 65.5365 s sit in slots of levels 1 and 2 whose blocks begin
    # just before them: reaching the block cascades the slot, but only the due half fires.
    wheel = TimerWheel(tick=0.001)
    for d in (0.25655, 0.25645, 65.53655, 65.53645):
        wheel.schedule(d, d)
    assert wheel.advance(0.2565) == [0.25645]
    assert wheel.advance(0.25655) == [0.25655]
    assert wheel.advance(65.5365) == [65.53645]
    assert wheel.next_deadline() == 65.53655
    assert wheel.advance(65.53655) == [65.53655]


def test_tiny_wheel_cascades_through_every_level_and_overflow():
    wheel = TinyWheel(tick=1.0)
    deadlines = [0.5, 3.0, 4.0, 15.0, 16.0, 63.0, 64.0, 65.0, 200.0, 5000.5]
    for d in deadlines:
        wheel.schedule(d, d)
    fired = []
    now = 0.0
    while (nd := wheel.next_deadline()) is not None:
        assert nd >= now
        now = nd
        fired += wheel.advance(now)
    assert fired == deadlines


# --- one deadline at a time (advance's fast path) -------------------------------------------


def test_one_timer_per_advance_and_the_next_deadline_stays_exact():
    # Sparse timers, as a scheduler that sleeps until the next deadline fires them: each
    # advance fires the earliest alone in its slot and finds the next slot, on any level.
    wheel = TimerWheel()
    deadlines = [0.3 + 0.7 * i for i in range(200)] + [0.3001, 70.0, 65.5, 4000.0, 20 * DAY]
    for d in reversed(deadlines):
        wheel.schedule(d, d)
    fired = []
    while (nd := wheel.next_deadline()) is not None:
        assert wheel.advance(nd) == [nd]
        fired.append(nd)
    assert fired == sorted(deadlines)
    assert len(wheel) == 0


def test_an_advance_past_the_earliest_fires_the_next_slots_too():
    wheel = TimerWheel()
    wheel.schedule(1.0, "a")  # alone in its slot
    wheel.schedule(1.5, "b")  # in a later slot, due by the same advance
    wheel.schedule(1.6, "c")
    wheel.schedule(1.5005, "d")  # b's slot, not due yet
    assert wheel.advance(1.5) == ["a", "b"]
    assert wheel.next_deadline() == 1.5005
    assert wheel.advance(2.0) == ["d", "c"]


def test_a_later_slot_emptied_by_a_cancel_is_skipped():
    # 1.0, 1.3 and 1.6 s are in three slots of level 1; cancelling 1.3 leaves its slot's bit
    # set until a scan passes it.
    wheel = TimerWheel()
    wheel.schedule(1.0, "a")
    b = wheel.schedule(1.3, "b")
    wheel.schedule(1.6, "c")
    wheel.cancel(b)
    assert wheel.advance(1.0) == ["a"]
    assert wheel.next_deadline() == 1.6
    assert wheel.advance(1.6) == ["c"]


def test_next_deadline_after_firing_one_then_cancelling_the_earliest():
    wheel = TimerWheel()
    wheel.schedule(1.0, "a")
    b = wheel.schedule(2.0, "b")
    wheel.schedule(3.0, "c")
    assert wheel.advance(1.0) == ["a"]
    assert wheel.next_deadline() == 2.0
    assert wheel.cancel(b)
    assert wheel.next_deadline() == 3.0
    assert wheel.advance(3.0) == ["c"]


def test_next_deadline_after_firing_one_then_scheduling_earlier_than_the_next():
    wheel = TimerWheel()
    wheel.schedule(1.0, "a")
    wheel.schedule(300.0, "far")  # level 2, and the next deadline once a has fired
    assert wheel.advance(1.0) == ["a"]
    assert wheel.next_deadline() == 300.0
    wheel.schedule(1.0005, "soon")  # placed relative to the cursor left at a's slot
    wheel.schedule(0.5, "late")  # in the past: fires on the next advance
    assert wheel.next_deadline() == 0.5
    assert wheel.advance(1.0) == ["late"]
    assert wheel.advance(1.0005) == ["soon"]
    assert wheel.advance(300.0) == ["far"]


def test_ties_keep_schedule_order_after_firing_one_at_a_time():
    wheel = TimerWheel(tick=1.0)
    wheel.schedule(70_000.0, "first")  # level 2
    wheel.schedule(10.0, "early")
    assert wheel.advance(10.0) == ["early"]
    wheel.schedule(70_000.0, "second")
    assert wheel.advance(69_990.0) == []
    wheel.schedule(70_000.0, "third")
    assert wheel.advance(70_000.0) == ["first", "second", "third"]


def test_firing_the_last_timer_in_the_wheel_leaves_the_overflow_next():
    wheel = TinyWheel(tick=1.0)  # levels reach 64 ticks: 500 waits in the overflow list
    wheel.schedule(1.0, 1.0)
    wheel.schedule(500.0, 500.0)
    assert wheel.advance(1.0) == [1.0]
    assert wheel.next_deadline() == 500.0
    assert wheel.advance(499.0) == []
    assert wheel.advance(500.0) == [500.0]
    assert wheel.next_deadline() is None
    wheel.schedule(502.0, 502.0)  # the wheel was empty: placed from the present
    assert wheel.advance(502.0) == [502.0]


# --- cancel and reschedule ------------------------------------------------------------------


def test_cancel_returns_whether_it_was_pending():
    wheel = TimerWheel()
    a = wheel.schedule(1.0, "a")
    b = wheel.schedule(2.0, "b")
    assert wheel.cancel(a) is True
    assert wheel.cancel(a) is False
    assert wheel.advance(2.0) == ["b"]
    assert wheel.cancel(b) is False  # already fired
    assert not a.active and not b.active


def test_cancelled_timers_never_fire_and_leave_the_earliest_deadline():
    wheel = TimerWheel()
    handles = [wheel.schedule(float(i), i) for i in range(1, 11)]
    for h in handles[:5]:
        wheel.cancel(h)
    assert wheel.next_deadline() == 6.0
    assert len(wheel) == 5
    assert wheel.advance(100.0) == [6, 7, 8, 9, 10]


def test_cancel_drops_the_payload_at_once():
    wheel = TimerWheel()
    payload = Payload()
    ref = weakref.ref(payload)
    handle = wheel.schedule(3600.0, payload)
    del payload
    assert ref() is not None
    gc.disable()  # freed by reference counting alone, not by a later collection
    try:
        wheel.cancel(handle)
        assert ref() is None
        assert handle.payload is None
    finally:
        gc.enable()


def test_cancel_a_handle_of_another_wheel():
    handle = TimerWheel().schedule(1.0, "x")
    with pytest.raises(TimerError, match="^handle belongs to another wheel$"):
        TimerWheel().cancel(handle)


def test_reschedule_moves_the_timer_and_keeps_handle_and_payload():
    wheel = TimerWheel()
    h = wheel.schedule(10.0, "x")
    wheel.schedule(5.0, "y")
    wheel.reschedule(h, 1.0)
    assert h.deadline == 1.0 and h.active
    assert wheel.next_deadline() == 1.0
    wheel.reschedule(h, 20.0)
    assert wheel.next_deadline() == 5.0
    assert wheel.advance(20.0) == ["y", "x"]
    assert not h.active


def test_reschedule_a_timer_that_is_not_pending():
    wheel = TimerWheel()
    h = wheel.schedule(1.0, "x")
    wheel.advance(1.0)
    with pytest.raises(TimerError, match="^handle is not pending on this wheel$"):
        wheel.reschedule(h, 2.0)
    other = TimerWheel().schedule(1.0, "y")
    with pytest.raises(TimerError, match="^handle is not pending on this wheel$"):
        wheel.reschedule(other, 2.0)


# --- next_deadline and len ------------------------------------------------------------------


def test_next_deadline_and_len():
    wheel = TimerWheel()
    assert wheel.next_deadline() is None
    assert len(wheel) == 0
    a = wheel.schedule(2.5, "a")
    wheel.schedule(7.0, "b")
    assert wheel.next_deadline() == 2.5
    assert len(wheel) == 2
    wheel.cancel(a)
    assert wheel.next_deadline() == 7.0
    assert len(wheel) == 1
    wheel.advance(7.0)
    assert wheel.next_deadline() is None
    assert len(wheel) == 0


# --- misuse ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_deadline_must_be_finite(bad):
    wheel = TimerWheel()
    with pytest.raises(TimerError, match="^deadline must be finite$"):
        wheel.schedule(bad, "x")
    h = wheel.schedule(1.0, "x")
    with pytest.raises(TimerError, match="^deadline must be finite$"):
        wheel.reschedule(h, bad)
    assert len(wheel) == 1 and h.deadline == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_now_must_be_finite(bad):
    wheel = TimerWheel()
    wheel.schedule(1.0, "x")
    with pytest.raises(TimerError, match="^now must be finite$"):
        wheel.advance(bad)
    assert wheel.advance(1.0) == ["x"]


def test_now_must_not_go_backwards():
    wheel = TimerWheel(now=10.0)
    wheel.advance(12.0)
    with pytest.raises(TimerError, match="^now must not go backwards$"):
        wheel.advance(11.999)
    with pytest.raises(TimerError, match="^now must not go backwards$"):
        wheel.advance(-math.inf)


@pytest.mark.parametrize("tick", [0, -0.001, math.inf, math.nan])
def test_tick_must_be_positive_and_finite(tick):
    with pytest.raises(TimerError, match="^tick must be positive and finite$"):
        TimerWheel(tick=tick)


def test_constructor_now_must_be_finite():
    with pytest.raises(TimerError, match="^now must be finite$"):
        TimerWheel(now=math.nan)


# --- the handle -----------------------------------------------------------------------------


def test_handle_has_slots_and_exposes_its_state():
    wheel = TimerWheel()
    h = wheel.schedule(1.5, "p")
    assert isinstance(h, TimerHandle)
    assert not hasattr(h, "__dict__")
    assert (h.deadline, h.payload, h.active) == (1.5, "p", True)
    assert "active" in repr(h)
    wheel.advance(2.0)
    assert (h.payload, h.active) == ("p", False)


def test_pending_timer_costs_under_200_bytes_and_cancel_gives_it_back():
    n = 20_000
    deadlines = [i * 0.173 for i in range(n)]
    payload = Payload()
    handles = [None] * n  # allocated up front, so that it is not counted
    wheel = TimerWheel()  # so is the wheel's fixed cost: its empty slots (about 230 kB)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, d in enumerate(deadlines):
            handles[i] = wheel.schedule(d, payload)
        held = tracemalloc.get_traced_memory()[0] - before
        for i in range(0, n, 2):
            wheel.cancel(handles[i])
            handles[i] = None
        after = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / n < 200
    assert after < 0.55 * held


# --- the model-based test -------------------------------------------------------------------


class WheelVersusHeap(RuleBasedStateMachine):
    """The wheel against a lazy-deletion heap of ``(deadline, seq, key)``."""

    wheel_cls: type[TimerWheel] = TimerWheel
    tick = 0.001

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0 * self.tick
        self.wheel = self.wheel_cls(now=self.now, tick=self.tick)
        self.slots = 1 << self.wheel_cls._SLOT_BITS
        self.levels = self.wheel_cls._LEVELS
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.handles: dict[int, TimerHandle] = {}  # every key ever scheduled
        self.current: dict[int, int] = {}  # pending key -> seq of its live heap entry

    def offset(self, data: st.DataObject) -> float:
        """A deadline offset from now: near, past, at a level boundary, or far out."""
        kind = data.draw(st.sampled_from(["near", "boundary", "far"]))
        if kind == "near":
            ticks = data.draw(st.floats(min_value=-3, max_value=6))
        elif kind == "boundary":
            level = data.draw(st.integers(1, self.levels + 1))
            ticks = self.slots**level * data.draw(st.integers(1, 3)) + data.draw(
                st.sampled_from([-1, -0.5, 0, 0.5, 1])
            )
        else:
            ticks = data.draw(st.floats(min_value=0, max_value=self.slots ** (self.levels + 1.5)))
        return ticks * self.tick

    def push(self, key: int, deadline: float) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (deadline, self.seq, key))
        self.current[key] = self.seq

    @rule(data=st.data())
    def schedule(self, data):
        key = len(self.handles)
        deadline = self.now + self.offset(data)
        self.handles[key] = self.wheel.schedule(deadline, key)
        self.push(key, deadline)

    @precondition(lambda self: self.current)
    @rule(data=st.data())
    def schedule_a_tie(self, data):
        key = len(self.handles)
        deadline = self.handles[data.draw(st.sampled_from(sorted(self.current)))].deadline
        self.handles[key] = self.wheel.schedule(deadline, key)
        self.push(key, deadline)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def cancel(self, data):
        key = data.draw(st.sampled_from(sorted(self.handles)))
        assert self.wheel.cancel(self.handles[key]) is (key in self.current)
        self.current.pop(key, None)
        assert self.handles[key].payload is None or not self.handles[key].active

    @precondition(lambda self: self.current)
    @rule(data=st.data())
    def reschedule(self, data):
        key = data.draw(st.sampled_from(sorted(self.current)))
        deadline = self.now + self.offset(data)
        self.wheel.reschedule(self.handles[key], deadline)
        self.push(key, deadline)

    def expect(self, now: float) -> list[int]:
        fired = []
        while self.heap and self.heap[0][0] <= now:
            _, seq, key = heapq.heappop(self.heap)
            if self.current.get(key) == seq:
                del self.current[key]
                fired.append(key)
        return fired

    def advance_to(self, now: float) -> None:
        self.now = now
        fired = self.wheel.advance(now)
        assert fired == self.expect(now)
        for key in fired:  # none early
            assert self.handles[key].deadline <= now
            assert not self.handles[key].active

    @rule(data=st.data())
    def advance(self, data):
        kind = data.draw(st.sampled_from(["stay", "little", "boundary", "far"]))
        if kind == "stay":
            self.advance_to(self.now)
        elif kind == "little":
            self.advance_to(self.now + data.draw(st.floats(0, 3)) * self.tick)
        elif kind == "boundary":
            block = self.slots ** data.draw(st.integers(1, self.levels))
            here = int(self.now / self.tick)
            self.advance_to((here // block + 1) * block * self.tick)
        else:
            self.advance_to(self.now + self.offset(data) + self.slots * self.tick)

    @rule(data=st.data())
    def advance_to_next_deadline(self, data):
        nd = self.wheel.next_deadline()
        if nd is not None:
            nudge = data.draw(st.sampled_from([0.0, -0.25, 0.5])) * self.tick
            self.advance_to(max(self.now, nd + nudge))

    @invariant()
    def agrees_with_the_model(self):
        assert len(self.wheel) == len(self.current)
        live = [d for d, seq, key in self.heap if self.current.get(key) == seq]
        assert self.wheel.next_deadline() == (min(live) if live else None)


class TinyWheelVersusHeap(WheelVersusHeap):
    wheel_cls = TinyWheel
    tick = 1.0


_model_settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestWheelVersusHeap = WheelVersusHeap.TestCase
TestWheelVersusHeap.settings = _model_settings
TestTinyWheelVersusHeap = TinyWheelVersusHeap.TestCase
TestTinyWheelVersusHeap.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
