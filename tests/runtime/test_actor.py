"""Actors and refs: tell, tell_nowait, ask, backpressure, stop, lifecycle hooks."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from turnstile.runtime.actor import Actor
from turnstile.runtime.errors import ActorCrashed, ActorStopped, MailboxFull
from turnstile.runtime.supervisor import open_supervisor


class Recorder(Actor):
    """Records what it receives; ``("fail", x)`` raises, ``("slow", s)`` sleeps."""

    def __init__(self, log: list | None = None) -> None:
        self.log = log if log is not None else []

    async def on_start(self) -> None:
        self.log.append("start")

    async def on_stop(self) -> None:
        self.log.append("stop")

    async def receive(self, message):
        if isinstance(message, tuple) and message[0] == "fail":
            raise ValueError(message[1])
        if isinstance(message, tuple) and message[0] == "slow":
            await trio.sleep(message[1])
        self.log.append(message)
        return ("echo", message)


async def test_tell_is_handled_in_order():
    log: list = []
    async with open_supervisor() as sup:
        ref = await sup.spawn(lambda: Recorder(log), name="rec")
        for i in range(100):
            await ref.tell(i)
        await ref.stop()
    assert log == ["start", *range(100), "stop"]


async def test_ask_returns_the_answer():
    async with open_supervisor() as sup:
        ref = await sup.spawn(Recorder, name="rec")
        assert await ref.ask("hi") == ("echo", "hi")


async def test_error_while_handling_ask_goes_to_asker_and_actor_carries_on():
    log: list = []
    async with open_supervisor() as sup:
        ref = await sup.spawn(lambda: Recorder(log), name="rec")
        with pytest.raises(ValueError, match="^boom$"):
            await ref.ask(("fail", "boom"))
        assert await ref.ask("after") == ("echo", "after")
        assert list(sup.crash_reports) == []
    assert log == ["start", "after", "stop"]


async def test_tell_nowait_raises_mailbox_full_and_tell_waits(autojump_clock):
    log: list = []
    async with open_supervisor() as sup:
        ref = await sup.spawn(lambda: Recorder(log), name="rec", mailbox_size=2)
        await ref.tell(("slow", 10))  # the actor takes it and sleeps
        await trio.testing.wait_all_tasks_blocked()
        ref.tell_nowait(1)
        ref.tell_nowait(2)
        with pytest.raises(MailboxFull, match=r"^mailbox of rec is full \(2 messages\)$"):
            ref.tell_nowait(3)
        start = trio.current_time()
        await ref.tell(3)  # backpressure: waits until the slow message is done
        assert trio.current_time() - start == pytest.approx(10)
        await ref.stop()
    assert log == ["start", ("slow", 10), 1, 2, 3, "stop"]


async def test_stop_handles_queued_messages_then_refuses_new_ones():
    log: list = []
    async with open_supervisor() as sup:
        ref = await sup.spawn(lambda: Recorder(log), name="rec")
        ref.tell_nowait("a")
        ref.tell_nowait("b")
        await ref.stop()
        assert not ref.is_alive
        with pytest.raises(ActorStopped, match="^rec is stopped$"):
            await ref.tell("c")
        with pytest.raises(ActorStopped):
            await ref.ask("c")
    assert log == ["start", "a", "b", "stop"]


async def test_pending_asks_fail_when_a_crashed_actor_is_not_restarted(autojump_clock):
    async with open_supervisor() as sup:
        ref = await sup.spawn(Recorder, name="rec", restart=False)
        errors: list[BaseException] = []

        async def ask_later() -> None:
            try:
                await ref.ask("queued")
            except ActorCrashed as exc:
                errors.append(exc)

        await ref.tell(("slow", 1))
        await ref.tell(("fail", "crash"))  # crashes after the slow one; no restart
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_later)
    assert [str(e) for e in errors] == ["rec crashed while handling tuple: ValueError: crash"]


async def test_asker_bounds_its_wait_with_a_cancel_scope(autojump_clock):
    async with open_supervisor() as sup:
        ref = await sup.spawn(Recorder, name="rec")
        await ref.tell(("slow", 30))
        with trio.move_on_after(1) as scope:
            await ref.ask("late")
        assert scope.cancelled_caught
        # the actor is unharmed and still answers
        assert await ref.ask("x") == ("echo", "x")


async def test_on_start_failure_is_raised_by_spawn():
    class Broken(Actor):
        async def on_start(self) -> None:
            raise RuntimeError("cannot load state")

    async with open_supervisor() as sup:
        with pytest.raises(RuntimeError, match="^cannot load state$"):
            await sup.spawn(Broken, name="broken")
        assert sup.children == []


async def test_shutdown_runs_on_stop_of_every_child():
    log: list = []
    async with open_supervisor() as sup:
        for name in ("a", "b"):
            await sup.spawn(lambda: Recorder(log), name=name)
    assert log == ["start", "start", "stop", "stop"]


async def test_cancelled_actor_still_runs_on_stop(autojump_clock):
    log: list = []
    with trio.move_on_after(5):
        async with open_supervisor() as sup:
            ref = await sup.spawn(lambda: Recorder(log), name="rec")
            await ref.tell(("slow", 100))
            await trio.sleep_forever()
    assert log == ["start", "stop"]


class Worker(Actor):
    """Starts background work in its own nursery."""

    uses_nursery = True

    def __init__(self, log: list) -> None:
        self.log = log

    async def _work(self, seconds: float, fail: bool) -> None:
        try:
            await trio.sleep(seconds)
            if fail:
                raise OSError("background work failed")
            self.log.append("work done")
        except trio.Cancelled:
            self.log.append("work cancelled")
            raise

    async def on_stop(self) -> None:
        self.log.append("stop")

    async def receive(self, message):
        seconds, fail = message
        self.nursery.start_soon(self._work, seconds, fail)
        return "started"


async def test_actor_nursery_tasks_run_beside_the_mailbox_and_end_with_the_actor(autojump_clock):
    log: list = []
    async with open_supervisor() as sup:
        ref = await sup.spawn(lambda: Worker(log), name="worker")
        assert await ref.ask((1, False)) == "started"
        assert await ref.ask((50, False)) == "started"  # the mailbox is free while work runs
        await trio.sleep(2)
        await ref.stop()
    assert log == ["work done", "stop", "work cancelled"]


async def test_a_failing_actor_task_crashes_the_actor_and_it_restarts(autojump_clock):
    log: list = []
    reports = []
    async with open_supervisor(on_crash=reports.append) as sup:
        ref = await sup.spawn(lambda: Worker(log), name="worker")
        await ref.ask((1, True))
        await trio.sleep(2)
        assert await ref.ask((1, False)) == "started"  # a new incarnation answers
        await trio.sleep(2)
    assert [str(r) for r in reports] == [
        "worker crashed while running its own task: ExceptionGroup: Exceptions from Trio nursery "
        "(1 sub-exception)"
    ]
    assert "work done" in log
