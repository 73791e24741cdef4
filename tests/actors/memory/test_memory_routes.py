"""The ``/memory`` routes a person or a console reads through the gateway's front door: the
extraction state of their sessions (due exactly when the sweep would take them), ranked search,
facts by category; per user, admins across users, bad input named. Both backends.

The node's wall clock is one the test sets (``now``), so "31 minutes later" needs no waiting
and every timestamp the store writes is known."""

from __future__ import annotations

import httpx

from tests.actors.memory._support import ADA, BOB, MINUTE, T0, auth, iso, model_for, node_with
from tests.support.fake_openai import OpenAIStandIn, text_stream
from tests.support.sessions import Recorder
from turnstile.actors.memory.extraction import Extractor
from turnstile.actors.sessions.agents import ScriptedAgent


def states(answer: httpx.Response) -> list[tuple]:
    assert answer.status_code == 200, answer.text
    return [(s["id"], s["state"], s["due"]) for s in answer.json()["sessions"]]


async def test_extraction_state_says_which_sessions_the_sweep_takes(store_url):
    standin = OpenAIStandIn()
    standin.script(text_stream("[]"))
    async with node_with(store_url) as (node, http, clock, feature):
        memory = feature.memory
        fresh = (await http.get("/memory/extraction", headers=auth(ADA))).json()
        assert fresh["sessions"] == [
            {
                "id": name,
                "updated_at": iso(T0),
                "extracted_at": None,
                "state": "waiting",
                "due": False,
                "due_at": iso(T0 + 30 * MINUTE),
            }
            for name in ("s1", "s2")
        ]
        assert fresh["next_after"] is None
        assert fresh["extraction"] == {
            "enabled": False,
            "stale_after_minutes": 30,
            "interval_seconds": 300.0,
            "reason": "no model server (a model-less agent and no [openai] base_url)",
        }

        clock.at = T0 + 31 * MINUTE  # both idle long enough, neither extracted
        assert states(await http.get("/memory/extraction", headers=auth(ADA))) == [
            ("s1", "due", True),
            ("s2", "due", True),
        ]
        # s1 extracted as of its activity; s2 active again now
        await memory.mark_extracted("ada/s1", at=T0)
        seen = Recorder()
        await node.directory.attach("ada", "s2", seen)
        await node.directory.submit("ada", "s2", "I drink dark roast")
        await seen.until(b'"stream_end"')
        listed = (await http.get("/memory/extraction", headers=auth(ADA))).json()["sessions"]
        assert [(s["id"], s["state"], s["extracted_at"], s["due_at"]) for s in listed] == [
            ("s1", "extracted", iso(T0), None),
            ("s2", "waiting", None, iso(T0 + 61 * MINUTE)),
        ]
        assert states(await http.get("/memory/extraction?due=true", headers=auth(ADA))) == []
        assert len(states(await http.get("/memory/extraction?due=false", headers=auth(ADA)))) == 2
        # bob sees his own session only
        assert states(await http.get("/memory/extraction", headers=auth(BOB))) == [
            ("s1", "due", True)
        ]

        clock.at = T0 + 62 * MINUTE
        due = states(await http.get("/memory/extraction?due=true", headers=auth(ADA)))
        assert due == [("s2", "due", True)]
        # what the route calls due is what the sweep takes: ada's s2 and bob's s1
        extractor = Extractor(
            memory,
            node.store,
            model_for(standin),
            stale_after=memory.stale_after,
            interval=3600,
            history_entries=50,
        )
        assert await extractor.sweep() == 2
        assert len(standin.requests) == 1  # bob's s1 had no user message: no model call
        after = (await http.get("/memory/extraction", headers=auth(ADA))).json()["sessions"]
        assert [(s["id"], s["state"]) for s in after] == [("s1", "extracted"), ("s2", "extracted")]
        assert after[1]["extracted_at"] == iso(T0 + 31 * MINUTE)  # as of the activity read
        assert states(await http.get("/memory/extraction?due=true", headers=auth(BOB))) == []


async def test_extraction_state_pages_and_admins_see_every_user(store_url):
    async with node_with(store_url, admins=["ada"], model=ScriptedAgent()) as (_, http, _c, _f):
        first = (await http.get("/memory/extraction?limit=1", headers=auth(ADA))).json()
        assert [s["id"] for s in first["sessions"]] == ["s1"] and first["next_after"] == "s1"
        assert first["extraction"]["enabled"] is True and "reason" not in first["extraction"]
        second = (await http.get("/memory/extraction?limit=1&after=s1", headers=auth(ADA))).json()
        assert [s["id"] for s in second["sessions"]] == ["s2"] and second["next_after"] == "s2"
        third = (await http.get("/memory/extraction?limit=1&after=s2", headers=auth(ADA))).json()
        assert third["sessions"] == [] and third["next_after"] is None

        refused = await http.get("/memory/extraction?all_users=true", headers=auth(BOB))
        assert refused.status_code == 403
        assert refused.json()["error"]["field"] == "all_users"
        page = await http.get("/memory/extraction?all_users=true&limit=2", headers=auth(ADA))
        body = page.json()
        assert [(s["owner"], s["id"]) for s in body["sessions"]] == [("ada", "s1"), ("ada", "s2")]
        assert body["next_after"] == "ada/s2"
        rest = await http.get(
            "/memory/extraction", params={"all_users": "true", "after": "ada/s2"}, headers=auth(ADA)
        )
        assert [(s["owner"], s["id"]) for s in rest.json()["sessions"]] == [("bob", "s1")]


