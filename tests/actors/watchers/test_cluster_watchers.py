"""Watchers across nodes (PostgreSQL, two nodes in-process, real time with a 3 s lease): each
watcher is checked by one node, chosen by its id, whichever node it was created through; its
controls work through either node; when a node leaves (a clean stop, or a lease that lapses)
the other one checks its watchers with their state, and escalates nothing again.

The checked tool counts its calls per node (``probe.count``). The nodes progress on their own
clocks, so the tests look every 50 ms, with a deadline (``eventually``'s: a generous hang
guard, not a promise; how soon a watcher moves is ``docs/cluster.md``'s figure, not a bound here).
"""

from __future__ import annotations

import re
from collections import Counter
from contextlib import AsyncExitStack

import httpx
import msgspec
import pytest
import trio

from tests.support.polling import eventually
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import open_node
from turnstile.actors.watchers.persistence import NAMESPACE
from turnstile.actors.watchers.tools import get_watcher, list_watchers, resume_watcher
from turnstile.runtime.errors import LeaseLost, NotFound
from turnstile.runtime.membership import owner_of

TOKEN = "cluster-watch-token-0123456789"
BOB = "cluster-watch-token-bob-0123456"
TOKENS = {TOKEN: "ada", BOB: "bob"}
SESSIONS = ("ada/s0", "ada/s1", "ada/s2")


def config(url: str, node_id: str) -> Config:
    # 3 s, not 1: at load 9-15 on 2 cores a live node's beat came more than 1 s late and the
    # other declared it dead (LeaseLost in the join test); 3 s costs the lapse test 2 s
    return Config(store=url, node=NodeConfig(id=node_id, lease_seconds=3, placement="leases"))


class CountArgs(msgspec.Struct, forbid_unknown_fields=True):
    key: str


def counting(node, calls: Counter) -> None:
    """Register ``probe.count`` on ``node``: counts its calls by ``key``, answers the same."""

    async def count(call, args: CountArgs):
        calls[args.key] += 1
        return {"steady": True}

    node.tools.register("probe.count", CountArgs, count, "Count calls.")


def session_of(key: str) -> str:
    """The session ``start_watchers`` (or the HTTP part, key ``kh``) put the watcher in."""
    return "ada/s0" if key == "kh" else SESSIONS[int(key[1:]) % len(SESSIONS)]


def actor(node):
    return node.features["watchers"].watchers._cell.actor


def checks_of(node, wid: str) -> int:
    """The checks ``node`` has applied to the watcher it holds (-1: it holds none)."""
    watcher = actor(node).watchers.get(wid)
    return -1 if watcher is None else watcher.check_count


async def escalations(node) -> Counter:
    """Escalations each watcher's session was told of, on any node: the notification turns
    and the notifications folded into running turns, as the sessions' logs have them.

    A notification folded into a turn that ended before the agent took it is queued again as
    a turn of its own (its input says ``was_injected``; ``actors/sessions/runner.py``): its
    ``user_message`` and that turn's ``stream_start`` are one escalation told, not two. (On a
    loaded box a baseline came in just as the turn it was folded into ended, and was counted
    twice.) Each escalation's text is its own (its check number, its count so far), so they
    are matched by text."""
    told: Counter = Counter()
    for session in SESSIONS:
        again = {
            item.id
            for item in await node.store.list_inputs(session)
            if item.payload.get("was_injected")
        }
        counts: dict[str, Counter] = {}  # an escalation's text: how it reached the session
        for event in await node.store.read_events(session, limit=10_000):
            payload = event.payload
            if event.type not in ("stream_start", "user_message") or (
                payload.get("source") != "notification"
            ):
                continue
            how = event.type
            if how == "stream_start" and payload.get("input_id") in again:
                how = "again"
            for text in re.split(r"(?=\[WATCHER UPDATE\] )", payload.get("content", "")):
                if text.strip():
                    counts.setdefault(text.strip(), Counter())[how] += 1
        for text, how in counts.items():
            (wid,) = re.findall(r"watcher_id=([0-9a-f]+),", text)
            folded = how["user_message"]
            told[wid] += how["stream_start"] + folded + how["again"] - min(folded, how["again"])
    return told


