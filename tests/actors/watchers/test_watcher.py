"""Watchers on trio's MockClock: strategies, debounce, cooldown, backoff, persistence, the wheel.

The watched tool is a fake (``probe.read``) whose result the test sets; notifications reach a
real session actor (``node()`` from the scheduler tests), so "folded into the running turn"
and "a turn of its own" are the session's real behaviour.
"""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.mock_node import DAY, node
from tests.support.sessions import StoreWith
from tests.support.watchers import Probe, watching
from turnstile.actors.sessions.actor import Submit
from turnstile.actors.watchers.actor import (
    NAMESPACE,
    DropSessionWatchers,
    GetWatcher,
    ListWatchers,
    PauseWatcher,
    StartWatcher,
    WatcherActor,
    WatcherHistory,
    backoff_delay,
)
from turnstile.actors.watchers.tools import watch_runner
from turnstile.runtime.errors import InvalidArgument, NotFound, StoreError


def head(wid: str, label: str = "", tool: str = "probe.read") -> str:
    return f'[WATCHER UPDATE] watcher_id={wid}, label="{label}", tool={tool}'


# -- strategies --------------------------------------------------------------------------------


@pytest.mark.guard(DAY)
async def test_on_change_notifies_the_baseline_then_only_changes_with_the_exact_text(
    autojump_clock,
):
    async with watching() as w:
        started = await w.call("watch_start", tool="probe.read", interval=10, label="API health")
        wid = started.data["watcher_id"]
        assert started.data == {
            "watcher_id": wid,
            "tool_name": "probe.read",
            "label": "API health",
            "status": "running",
            "interval": 10,
            "notify_when": "on_change",
            "notify_config": {},
            "hint": "Watcher 'API health' started. Checking probe.read every 10s. "
            "You'll be notified via 'on_change' strategy.",
        }
        await trio.sleep(25)  # checks at 0, 10, 20: one result, one notification
        w.probe.value = {"value": 2, "note": "é"}
        await trio.sleep(10)  # the check at 30 sees the change
        assert w.notes() == [
            f"{head(wid, 'API health')}\n"
            "Check #1 (interval: 10s, 1 notification(s) so far, strategy: on_change)\n"
            'Result: {"value": 1}\n'
            "Baseline (first check): you will be notified when the result changes.",
            f"{head(wid, 'API health')}\n"
            "Check #4 (interval: 10s, 2 notification(s) so far, strategy: on_change)\n"
            'Result: {"value": 2, "note": "é"}',
        ]
        # The notifications started turns of their own (the session was idle).
        assert [s["source"] for s in w.n.starts()] == ["notification", "notification"]
        inputs = await w.n.store.list_inputs("s")
        assert [i.payload["watcher_id"] for i in inputs] == [wid, wid]
        updates = w.updates()
        assert [(u["what"], u.get("check")) for u in updates] == [
            ("started", None),
            ("escalated", 1),
            ("escalated", 4),
        ]
        assert updates[2]["result"] == '{"note":"é","value":2}'
        status = (await w.call("watch_status", watcher_id=wid)).data
        assert (status["check_count"], status["notification_count"]) == (4, 2)
        assert status["last_result"] == {"ok": True, "result": '{"note":"é","value":2}'}


@pytest.mark.guard(DAY)
async def test_on_error_notifies_the_error_and_the_recovery_only(autojump_clock):
    async with watching() as w:
        wid = await w.start(interval=5, notify_when="on_error", label="db")
        await trio.sleep(7)  # checks at 0 and 5 succeed: silence
        assert w.notes() == []
        w.probe.fail = "Connection refused"
        await trio.sleep(5)  # the check at 10 fails; the next is backed off to 20
        w.probe.fail = None
        await trio.sleep(10)  # the check at 20 succeeds: recovery
        assert w.notes() == [
            f"{head(wid, 'db')}\n"
            "Check #3 (interval: 5s, 1 notification(s) so far, strategy: on_error)\n"
            "Error: Connection refused",
            f"{head(wid, 'db')}\n"
            "Check #4 (interval: 5s, 2 notification(s) so far, strategy: on_error)\n"
            'Result: {"value": 1}\n'
            "Recovered after 1 failed check(s).",
        ]
        history = (await w.call("watch_history", watcher_id=wid)).data
        assert [(e["check"], e["ok"], e["escalated"]) for e in history["entries"]] == [
            (1, True, False),
            (2, True, False),
            (3, False, True),
            (4, True, True),
        ]
        assert history["entries"][2]["error"] == "Connection refused"