async def test_extraction_state_refuses_bad_input_naming_the_field(store_url):
    async with node_with(store_url, admins=["ada"]) as (_, http, _c, _f):
        assert (await http.get("/memory/extraction")).status_code == 401
        cases = [
            ({"limit": "0"}, "limit"),
            ({"limit": "1001"}, "limit"),
            ({"after": "a/b"}, "after"),
            ({"after": "x" * 129}, "after"),
            ({"after": "no-owner", "all_users": "true"}, "after"),
            ({"due": "maybe"}, "due"),
            ({"owner": "bob"}, "owner"),
        ]
        for params, field in cases:
            answer = await http.get("/memory/extraction", params=params, headers=auth(ADA))
            assert answer.status_code == 400, params
            assert answer.json()["error"]["field"] == field, params


async def test_search_ranks_the_callers_facts_only(store_url):
    async with node_with(store_url) as (_, http, _c, _f):
        facts = [
            (ADA, "drinks", "coffee", "dark roast, no sugar"),
            (ADA, "drinks", "tea", "green, no milk"),
            (ADA, "home", "city", "Porto"),
            (BOB, "drinks", "coffee", "dark roast with milk"),
        ]
        for token, category, key, value in facts:
            body = {"category": category, "key": key, "value": value}
            assert (await http.put("/memory/facts", json=body, headers=auth(token))).is_success
        found = await http.get("/memory/search", params={"query": "roast"}, headers=auth(ADA))
        assert found.status_code == 200
        assert [(f["key"], f["value"]) for f in found.json()["facts"]] == [
            ("coffee", "dark roast, no sugar")
        ]
        assert "owner" not in found.json()["facts"][0]
        # words, not a substring: "no" matches two facts, ranked; limit keeps the best
        two = await http.get("/memory/search?query=no%20sugar", headers=auth(ADA))
        assert [f["key"] for f in two.json()["facts"]][0] == "coffee"
        one = await http.get("/memory/search?query=no&limit=1", headers=auth(ADA))
        assert len(one.json()["facts"]) == 1
        for params, field in (({}, "query"), ({"query": "x", "limit": "51"}, "limit")):
            bad = await http.get("/memory/search", params=params, headers=auth(ADA))
            assert bad.status_code == 400 and bad.json()["error"]["field"] == field


async def test_facts_list_by_category(store_url):
    async with node_with(store_url, admins=["ada"]) as (_, http, _c, _f):
        facts = [
            (ADA, "drinks", "coffee", "dark roast"),
            (ADA, "drinks", "tea", "green"),
            (ADA, "drinks at work", "water", "still"),
            (ADA, "home", "city", "Porto"),
            (BOB, "drinks", "coffee", "black"),
        ]
        for token, category, key, value in facts:
            body = {"category": category, "key": key, "value": value}
            assert (await http.put("/memory/facts", json=body, headers=auth(token))).is_success

        async def page(token=ADA, **params):
            answer = await http.get("/memory/facts", params=params, headers=auth(token))
            assert answer.status_code == 200, answer.text
            body = answer.json()
            return [f["key"] for f in body["facts"]], body["total"]

        assert await page(category="drinks", sort_by="key", sort_order="asc") == (
            ["coffee", "tea"],
            2,
        )
        assert await page(category=" drinks ", sort_by="key", limit="1", offset="1") == (
            ["coffee"],
            2,
        )
        assert await page(category="drinks", search="GREEN") == (["tea"], 1)
        assert await page(category="nothing") == ([], 0)
        assert await page(BOB, category="drinks") == (["coffee"], 1)
        everyone = await http.get(
            "/memory/facts",
            params={"category": "drinks", "all_users": "true", "sort_by": "value"},
            headers=auth(ADA),
        )
        assert [(f["owner"], f["value"]) for f in everyone.json()["facts"]] == [
            ("ada", "green"),
            ("ada", "dark roast"),
            ("bob", "black"),
        ]
        bad = await http.get("/memory/facts", params={"category": "c" * 65}, headers=auth(ADA))
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "category"