async def start_watchers(a, b) -> tuple[dict[str, str], dict[str, str]]:
    """Watchers created through both nodes until each node created one the other owns;
    answers ``{watcher id: key}`` and ``{watcher id: owner}``."""
    keys: dict[str, str] = {}
    owners: dict[str, str] = {}
    through: dict[str, str] = {}
    i = 0
    while i < 8 or not {(through[w], owners[w]) for w in keys} >= {("a", "b"), ("b", "a")}:
        node, name = (a, "a") if i % 2 == 0 else (b, "b")
        result = await node.tools.call(
            SESSIONS[i % len(SESSIONS)],
            "ada",
            "watch_start",
            {"tool": "probe.count", "params": {"key": f"k{i}"}, "interval": 5},
        )
        assert result.ok, result.error
        wid = result.data["watcher_id"]
        keys[wid], owners[wid], through[wid] = f"k{i}", owner_of(wid, ("a", "b")), name
        i += 1
        assert i < 40
    return keys, owners


async def two_nodes(stack: AsyncExitStack, url: str):
    a = await stack.enter_async_context(open_node(config(url, "a"), tokens=TOKENS, serve=False))
    b_stack = await stack.enter_async_context(AsyncExitStack())
    b = await b_stack.enter_async_context(open_node(config(url, "b"), tokens=TOKENS, serve=False))
    return a, b, b_stack