@pytest.mark.guard(DAY)
async def test_on_threshold_is_edge_triggered(autojump_clock):
    async with watching() as w:
        w.probe.value = {"value": 5}
        wid = await w.start(
            interval=5,
            notify_when="on_threshold",
            notify_config={"expression": "result.value > 10"},
        )
        await trio.sleep(2)
        w.probe.value = {"value": 11}
        await trio.sleep(10)  # checks at 5 (becomes true: notify) and 10 (still true: silent)
        w.probe.value = {"value": 3}
        await trio.sleep(5)  # check at 15: false, silent; the watcher is re-armed
        w.probe.value = {"value": 20}
        await trio.sleep(5)  # check at 20: true again, notify
        notes = w.notes()
        assert notes == [
            f"{head(wid)}\n"
            "Check #2 (interval: 5s, 1 notification(s) so far, strategy: on_threshold)\n"
            'Result: {"value": 11}\n'
            "Condition met: result.value > 10",
            f"{head(wid)}\n"
            "Check #5 (interval: 5s, 2 notification(s) so far, strategy: on_threshold)\n"
            'Result: {"value": 20}\n'
            "Condition met: result.value > 10",
        ]


@pytest.mark.guard(DAY)
async def test_a_threshold_sees_a_failed_check_as_an_error_result(autojump_clock):
    async with watching() as w:
        await w.start(
            interval=5,
            notify_when="on_threshold",
            notify_config={"expression": "result.error != null"},
        )
        await trio.sleep(2)
        w.probe.fail = "boom"
        await trio.sleep(5)
        (note,) = w.notes()
        assert "Error: boom" in note and "Condition met: result.error != null" in note


async def test_a_bad_expression_is_refused_at_start_with_its_position(autojump_clock):
    async with watching() as w:
        refused = await w.call(
            "watch_start",
            tool="probe.read",
            notify_when="on_threshold",
            notify_config={"expression": "result.value >> 3"},
        )
        assert refused.error == {
            "code": "bad_expression",
            "message": "unknown operator '>>' at position 13",
            "field": "expression",
        }
        # The actor refuses it too (a caller that skips the tool layer).
        from turnstile.actors.watchers.safeexpr import ExprError

        with pytest.raises(ExprError) as caught:
            await w.ref.ask(
                StartWatcher(
                    session_id="s",
                    owner="ada",
                    tool="probe.read",
                    notify_when="on_threshold",
                    notify_config={"expression": "result.a == 1 and"},
                )
            )
        assert caught.value.position == 17
        missing = await w.call("watch_start", tool="probe.read", notify_when="on_threshold")
        assert missing.error["field"] == "notify_config.expression"
        assert (await w.call("watch_list")).data["total"] == 0


@pytest.mark.guard(DAY)
async def test_summary_notifies_every_batch(autojump_clock):
    async with watching() as w:
        w.probe.script.extend([{"n": 1}, InvalidArgument("flaky"), {"n": 3}, {"n": 4}])
        wid = await w.start(interval=5, notify_when="summary", notify_config={"batch_size": 3})
        await trio.sleep(16)  # checks at 0, 5 (fails: next at 15), 15
        assert w.notes() == [
            f"{head(wid)}\n"
            "Check #3 (interval: 5s, 1 notification(s) so far, strategy: summary)\n"
            'Summary (3 checks): [{"check": 1, "result": {"n": 1}}, '
            '{"check": 2, "error": "flaky"}, {"check": 3, "result": {"n": 3}}]'
        ]


