"""The memory change log on both backends: every write (a tool, a route, extraction) appends
its events in the same transaction and publishes them to the owner's topic once committed;
``GET /memory/changes`` replays a user's own log; a later event about the same fact or summary
replaces the earlier one (a forgotten value is gone from the log too); ``DELETE /memory``
leaves only its own event; a capped log says ``reset``; one user's writes are published in
``seq`` order even when they race."""

from __future__ import annotations

from datetime import timedelta

import trio

from tests.actors.memory._support import ADA, BOB, T0, auth, iso, model_for, node_with
from tests.support.fake_openai import OpenAIStandIn, text_stream
from tests.support.sessions import Recorder
from turnstile.actors.memory.extraction import Extractor


class Seen:
    """A topic subscriber that keeps what it was offered."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, bytes]] = []

    def offer_topic(self, topic: str, seq: int, frame: bytes) -> bool:
        self.frames.append((seq, frame))
        return True

    def topic_lagged(self, topic: str) -> None:
        raise AssertionError("never lags")


async def changes(http, token=ADA, **params) -> dict:
    answer = await http.get("/memory/changes", params=params, headers=auth(token))
    assert answer.status_code == 200, answer.text
    return answer.json()


def what(change: dict) -> object:
    """The gist of one change."""
    match change["type"]:
        case "fact_saved":
            return change["fact"]["key"], change["fact"]["value"], change["created"]
        case "fact_forgotten":
            return change["category"], change["key"], change["reason"]
        case "summary_changed":
            return change["summary"]
        case _:
            return change["deleted"]


def summary_of(log: dict) -> list[tuple]:
    """``(seq, type, what)`` of each change."""
    assert all(c["topic"] == "memory" for c in log["changes"])
    return [(c["seq"], c["type"], what(c)) for c in log["changes"]]


async def test_every_write_path_logs_and_publishes_to_the_owner(store_url):
    standin = OpenAIStandIn()
    facts = '[{"category": "home", "key": "city", "value": "Porto", "source": "user_explicit"}]'
    standin.script(text_stream(facts))
    async with node_with(store_url) as (node, http, clock, feature):
        seen, bobs = Seen(), Seen()
        node.context.topics.subscribe("ada", "memory", seen)
        node.context.topics.subscribe("bob", "memory", bobs)
        call = node.directory.call_tool
        # a tool
        args = {"category": "drinks", "key": "coffee", "value": "dark roast"}
        assert (await call("ada", "s1", "memory.save", args)).ok
        # a route: upsert (an update of the same key), the summary
        body = {"category": "drinks", "key": "coffee", "value": "dark roast, no sugar"}
        assert (await http.put("/memory/facts", json=body, headers=auth(ADA))).is_success
        body = {"category": "drinks", "key": "tea", "value": "green"}
        assert (await http.put("/memory/facts", json=body, headers=auth(ADA))).is_success
        summary = {"content": "Likes coffee."}
        assert (await http.put("/memory/summary", json=summary, headers=auth(ADA))).is_success
        # extraction: a fact and the summary rendered again
        recorder = Recorder()
        await node.directory.attach("ada", "s2", recorder)
        await node.directory.submit("ada", "s2", "I live in Porto")
        await recorder.until(b'"stream_end"')
        clock.at = T0 + timedelta(hours=1)
        extractor = Extractor(
            feature.memory,
            node.store,
            model_for(standin),
            stale_after=feature.memory.stale_after,
            interval=3600,
            history_entries=50,
        )
        assert await extractor.sweep() == 3  # ada's s1 and s2, bob's s1
        # a route: forget
        gone = await http.request(
            "DELETE", "/memory/facts", params={"key": "tea"}, headers=auth(ADA)
        )
        assert gone.json() == {"deleted": 1}

        log = await changes(http)
        rendered = "Drinks:\n- coffee: dark roast, no sugar\n- tea: green\nHome:\n- city: Porto"
        # the first save (seq 1) was replaced by the update, the hand-written summary (4) by
        # extraction's, and tea's save (3) by its forgetting
        assert summary_of(log) == [
            (2, "fact_saved", ("coffee", "dark roast, no sugar", False)),
            (5, "fact_saved", ("city", "Porto", True)),
            (6, "summary_changed", rendered),
            (7, "fact_forgotten", ("drinks", "tea", "forgotten")),
        ]
        assert log["last_seq"] == 7 and log["pruned_seq"] == 0 and log["reset"] is False
        city = log["changes"][1]
        assert city["fact"] == {
            "category": "home",
            "key": "city",
            "value": "Porto",
            "source": "user_explicit",
            "confidence": 90,
            "created_at": iso(T0 + timedelta(hours=1)),
            "updated_at": iso(T0 + timedelta(hours=1)),
            "last_verified_at": iso(T0 + timedelta(hours=1)),
            "expires_at": None,
            "source_context": None,
        }
        assert city["ts"] == iso(T0 + timedelta(hours=1))
        # a forgotten value is kept in the log only where a summary quotes it
        assert "green" not in str([c for c in log["changes"] if c["type"] != "summary_changed"])

        # live: every event, in order, as the log's frames; nothing of ada's reached bob
        assert [seq for seq, _ in seen.frames] == [1, 2, 3, 4, 5, 6, 7]
        live = {seq: frame for seq, frame in seen.frames}
        replayed = (await http.get("/memory/changes", headers=auth(ADA))).content
        for seq in (2, 5, 6, 7):
            assert live[seq] in replayed
        assert bobs.frames == []
        assert await changes(http, BOB) == {
            "changes": [],
            "last_seq": 0,
            "pruned_seq": 0,
            "reset": False,
        }
        # paging
        assert [c["seq"] for c in (await changes(http, after_seq=5, limit=1))["changes"]] == [6]


async def test_deleting_everything_leaves_one_event_without_content(store_url):
    async with node_with(store_url) as (node, http, _c, feature):
        seen = Seen()
        node.context.topics.subscribe("ada", "memory", seen)
        for key in ("coffee", "tea"):
            body = {"category": "drinks", "key": key, "value": "secret " + key}
            assert (await http.put("/memory/facts", json=body, headers=auth(ADA))).is_success
        summary = {"content": "secret summary"}
        assert (await http.put("/memory/summary", json=summary, headers=auth(ADA))).is_success
        body = {"category": "drinks", "key": "water", "value": "still"}
        assert (await http.put("/memory/facts", json=body, headers=auth(BOB))).is_success
        assert (await http.delete("/memory", headers=auth(ADA))).status_code == 200
        log = await changes(http)
        assert summary_of(log) == [
            (4, "memory_deleted", {"facts": 2, "summary": 1, "sessions": 0}),
        ]
        assert "secret" not in str(log)
        assert [seq for seq, _ in seen.frames] == [1, 2, 3, 4]
        # the log goes on from there; bob's is untouched
        body = {"category": "drinks", "key": "coffee", "value": "black"}
        assert (await http.put("/memory/facts", json=body, headers=auth(ADA))).is_success
        assert [c["seq"] for c in (await changes(http))["changes"]] == [4, 5]
        assert summary_of(await changes(http, BOB)) == [(1, "fact_saved", ("water", "still", True))]


async def test_forgetting_a_key_in_every_category_and_expiry(store_url):
    async with node_with(store_url) as (_n, http, clock, _f):
        for category in ("home", "work"):
            body = {"category": category, "key": "address", "value": f"{category} street"}
            assert (await http.put("/memory/facts", json=body, headers=auth(ADA))).is_success
        trip = {"category": "plans", "key": "trip", "value": "Lisbon", "expires_days": 1}
        assert (await http.put("/memory/facts", json=trip, headers=auth(ADA))).is_success
        gone = await http.request(
            "DELETE", "/memory/facts", params={"key": "address"}, headers=auth(ADA)
        )
        assert gone.json() == {"deleted": 2}
        clock.at = T0 + timedelta(days=2)
        body = {"category": "drinks", "key": "tea", "value": "green"}
        assert (await http.put("/memory/facts", json=body, headers=auth(ADA))).is_success
        assert summary_of(await changes(http)) == [
            (4, "fact_forgotten", ("home", "address", "forgotten")),
            (5, "fact_forgotten", ("work", "address", "forgotten")),
            (6, "fact_forgotten", ("plans", "trip", "expired")),
            (7, "fact_saved", ("tea", "green", True)),
        ]
        # an expired fact saved again is a new fact, and one event
        assert (await http.put("/memory/facts", json=trip, headers=auth(ADA))).is_success
        last = (await changes(http, after_seq=7))["changes"]
        assert [(c["type"], c["created"]) for c in last] == [("fact_saved", True)]
        # nothing deleted, nothing logged
        missing = await http.request(
            "DELETE", "/memory/facts", params={"key": "nothing"}, headers=auth(ADA)
        )
        assert missing.status_code == 404
        assert (await changes(http))["last_seq"] == 8


async def test_a_capped_log_tells_a_client_that_fell_too_far_behind_to_reload(store_url):
    async with node_with(store_url, changes_kept=10) as (_n, http, _c, _f):
        for n in range(12):
            body = {"category": "notes", "key": f"k{n:02}", "value": str(n)}
            assert (await http.put("/memory/facts", json=body, headers=auth(ADA))).is_success
        head = await changes(http, after_seq=12)
        assert (head["last_seq"], head["pruned_seq"], head["changes"]) == (12, 2, [])
        behind = await changes(http, after_seq=1)
        assert behind["reset"] is True and behind["changes"] == []
        ahead = await changes(http, after_seq=13)  # more than there is: another database
        assert ahead["reset"] is True
        kept = await changes(http, after_seq=2)
        assert kept["reset"] is False
        assert [c["seq"] for c in kept["changes"]] == list(range(3, 13))
        # saving an existing key replaces its event: the log does not grow
        body = {"category": "notes", "key": "k05", "value": "five"}
        assert (await http.put("/memory/facts", json=body, headers=auth(ADA))).is_success
        after = await changes(http, after_seq=2)
        assert after["pruned_seq"] == 2 and len(after["changes"]) == 10
        for params, field in (({"after_seq": "-1"}, "after_seq"), ({"limit": "0"}, "limit")):
            bad = await http.get("/memory/changes", params=params, headers=auth(ADA))
            assert bad.status_code == 400 and bad.json()["error"]["field"] == field
        assert (await http.get("/memory/changes")).status_code == 401


async def test_racing_writes_of_one_user_are_published_in_seq_order(store_url):
    async with node_with(store_url) as (node, http, _c, feature):
        seen = Seen()
        node.context.topics.subscribe("ada", "memory", seen)
        memory = feature.memory

        async def save(n: int) -> None:
            await memory.save("ada", category="race", key=f"k{n % 7}", value=str(n))

        async with trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(save, n)
        assert [seq for seq, _ in seen.frames] == list(range(1, 41))
        log = await changes(http)
        assert len(log["changes"]) == 7 and log["last_seq"] == 40
        facts, total = await memory.list_facts("ada", category="race")
        assert total == 7
        latest = {c["fact"]["key"]: c["fact"]["value"] for c in log["changes"]}
        assert latest == {f.key: f.value for f in facts}