async def see_each_other(a, b) -> None:
    for node in (a, b, a):
        await node.membership.sweep()
    assert a.membership.live_ids == b.membership.live_ids == ("a", "b")


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_each_watcher_is_checked_by_one_node_controlled_through_any_and_moves_with_its_state(
    store_url,
):
    calls = {"a": Counter(), "b": Counter()}
    async with AsyncExitStack() as stack:
        a, b, b_stack = await two_nodes(stack, store_url)
        counting(a, calls["a"])
        counting(b, calls["b"])
        await see_each_other(a, b)
        for session in SESSIONS:
            await a.directory.create_session("ada", session_id=session.partition("/")[2])
        keys, owners = await start_watchers(a, b)

        async def all_checked() -> bool:
            return all(calls["a"][k] + calls["b"][k] >= 1 for k in keys.values())

        await eventually(all_checked)
        for wid, key in keys.items():  # by its owner only, whichever node created it
            other = "b" if owners[wid] == "a" else "a"
            assert calls[owners[wid]][key] >= 1 and calls[other][key] == 0, (wid, owners[wid])
        for node in (a, b):
            assert set(actor(node).watchers) == {
                w for w, o in owners.items() if o == node.membership.record.id
            }

        # Listing and reading through either node: every watcher, and never another user's.
        for node in (a, b):
            ref = node.features["watchers"].watchers
            listed = await list_watchers(ref, owner="ada")
            assert {w["watcher_id"] for w in listed["watchers"]} == set(keys)
            assert (listed["total"], listed["running"]) == (len(keys), len(keys))
            assert (await list_watchers(ref, owner="bob"))["watchers"] == []
            one = next(w for w in keys if owners[w] != node.membership.record.id)
            assert (await get_watcher(ref, one, "ada"))["watcher_id"] == one
            with pytest.raises(NotFound, match=f"no watcher with id '{one}'"):
                await get_watcher(ref, one, "bob")
            result = await node.tools.call("ada/s0", "ada", "watch_list", {})
            assert {w["watcher_id"] for w in result.data["watchers"]} == {
                w for w in keys if keys[w] in {f"k{i}" for i in range(0, 40, 3)}
            }

        # Over HTTP: created through b, read and listed through a; never by another user.
        def http(node, token: str = TOKEN) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                transport=httpx.ASGITransport(app=node.app),
                base_url="http://node",
                headers={"Authorization": f"Bearer {token}"},
            )

        async with http(a) as on_a, http(b) as on_b, http(a, BOB) as bob_on_a:
            made = await on_b.post(
                "/sessions/s0/watchers",
                json={"tool": "probe.count", "params": {"key": "kh"}, "interval": 5},
            )
            assert made.status_code == 201, made.text
            wid = made.json()["watcher_id"]
            keys[wid], owners[wid] = "kh", owner_of(wid, ("a", "b"))
            read = await on_a.get(f"/watchers/{wid}")
            assert read.status_code == 200 and read.json()["session_id"] == "s0"
            listed = (await on_a.get("/sessions/s0/watchers")).json()
            assert wid in {w["watcher_id"] for w in listed["watchers"]}
            assert (await on_b.get("/watchers")).json()["total"] == len(keys)
            assert (await bob_on_a.get(f"/watchers/{wid}")).status_code == 404
            assert (await bob_on_a.post(f"/watchers/{wid}/pause")).status_code == 404
            assert (await bob_on_a.get("/watchers")).json()["watchers"] == []
        await eventually(all_checked)
        assert sum(calls[n]["kh"] >= 1 for n in ("a", "b")) == 1

        # Pause and stop through the node that does not check them.
        created = list(keys)
        a_owned = [w for w in keys if owners[w] == "a"]
        b_owned = [w for w in keys if owners[w] == "b"]
        paused, stopped = a_owned[0], (a_owned[1:] or [None])[0]
        session = session_of(keys[paused])
        answer = await b.tools.call(session, "ada", "watch_pause", {"watcher_id": paused})
        assert answer.ok and answer.data["status"] == "paused", answer
        held = actor(a).watchers[paused]
        assert held.state == "paused" and held.handle is None  # a checks it no more
        assert (await a.store.kv_get(NAMESPACE, paused))["state"] == "paused"
        checks_when_paused = calls["a"][keys[paused]]
        if stopped is not None:
            # its announcement is lost: a finds the request at its next look all the same
            session = session_of(keys[stopped])
            notify = b.store.notify

            async def lost(channel: str, payload: str) -> None:
                if channel != "turnstile_watchers":
                    await notify(channel, payload)

            b.store.notify = lost
            answer = await b.tools.call(session, "ada", "watch_stop", {"watcher_id": stopped})
            b.store.notify = notify
            assert answer.ok and answer.data["status"] == "stopped", answer
            assert stopped not in actor(a).watchers
            assert await a.store.kv_get(NAMESPACE, stopped) is None
            del keys[stopped]
        with pytest.raises(NotFound, match=f"no watcher with id '{paused}'"):
            await resume_watcher(b.features["watchers"].watchers, paused, "bob")

        # b leaves (a clean stop): a checks b's watchers, with their counts and history.

        async def baselines() -> bool:
            return await escalations(a) == Counter({wid: 1 for wid in created})

        await eventually(baselines)  # each its baseline, once
        sent_before = await escalations(a)
        await b_stack.aclose()
        b_calls = Counter(calls["b"])
        await a.membership.sweep()
        assert a.membership.live_ids == ("a",)

        async def a_checks_them() -> bool:
            return all(checks_of(a, w) > b_calls[keys[w]] for w in b_owned)

        await eventually(a_checks_them)
        assert set(actor(a).watchers) == set(keys)
        assert calls["b"] == b_calls
        for wid in b_owned:
            status = await get_watcher(a.features["watchers"].watchers, wid, "ada")
            assert status["check_count"] == b_calls[keys[wid]] + calls["a"][keys[wid]]
            assert status["notification_count"] == 1  # the baseline b escalated, not again
            checks = [e["check"] for e in status["recent_history"]]
            assert checks == list(range(1, status["check_count"] + 1))[-len(checks) :]
        assert await escalations(a) == sent_before  # nothing escalated again after the move
        assert calls["a"][keys[paused]] == checks_when_paused  # still paused
        resumed = await a.tools.call(
            session_of(keys[paused]),
            "ada",
            "watch_resume",
            {"watcher_id": paused},
        )
        assert resumed.data["status"] == "running"


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_node_whose_lease_lapses_loses_its_watchers_to_the_survivor(store_url):
    calls = {"a": Counter(), "b": Counter()}
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            open_node(config(store_url, "a"), tokens=TOKENS, serve=False)
        )
        counting(a, calls["a"])
        renew = trio.Event()
        b_ready = trio.Event()
        b_done = trio.Event()
        b_out: list = []

        async def run_b() -> None:
            try:
                async with open_node(config(store_url, "b"), tokens=TOKENS, serve=False) as b:
                    counting(b, calls["b"])
                    b_out.append(b)
                    b_ready.set()
                    await trio.sleep_forever()
            except LeaseLost as exc:
                b_out.append(exc)
            b_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_b)
            await b_ready.wait()
            b = b_out[0]
            await see_each_other(a, b)
            for session in SESSIONS:
                await a.directory.create_session("ada", session_id=session.partition("/")[2])
            keys, owners = await start_watchers(a, b)
            b_owned = [w for w in keys if owners[w] == "b"]

            async def checked() -> bool:
                return all(calls["a"][k] + calls["b"][k] >= 1 for k in keys.values())

            await eventually(checked)

            async def baselines() -> bool:
                return await escalations(a) == Counter({wid: 1 for wid in keys})

            await eventually(baselines)  # each its baseline, once
            sent = await escalations(a)

            async def saved() -> bool:  # b's state as of its last save is what moves
                for wid in b_owned:
                    status = await get_watcher(a.features["watchers"].watchers, wid, "ada")
                    if status["check_count"] < 1 or status["notification_count"] < 1:
                        return False
                return True

            await eventually(saved)

            # b stops renewing its lease (a pause, a lost database): a declares it dead and
            # takes its watchers; b learns it at its next heartbeat and stops.
            beat_store = b.membership.beat_store
            real = beat_store.heartbeat_node

            async def stalled(*args, **kwargs):
                await renew.wait()
                return await real(*args, **kwargs)

            beat_store.heartbeat_node = stalled

            async def b_is_dead() -> bool:
                await a.membership.sweep()
                return a.membership.live_ids == ("a",)

            await eventually(b_is_dead)

            async def a_holds_them() -> bool:
                return set(b_owned) <= set(actor(a).watchers)

            await eventually(a_holds_them)
            adopted = {w: checks_of(a, w) for w in b_owned}
            renew.set()  # b's heartbeat now finds it was declared dead: it stops serving
            with trio.fail_after(60):  # a hang guard: its next heartbeat, 1/3 s on a quiet box
                await b_done.wait()
            assert isinstance(b_out[1], LeaseLost)
            b_calls = Counter(calls["b"])
            a_calls = Counter(calls["a"])

            async def a_checks_them() -> bool:
                return all(
                    calls["a"][keys[w]] > a_calls[keys[w]] and checks_of(a, w) > adopted[w]
                    for w in b_owned
                )

            await eventually(a_checks_them)
            assert calls["b"] == b_calls
            for wid in b_owned:
                status = await get_watcher(a.features["watchers"].watchers, wid, "ada")
                assert status["check_count"] > adopted[wid] >= 1  # counted on from b's
                assert status["notification_count"] == 1  # kept its state: not escalated again
            assert await escalations(a) == sent


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_node_that_joins_is_handed_its_share_with_the_state(store_url):
    calls = {"a": Counter(), "b": Counter()}
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            open_node(config(store_url, "a"), tokens=TOKENS, serve=False)
        )
        counting(a, calls["a"])
        for session in SESSIONS:
            await a.directory.create_session("ada", session_id=session.partition("/")[2])
        keys: dict[str, str] = {}
        while len(keys) < 6 or len({owner_of(w, ("a", "b")) for w in keys}) < 2:
            i = len(keys)
            result = await a.tools.call(
                SESSIONS[i % len(SESSIONS)],
                "ada",
                "watch_start",
                {"tool": "probe.count", "params": {"key": f"k{i}"}, "interval": 5},
            )
            keys[result.data["watcher_id"]] = f"k{i}"
        moving = [w for w in keys if owner_of(w, ("a", "b")) == "b"]

        async def checked() -> bool:
            return all(calls["a"][k] >= 1 for k in keys.values())

        async def baselines() -> bool:
            return await escalations(a) == Counter({wid: 1 for wid in keys})

        await eventually(checked)
        await eventually(baselines)

        # b joins: a gives b its share (a writes their state, b adopts it), b checks them.
        b = await stack.enter_async_context(
            open_node(config(store_url, "b"), tokens=TOKENS, serve=False)
        )
        counting(b, calls["b"])
        await see_each_other(a, b)

        async def handed_over() -> bool:
            return set(actor(b).watchers) == set(moving) and not set(moving) & set(
                actor(a).watchers
            )

        await eventually(handed_over)
        a_calls = Counter(calls["a"])

        async def b_checks_them() -> bool:
            return all(checks_of(b, w) > a_calls[keys[w]] for w in moving)

        await eventually(b_checks_them)
        assert all(calls["a"][keys[w]] == a_calls[keys[w]] for w in moving)
        assert await escalations(a) == Counter({wid: 1 for wid in keys})  # none again
        for wid in moving:
            status = await get_watcher(b.features["watchers"].watchers, wid, "ada")
            assert status["check_count"] == a_calls[keys[wid]] + calls["b"][keys[wid]]
            assert status["notification_count"] == 1

        # b drains: it gives its watchers back (a adopts them at once), and checks no more.
        await b.drain(0)
        await a.membership.sweep()

        async def given_back() -> bool:
            return set(actor(a).watchers) == set(keys) and not actor(b).watchers

        await eventually(given_back)
        b_calls = Counter(calls["b"])
        a_calls = Counter(calls["a"])

        async def a_checks_them() -> bool:
            return all(checks_of(a, w) > a_calls[keys[w]] + b_calls[keys[w]] for w in moving)

        await eventually(a_checks_them)
        assert calls["b"] == b_calls
        assert all(actor(a).watchers[w].notification_count == 1 for w in keys)
        assert await escalations(a) == Counter({wid: 1 for wid in keys})