@pytest.mark.guard(DAY)
async def test_always_with_a_cooldown_counts_what_it_holds_back(autojump_clock):
    async with watching() as w:
        wid = await w.start(
            interval=5, notify_when="always", notify_config={"cooldown_seconds": 12}
        )
        await trio.sleep(31)  # checks 0..30; escalations at 0, 15, 30
        notes = w.notes()
        assert [n.splitlines()[1].split(" (")[0] for n in notes] == [
            "Check #1",
            "Check #4",
            "Check #7",
        ]
        assert notes[1].endswith("2 earlier escalation(s) held back by the cooldown (12s).")
        status = (await w.call("watch_status", watcher_id=wid)).data
        assert (status["notification_count"], status["suppressed_count"]) == (3, 4)
        assert status["notify_config"] == {"cooldown_seconds": 12}


# -- debounce, cooldown, backoff ---------------------------------------------------------------


@pytest.mark.guard(DAY)
async def test_debounce_escalates_only_when_consecutive_checks_agree(autojump_clock):
    async with watching() as w:
        down = InvalidArgument("down")
        ok = {"value": 1}
        w.probe.script.extend([ok, down, ok, down, down, down, ok, down, ok, ok, ok])
        wid = await w.start(interval=5, notify_when="on_error", notify_config={"debounce": 3})
        await trio.sleep(400)
        notes = w.notes()
        assert len(notes) == 2
        assert "Check #6 " in notes[0] and "Error: down" in notes[0]  # 3rd failure in a row
        assert "Check #11 " in notes[1] and "Recovered after 1 failed check(s)." in notes[1]
        history = (await w.call("watch_history", watcher_id=wid, last_n=100)).data["entries"]
        assert [e["check"] for e in history if e["escalated"]] == [6, 11]


@pytest.mark.guard(DAY)
async def test_cooldown_holds_changes_back_and_then_delivers_the_latest_state(autojump_clock):
    async with watching() as w:
        a, b, c = {"v": "a"}, {"v": "b"}, {"v": "c"}
        w.probe.script.extend([a, b, c, c, c, a, c])
        w.probe.value = c
        wid = await w.start(interval=5, notify_config={"cooldown_seconds": 20})
        await trio.sleep(46)
        notes = w.notes()
        assert len(notes) == 2
        assert "Check #1 " in notes[0] and 'Result: {"v": "a"}' in notes[0]
        # b (at 5) and c (at 10) were held back; at 20 the window is over and c is delivered.
        assert notes[1] == (
            f"{head(wid)}\n"
            "Check #5 (interval: 5s, 2 notification(s) so far, strategy: on_change)\n"
            'Result: {"v": "c"}\n'
            "2 earlier escalation(s) held back by the cooldown (20s)."
        )
        # a at 25 is held back, c at 30 is what was last notified: nothing more to say.
        status = (await w.call("watch_status", watcher_id=wid)).data
        assert (status["notification_count"], status["suppressed_count"]) == (2, 3)


@pytest.mark.guard(DAY)
async def test_a_failing_tool_backs_off_and_recovers_to_the_interval(autojump_clock):
    async with watching() as w:
        w.probe.fail = "down"
        t0 = trio.current_time()
        wid = await w.start(interval=5, notify_when="on_error")
        await trio.sleep(171)
        w.probe.fail = None
        await trio.sleep(60)
        times = [round(t - t0, 6) for t in w.probe.calls]
        # 5 × 2^k: 10, 20, 40, then capped at 10 × 5 = 50; back to 5 s after the success.
        assert times[:9] == [0, 10, 30, 70, 120, 170, 220, 225, 230]
        status = (await w.call("watch_status", watcher_id=wid)).data
        assert status["consecutive_errors"] == 0 and status["current_interval"] == 5
        assert backoff_delay(3600, 3) == 3600  # an hourly watcher never waits longer than 1 h
        assert backoff_delay(600, 3) == 3600 and backoff_delay(600, 1) == 1200


