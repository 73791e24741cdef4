"""Supervision: strategies, restart intensity, escalation, crash reports, kept mailboxes."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from turnstile.runtime.actor import Actor
from turnstile.runtime.errors import ActorCrashed, ActorStopped, SupervisorEscalation
from turnstile.runtime.supervisor import Strategy, open_supervisor


class Counter(Actor):
    """Counts messages per incarnation; ``"boom"`` crashes it, ``"block"`` waits on a gate."""

    incarnations: list[Counter]

    def __init__(self, incarnations: list, gate: trio.Event | None = None) -> None:
        self.seen: list = []
        self.gate = gate
        incarnations.append(self)

    async def receive(self, message):
        if message == "boom":
            raise KeyError("boom")
        if message == "block":
            await self.gate.wait()
        self.seen.append(message)
        return len(self.seen)


async def test_crash_report_names_actor_message_type_and_exception():
    reports = []
    async with open_supervisor("root", on_crash=reports.append) as sup:
        incarnations: list = []
        ref = await sup.spawn(lambda: Counter(incarnations), name="counter")
        await ref.tell("boom")
        assert await ref.ask("after") == 1
    (report,) = reports
    assert (report.supervisor, report.actor, report.message_type) == ("root", "counter", "str")
    assert isinstance(report.error, KeyError)
    assert str(report) == "counter crashed while handling str: KeyError: 'boom'"
    assert "raise KeyError" in report.traceback
    assert len(incarnations) == 2  # restarted once


async def test_one_for_one_restart_keeps_the_mailbox_and_spares_siblings():
    gate = trio.Event()
    crashed: list = []
    sibling: list = []
    async with open_supervisor(strategy=Strategy.ONE_FOR_ONE) as sup:
        ref = await sup.spawn(lambda: Counter(crashed, gate), name="a")
        other = await sup.spawn(lambda: Counter(sibling), name="b")
        await other.tell("before")
        await ref.tell("block")  # holds the actor so the next messages wait in its mailbox
        await ref.tell("boom")
        for i in range(3):
            await ref.tell(i)
        gate.set()
        assert await ref.ask("last") == 4  # the new incarnation handled 0, 1, 2, then last
        assert await other.ask("after") == 2
    assert [c.seen for c in crashed] == [["block"], [0, 1, 2, "last"]]
    assert len(sibling) == 1  # never restarted
    assert sibling[0].seen == ["before", "after"]


async def test_one_for_all_restarts_siblings_and_redelivers_their_interrupted_message():
    gate = trio.Event()
    a: list = []
    b: list = []
    async with open_supervisor(strategy=Strategy.ONE_FOR_ALL) as sup:
        ref_a = await sup.spawn(lambda: Counter(a), name="a")
        ref_b = await sup.spawn(lambda: Counter(b, gate), name="b")
        await ref_b.tell("kept")
        await ref_b.tell("block")  # b is mid-message when a crashes
        await trio.testing.wait_all_tasks_blocked()
        await ref_a.tell("boom")
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        assert await ref_b.ask("after") == 2
        assert await ref_a.ask("x") == 1
    assert len(a) == 2 and len(b) == 2
    assert b[0].seen == ["kept"]
    assert b[1].seen == ["block", "after"]  # the interrupted message was redelivered


async def test_restart_intensity_exceeded_escalates_to_the_parent(autojump_clock):
    incarnations: list = []
    with pytest.raises(SupervisorEscalation) as info:
        async with open_supervisor("root", max_restarts=2, within=10) as sup:
            ref = await sup.spawn(lambda: Counter(incarnations), name="flaky")
            for _ in range(3):
                await ref.tell("boom")
                await trio.testing.wait_all_tasks_blocked()
            await trio.sleep_forever()  # cancelled by the escalation
    assert info.value.supervisor == "root"
    assert str(info.value.report) == "flaky crashed while handling str: KeyError: 'boom'"
    assert len(incarnations) == 3


async def test_crashes_spread_beyond_the_window_do_not_escalate(autojump_clock):
    incarnations: list = []
    async with open_supervisor(max_restarts=1, within=5) as sup:
        ref = await sup.spawn(lambda: Counter(incarnations), name="flaky")
        for _ in range(4):
            await ref.tell("boom")
            await trio.sleep(6)
        assert await ref.ask("alive") == 1
    assert len(incarnations) == 5


async def test_nested_supervisor_escalation_is_a_crash_of_the_child_in_its_parent(autojump_clock):
    reports = []
    incarnations: list = []
    async with open_supervisor("root", on_crash=reports.append) as root:
        sub = await root.spawn_supervisor("sub", max_restarts=0)
        ref = await sub.spawn(lambda: Counter(incarnations), name="worker")
        await ref.tell("one")
        await ref.tell("boom")  # sub gives up at once and escalates; root restarts sub
        await trio.testing.wait_all_tasks_blocked()
        assert await ref.ask("two") == 1  # same ref, same mailbox, new incarnation
    assert [r.actor for r in reports] == ["worker", "sub"]
    assert len(incarnations) == 2


async def test_without_escalation_only_the_offending_child_is_given_up(autojump_clock):
    incarnations: list = []
    healthy: list = []
    async with open_supervisor(escalate=False, max_restarts=1, within=60) as sup:
        bad = await sup.spawn(lambda: Counter(incarnations), name="bad")
        good = await sup.spawn(lambda: Counter(healthy), name="good")
        bad.tell_nowait("boom")
        bad.tell_nowait("boom")
        with pytest.raises(ActorCrashed, match="^bad crashed while handling str: KeyError"):
            await bad.ask("queued behind the fatal crash")
        assert not bad.is_alive
        with pytest.raises(ActorStopped, match="^bad is stopped$"):
            await bad.ask("x")
        assert await good.ask("fine") == 1
        assert sup.children == ["good"]