# -- pause/resume, history -------------------------------------------------------------------


@pytest.mark.guard(DAY)
async def test_pause_skips_checks_and_resume_restarts_them(autojump_clock):
    async with watching() as w:
        wid = await w.start(interval=5)
        await trio.sleep(7)  # checks at 0 and 5
        paused = (await w.call("watch_pause", watcher_id=wid)).data
        assert (paused["status"], paused["check_count"], paused["next_check_at"]) == (
            "paused",
            2,
            None,
        )
        await trio.sleep(23)
        assert len(w.probe.calls) == 2
        listed = (await w.call("watch_list")).data
        assert (listed["running"], listed["paused"]) == (0, 1)
        resumed = (await w.call("watch_resume", watcher_id=wid)).data
        assert resumed["status"] == "running"
        assert resumed["next_check_at"] == "2026-11-21T12:00:35Z"  # one interval from now
        await trio.sleep(6)
        assert len(w.probe.calls) == 3
        history = (await w.call("watch_history", watcher_id=wid)).data
        assert [e["check"] for e in history["entries"]] == [1, 2, 3]  # kept across the pause
        assert [u["what"] for u in w.updates()] == ["started", "escalated", "paused", "resumed"]
        stopped = (await w.call("watch_stop", watcher_id=wid)).data
        assert (stopped["status"], stopped["check_count"]) == ("stopped", 3)
        assert (await w.call("watch_status", watcher_id=wid)).error["code"] == "not_found"
        await trio.sleep(20)
        assert len(w.probe.calls) == 3
        await trio.testing.wait_all_tasks_blocked()
        assert await w.n.store.kv_list(NAMESPACE) == []  # stop forgets the history too


@pytest.mark.guard(DAY)
async def test_the_history_ring_keeps_the_last_100_checks(autojump_clock):
    async with watching() as w:
        counter = iter(range(10**6))
        w.probe.script = _Endless(lambda: {"n": next(counter)})
        wid = await w.start(interval=5)
        await trio.sleep(5 * 129 + 1)  # 130 checks
        history = (await w.call("watch_history", watcher_id=wid, last_n=100)).data
        assert (history["count"], history["total_checks"]) == (100, 130)
        assert [e["check"] for e in history["entries"]] == list(range(31, 131))
        assert history["entries"][-1]["result"] == '{"n":129}'
        assert set(history["entries"][0]) == {
            "check",
            "at",
            "ok",
            "result",
            "escalated",
            "duration_ms",
        }
        too_many = await w.call("watch_history", watcher_id=wid, last_n=101)
        assert too_many.error["code"] == "bad_arguments"
        assert len(w.actor.watchers[wid].history) == 100
        # The ring survives a restart whole (it is stored in chunks of 10 checks).
        await w.ref.stop()
        ref = await w.n.sup.spawn(
            lambda: WatcherActor(watch_runner(w.tools), w.n.publish, w.n.store, w.n.clock),
            name="watchers-again",
        )
        again = await ref.ask(WatcherHistory(watcher_id=wid, last_n=100))
        assert again["entries"] == history["entries"]


class _Endless:
    """A script that never runs out."""

    def __init__(self, make) -> None:
        self.make = make

    def __bool__(self) -> bool:
        return True

    def popleft(self):
        return self.make()


# -- notifications into a session --------------------------------------------------------------


@pytest.mark.guard(DAY)
async def test_a_notification_folds_into_a_running_turn(autojump_clock):
    async with watching() as w:
        await w.n.registry.ref("session:s").ask(Submit(content="wait:turn"))
        await w.n.seen.until(b'"stream_start"')
        wid = await w.start(interval=30)  # the first check runs at once, during the turn
        await trio.sleep(1)
        folded = [json.loads(f) for f in w.n.seen.frames if b'"user_message"' in f]
        assert len(folded) == 1
        assert folded[0]["injected_into"] is not None and folded[0]["watcher_id"] == wid
        w.n.agent.gate("wait:turn").set()
        await w.n.seen.until(b'"stream_end"')
        assert w.n.ends()[0]["text"].startswith(f"reply:wait:turn +{head(wid)}")
        assert len(w.n.starts()) == 1  # no turn of its own


@pytest.mark.guard(DAY)
async def test_escalations_of_one_session_arrive_as_one_notification(autojump_clock):
    async with watching() as w:
        first = await w.start(interval=10, label="one")
        second = await w.start(interval=10, label="two")
        await trio.sleep(1)
        (start,) = w.n.starts()
        assert start["content"].count("[WATCHER UPDATE]") == 2
        (item,) = await w.n.store.list_inputs("s")
        assert item.payload["watcher_ids"] == [first, second]


# -- persistence -------------------------------------------------------------------------------


@pytest.mark.guard(DAY)
async def test_watchers_survive_a_restart_running_resume_paused_stay_paused(autojump_clock):
    async with watching() as w:
        t0 = trio.current_time()
        running = await w.start(interval=10, label="keeps going")
        paused = await w.start(interval=10, notify_when="on_error")
        await trio.sleep(1)
        await w.call("watch_pause", watcher_id=paused)
        await trio.sleep(24)  # `running` checked at 0, 10, 20; its next is planned for 30
        await w.ref.stop()  # flushes what the last window had not
        await trio.sleep(100)  # down from 25 to 125
        ref = await w.n.sup.spawn(
            lambda: WatcherActor(watch_runner(w.tools), w.n.publish, w.n.store, w.n.clock),
            name="watchers-again",
        )
        status = await ref.ask(GetWatcher(watcher_id=running, session_id="s", history=100))
        assert (status["status"], status["check_count"], status["notification_count"]) == (
            "running",
            3,
            1,
        )
        assert [e["check"] for e in status["recent_history"]] == [1, 2, 3]
        assert status["next_check_at"] == "2026-11-21T12:02:10Z"  # back on its grid: 130
        other = await ref.ask(GetWatcher(watcher_id=paused, session_id="s"))
        assert (other["status"], other["check_count"]) == ("paused", 1)
        await trio.sleep(6)
        assert [round(t - t0) for t in w.probe.calls] == [0, 0, 10, 20, 130]
        status = await ref.ask(GetWatcher(watcher_id=running, session_id="s"))
        assert status["check_count"] == 4
        assert len(w.notes()) == 1  # no new baseline after the restart: nothing changed
        assert await ref.ask(ListWatchers(session_id="s")) != []


@pytest.mark.guard(DAY)
async def test_a_watcher_whose_session_was_deleted_across_a_crash_is_not_restored(autojump_clock):
    """Found by the crash harness (issue 23, scenario ``delete``): a node that dies after a
    session's row is deleted and before its watchers' rows are leaves them; the next start
    restored them and ran them for a session that no longer exists."""
    async with watching() as w:
        wid = await w.start(interval=10)
        await w.ref.stop()
        await w.n.store.delete_session("s")  # what the crash kept of the delete
        assert await w.n.store.kv_list(NAMESPACE) != []
        ref = await w.n.sup.spawn(
            lambda: WatcherActor(watch_runner(w.tools), w.n.publish, w.n.store, w.n.clock),
            name="watchers-again",
        )
        calls = len(w.probe.calls)
        await trio.sleep(60)
        assert len(w.probe.calls) == calls  # it does not run
        assert await w.n.store.kv_list(NAMESPACE) == []
        assert ref._cell.actor.watchers == {}
        del wid


class Share:
    """One node's view of a cluster for the watcher actor (``WatcherShare``): it is ``me``,
    the live set is what the test sets, and it owns every watcher (the other node is dead)."""

    interval = 1.0

    def __init__(self, me: str) -> None:
        self.ref = SimpleNamespace(id=me)
        self.live_ids: tuple[str, ...] = (me,)

    def owns(self, key: str) -> bool:
        return True


@pytest.mark.guard(DAY)
async def test_a_dead_nodes_watcher_whose_session_goes_while_it_is_adopted_is_dropped(
    autojump_clock,
):
    """Found by the crash harness with a survivor (issue 23, scenario ``delete``): the
    session of a watcher held by a node that died was deleted while the survivor adopted the
    watcher. The survivor had read the row (the session was there), so its adoption wrote
    the row back and checked the watcher for a session that no longer existed."""
    async with watching(share=Share("b")) as w:
        await w.start(interval=10)  # node b made the watcher and died holding it
        await w.ref.stop()
        assert any(v.get("holder") == "b" for _, v in await w.n.store.kv_list(NAMESPACE))
        calls = len(w.probe.calls)

        async def deleted_after_answering(real, session_id):
            found = await real(session_id)
            with contextlib.suppress(NotFound):  # the DELETE commits right after this look
                await w.n.store.delete_session(session_id)
            return found

        store = StoreWith(w.n.store, get_session=deleted_after_answering)
        ref_a = await w.n.sup.spawn(
            lambda: WatcherActor(
                watch_runner(w.tools), w.n.publish, store, w.n.clock, share=Share("a")
            ),  # fmt: skip
            name="watchers-a",
        )
        await trio.sleep(60)
        assert len(w.probe.calls) == calls  # not checked for nobody
        assert await w.n.store.kv_list(NAMESPACE) == []
        assert ref_a._cell.actor.watchers == {}


@pytest.mark.guard(DAY)
async def test_a_held_watcher_whose_session_is_found_gone_stops_and_stays_deleted(
    autojump_clock,
):
    """A node holding a watcher whose session's delete was cut short (the row gone, the
    watcher's stop never ran) deletes it at its next read of every row, and must stop it
    too: it kept checking, and its next flush wrote the deleted rows back."""
    share = Share("a")
    async with watching(share=share) as w:
        await w.start(interval=10)
        await trio.sleep(15)
        await w.n.store.delete_session("s")  # what the crash kept of the delete
        share.live_ids = ("a", "c")  # a node joins: the next look reads every row
        await trio.sleep(2)
        calls = len(w.probe.calls)
        await trio.sleep(60)
        assert len(w.probe.calls) == calls
        assert await w.n.store.kv_list(NAMESPACE) == []
        assert w.actor.watchers == {}


@pytest.mark.guard(DAY)
async def test_a_session_drop_whose_delete_is_refused_stops_them_when_asked_again(autojump_clock):
    """Found by the crash harness's ``--fault fail`` at every point (scenario ``delete``): the
    commit deleting a deleted session's watchers was refused; the session delete asks again
    (``END_TRIES``), but the watchers had been forgotten before the delete, so the second ask
    found none and their rows stayed for a session that no longer exists."""
    async with watching() as w:
        await w.start(interval=10)
        await w.start(interval=10)
        refused: list[int] = []

        async def refuse_once(real, items):
            if not refused:
                refused.append(len(items))
                raise StoreError("sqlite: transaction failed: refused by the test")
            return await real(items)

        w.actor.store = StoreWith(w.n.store, kv_delete_items=refuse_once)
        with pytest.raises(StoreError):
            await w.ref.ask(DropSessionWatchers(session_id="s"))
        assert len(w.actor.watchers) == 2  # still held, and running: nothing was deleted
        assert await w.ref.ask(DropSessionWatchers(session_id="s")) == 2
        assert await w.n.store.kv_list(NAMESPACE) == []
        calls = len(w.probe.calls)
        await trio.sleep(60)
        assert len(w.probe.calls) == calls
        assert await w.n.store.kv_list(NAMESPACE) == []


@pytest.mark.guard(DAY)
async def test_check_results_are_flushed_together_at_most_every_persist_interval(
    autojump_clock,
):
    async with watching(max_watchers_per_session=50, persist_interval=1.0) as w:
        puts: list[int] = []
        real_put = w.n.store.kv_put_items

        async def counting_put(items):
            puts.append(len(items))
            await real_put(items)

        w.n.store.kv_put_items = counting_put
        for _ in range(20):
            await w.start(interval=5, notify_when="on_error")
        assert puts == [1] * 20  # a start is written through at once
        puts.clear()
        await trio.sleep(0.9)
        assert puts == []  # the first checks wait for the window
        await trio.sleep(0.2)
        assert puts == [40]  # 20 states + 20 history chunks, in one commit
        await trio.sleep(10)
        assert puts == [40, 40, 40]  # one flush per round of checks
        stored = dict(await w.n.store.kv_list(NAMESPACE))
        some = next(k for k in stored if "/" not in k)
        assert stored[some]["check_count"] == 3
        assert [e[0] for e in stored[f"{some}/h00"]["entries"]] == [1, 2, 3]


# -- the wheel ---------------------------------------------------------------------------------


def _tasks_under(nursery) -> int:
    total = 0
    for task in nursery.child_tasks:
        total += 1
        for child in task.child_nurseries:
            total += _tasks_under(child)
    return total


@pytest.mark.guard(DAY)
async def test_a_thousand_watchers_sleep_on_one_timer_wheel(autojump_clock):
    probe = Probe()
    tools = probe.registry()
    sent: list[Any] = []

    async def publish(session_id, message):
        sent.append(message)

    async with node(tools=tools) as n:
        ref = await n.sup.spawn(
            lambda: WatcherActor(
                tools.call, publish, n.store, n.clock, max_watchers_per_session=1000
            ),
            name="watchers",
        )
        actor = ref._cell.actor
        for i in range(1000):
            await ref.ask(
                StartWatcher(
                    session_id="s",
                    owner="ada",
                    tool="probe.read",
                    params={"key": str(i)},
                    interval=60,
                    notify_when="on_error",
                )
            )
        await trio.sleep(30)  # every first check is done; the next ones are 30 s away
        assert len(probe.calls) == 1000
        assert _tasks_under(actor.nursery) <= 2  # the wheel and the persister, not 1,000
        assert len(actor.wheel) == 1000
        await trio.sleep(31)
        assert len(probe.calls) == 2000
        assert _tasks_under(actor.nursery) <= 2
        assert actor.stats["escalations"] == 0
        history = await ref.ask(WatcherHistory(watcher_id=next(iter(actor.watchers))))
        assert history["count"] == 2
        await ref.ask(PauseWatcher(watcher_id=next(iter(actor.watchers))))
        assert len(actor.wheel) == 999


@pytest.mark.guard(DAY)
async def test_an_output_channel_takes_escalations_instead_of_the_session(autojump_clock):
    sent = []

    async def notify(session_id, owner, channel, text, **fields):
        sent.append((session_id, owner, channel, text, fields["source"]))
        return {"channel": channel, "delivered": True}

    async with watching(notify=notify) as w:
        wid = await w.start(
            interval=60, notify_when="on_change", notify_config={"output_channel": "ops"}
        )
        await trio.sleep(1)
        ((sid, owner, channel, text, source),) = sent
        assert (sid, owner, channel, source) == ("s", "ada", "ops", "watcher")
        assert text.startswith(head(wid))
        assert w.notes() == []  # the session got no notification turn
        assert [u["what"] for u in w.updates()][-1] == "escalated"  # but clients still see it


@pytest.mark.guard(DAY)
async def test_on_change_ignores_timings_and_response_dates(autojump_clock):
    async with watching() as w:
        w.probe.script.extend(
            [
                {"status_code": 200, "body": {"v": 1}, "elapsed_ms": 2, "headers": {"date": "a"}},
                {"status_code": 200, "body": {"v": 1}, "elapsed_ms": 7, "headers": {"date": "b"}},
                {"status_code": 200, "body": {"v": 2}, "elapsed_ms": 3, "headers": {"date": "c"}},
            ]
        )
        await w.start(interval=60, notify_when="on_change")
        await trio.sleep(150)
        escalations = [u for u in w.updates() if u["what"] == "escalated"]
        assert [u["check"] for u in escalations] == [1, 3]  # the baseline, then the real change
