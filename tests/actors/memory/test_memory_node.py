"""The memory feature in a node: the ``memory.*`` tools through the session directory (facts
belong to the session's owner, shared by all their sessions), and the ``/memory`` routes
through the gateway's front door (auth, bad input, per-user data, admins); on both backends."""

from __future__ import annotations

from contextlib import asynccontextmanager

import httpx
import pytest
import trio
import trio.testing

from tests.support.polling import eventually
from turnstile.actors.config import Config, MemoryConfig
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.tools.policy import Policy

ADA, BOB = "ada-token-0123456789", "bob-token-0123456789"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def node_with(store_url, policies=None, **memory):
    config = Config(store=store_url, memory=MemoryConfig(**memory), policies=policies or {})
    agent = ScriptedAgent(token_delay=0)
    async with open_node(config, tokens={ADA: "ada", BOB: "bob"}, agent=agent, serve=False) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            for token, name in ((ADA, "s1"), (ADA, "s2"), (BOB, "s1")):
                created = await http.post("/sessions", json={"id": name}, headers=auth(token))
                assert created.status_code == 201
            yield node, http


async def test_the_tools_keep_facts_per_user_across_their_sessions(store_url):
    async with node_with(store_url) as (node, http):
        call = node.directory.call_tool
        saved = await call(
            "ada",
            "s1",
            "memory.save",
            {"category": "preferences", "key": "coffee", "value": "dark roast, no sugar"},
        )
        assert saved.ok, saved.error
        assert saved.data["saved"]["confidence"] == 70 and "owner" not in saved.data["saved"]
        # another session of the same user finds it; bob, in his own s1, does not
        found = await call("ada", "s2", "memory.search", {"query": "roast"})
        assert [f["key"] for f in found.data["facts"]] == ["coffee"]
        assert (await call("bob", "s1", "memory.search", {"query": "roast"})).data == {"facts": []}
        listed = await call("ada", "s2", "memory.list", {"sort_by": "key"})
        assert listed.data["total"] == 1
        assert (await call("bob", "s1", "memory.list", {})).data == {"facts": [], "total": 0}
        # bob cannot reach ada's session to act as her
        with pytest.raises(LookupError):
            await call("bob", "s2", "memory.search", {"query": "roast"})


async def test_tool_arguments_are_typed_and_bounded(store_url):
    async with node_with(store_url) as (node, _):
        call = node.directory.call_tool
        cases = [
            ({"category": "c", "key": "k", "value": "v", "confidence": 101}, "$.confidence"),
            ({"category": "c", "key": "k", "value": "v", "source": "rumour"}, "$.source"),
            ({"category": "c" * 65, "key": "k", "value": "v"}, "$.category"),
            ({"category": "c", "key": "k\n", "value": "v"}, "$.key"),
            ({"category": "c", "key": "k", "value": "v", "expires_days": 0}, "$.expires_days"),
            ({"category": "c", "key": "k", "value": "v", "owner": "bob"}, "$.owner"),
        ]
        for arguments, field in cases:
            result = await call("ada", "s1", "memory.save", arguments)
            assert not result.ok and result.error["code"] == "bad_arguments"
            assert result.error["field"] == field
        # within the type's bound but over the config's
        long = await call(
            "ada", "s1", "memory.save", {"category": "c", "key": "k", "value": "x" * 2001}
        )
        assert long.error["code"] == "invalid_argument" and long.error["field"] == "value"
        too_many = await call("ada", "s1", "memory.search", {"query": "x", "limit": 51})
        assert too_many.error["field"] == "limit"


async def test_policies_and_guidance(store_url):
    async with node_with(store_url) as (node, _):
        tools = node.tools
        assert {n for n in tools.names() if n.startswith("memory.")} == {
            "memory.save",
            "memory.search",
            "memory.forget",
            "memory.list",
        }
        assert tools.policy_of("memory.save") is Policy.AUTO
        assert tools.policy_of("memory.search") is Policy.AUTO
        assert tools.policy_of("memory.list") is Policy.AUTO
        assert tools.policy_of("memory.forget") is Policy.APPROVE
        specs = {s.name: s.description for s in tools.specs()}
        assert "Do NOT call it reflexively" in specs["memory"]
        assert "only when the user explicitly asks" in specs["memory"]
        assert "tool output 95, user statement 80, web 50, guess 30" in specs["memory"]


async def test_a_model_is_offered_one_memory_tool_with_an_action(store_url):
    async with node_with(store_url) as (node, _):
        offered = {s.name: s for s in node.tools.specs() if s.name.startswith("memory")}
        assert set(offered) == {"memory"}  # the four actions are not offered on their own
        schema = offered["memory"].parameters
        assert schema["required"] == ["action"]
        assert schema["properties"]["action"]["enum"] == ["forget", "list", "save", "search"]
        assert node.tools.policy_of("memory") is Policy.AUTO  # each action keeps its own
        call = node.directory.call_tool
        args = {"action": "save", "category": "preferences", "key": "coffee", "value": "dark"}
        saved = await call("ada", "s1", "memory", args)
        assert saved.ok and saved.data["saved"]["confidence"] == 70
        found = await call("ada", "s2", "memory", {"action": "search", "query": "dark"})
        assert [f["key"] for f in found.data["facts"]] == ["coffee"]
        assert (await call("bob", "s1", "memory", {"action": "list"})).data == {
            "facts": [],
            "total": 0,
        }
        listed = await call("ada", "s1", "memory", {"action": "list", "sort_by": "key"})
        assert listed.data["total"] == 1
        # a parameter the action does not take is refused by the action, naming it
        wrong = await call("ada", "s1", "memory", {"action": "search", "key": "coffee"})
        assert wrong.error["code"] == "bad_arguments" and wrong.error["field"] == "$.key"
        missing = await call("ada", "s1", "memory", {"action": "save", "key": "k", "value": "v"})
        assert missing.error["code"] == "bad_arguments"
        assert missing.error["field"] == "$.category"
        unknown = await call("ada", "s1", "memory", {"action": "shred"})
        assert unknown.error["field"] == "$.action"


async def test_the_memory_tool_applies_each_actions_policy(store_url):
    async with node_with(store_url, policies={"memory.save": "BLOCK"}) as (node, http):
        call = node.directory.call_tool
        args = {"action": "save", "category": "home", "key": "city", "value": "Porto"}
        assert (await call("ada", "s1", "memory", args)).error == {
            "code": "blocked",
            "message": "memory.save is blocked by policy",
        }
        await node.features["memory"].memory.save("ada", category="home", key="city", value="x")
        assert (await call("ada", "s1", "memory", {"action": "list"})).data["total"] == 1
        results = []

        async def forget() -> None:
            results.append(await call("ada", "s1", "memory", {"action": "forget", "key": "city"}))

        async def pending() -> list:
            answer = await http.get("/sessions/s1/approvals", headers=auth(ADA))
            return answer.json()["approvals"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forget)
            [approval] = await eventually(pending)  # (a hang guard: seconds when loaded)
            assert approval["tool"] == "memory.forget"  # asked as the action, as a direct call
            answer = await http.post(
                f"/approvals/{approval['approval_id']}/deny", headers=auth(ADA)
            )
            assert answer.status_code == 200
        assert results[0].error == {"code": "denied", "message": "memory.forget was not approved"}
        assert (await call("ada", "s1", "memory", {"action": "list"})).data["total"] == 1
        # run_parallel puts no action to a person: a forget comes back at once, not run
        forget = {"name": "memory", "params": {"action": "forget", "key": "city"}}
        answer = await call("ada", "s1", "run_parallel", {"actions": [forget]})
        assert answer.ok, answer.error
        (entry,) = answer.data["results"]
        assert entry["requires_approval"] is True and entry["success"] is False
        assert (await http.get("/sessions/s1/approvals", headers=auth(ADA))).json() == {
            "approvals": []
        }
        assert (await call("ada", "s1", "memory", {"action": "list"})).data["total"] == 1


async def test_forget_asks_a_person_first(store_url):
    async with node_with(store_url) as (node, http):
        call = node.directory.call_tool
        args = {"category": "home", "key": "city", "value": "Porto"}
        assert (await call("ada", "s1", "memory.save", args)).ok
        results = []

        async def forget() -> None:
            results.append(await call("ada", "s1", "memory.forget", {"key": "city"}))

        async def pending() -> list:
            # listed once stored: the store works on a thread of its own, which no trio
            # task's state shows
            answer = await http.get("/sessions/s1/approvals", headers=auth(ADA))
            return answer.json()["approvals"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forget)
            [approval] = await eventually(pending)  # (a hang guard: seconds when loaded)
            assert approval["tool"] == "memory.forget"
            answer = await http.post(
                f"/approvals/{approval['approval_id']}/approve", headers=auth(ADA)
            )
            assert answer.status_code == 200
        assert results[0].ok and results[0].data == {"deleted": 1}
        assert (await call("ada", "s2", "memory.search", {"query": "porto"})).data["facts"] == []


async def test_a_deleted_session_takes_its_extraction_state_not_the_users_facts(store_url):
    async with node_with(store_url) as (node, http):
        memory = node.features["memory"].memory
        await memory.mark_extracted("ada/s1")
        args = {"category": "home", "key": "city", "value": "Porto"}
        assert (await node.directory.call_tool("ada", "s1", "memory.save", args)).ok
        assert (await http.delete("/sessions/s1", headers=auth(ADA))).status_code == 204
        assert await memory.extracted_at("ada/s1") is None
        assert len((await memory.list_facts("ada"))[0]) == 1


async def test_routes_upsert_list_delete_and_summary(store_url):
    async with node_with(store_url) as (_, http):
        fact = {"category": "my prefs", "key": "drink/hot", "value": "coffee, dark roast"}
        put = await http.put("/memory/facts", json=fact, headers=auth(ADA))
        assert put.status_code == 200
        assert put.json()["fact"]["source"] == "user_explicit"
        assert put.json()["fact"]["confidence"] == 90
        page = (await http.get("/memory/facts?search=roast", headers=auth(ADA))).json()
        assert page["total"] == 1 and page["facts"][0]["key"] == "drink/hot"
        assert (await http.get("/memory/facts", headers=auth(BOB))).json()["total"] == 0
        # keys and categories outside the id rule travel in the query string
        gone = await http.request(
            "DELETE",
            "/memory/facts",
            params={"key": "drink/hot", "category": "my prefs"},
            headers=auth(BOB),
        )
        assert gone.status_code == 404
        gone = await http.request(
            "DELETE",
            "/memory/facts",
            params={"key": "drink/hot", "category": "my prefs"},
            headers=auth(ADA),
        )
        assert gone.status_code == 200 and gone.json() == {"deleted": 1}
        assert (await http.get("/memory/facts", headers=auth(ADA))).json()["total"] == 0

        assert (await http.get("/memory/summary", headers=auth(ADA))).json() == {
            "summary": None,
            "updated_at": None,
        }
        put = await http.put(
            "/memory/summary", json={"content": "Likes coffee."}, headers=auth(ADA)
        )
        assert put.status_code == 200 and put.json()["summary"] == "Likes coffee."
        assert (await http.get("/memory/summary", headers=auth(ADA))).json()["summary"] == (
            "Likes coffee."
        )
        assert (await http.get("/memory/summary", headers=auth(BOB))).json()["summary"] is None


async def test_routes_refuse_bad_input_naming_the_field(store_url):
    async with node_with(store_url) as (_, http):
        for path in ("/memory/facts", "/memory/summary"):
            assert (await http.get(path)).status_code == 401
        assert (await http.put("/memory/facts", json={})).status_code == 401
        bad_bodies = [
            ({"category": "c", "key": "k"}, "$.value"),
            ({"category": "c", "key": "k", "value": "v", "confidence": -1}, "$.confidence"),
            ({"category": "c", "key": "k", "value": "v", "owner": "bob"}, "$.owner"),
            ({"category": "c", "key": "k", "value": "x" * 2001}, "value"),
        ]
        for body, field in bad_bodies:
            answer = await http.put("/memory/facts", json=body, headers=auth(ADA))
            assert answer.status_code == 400, body
            assert answer.json()["error"]["field"] == field
        bad_queries = [
            ("limit=0", "limit"),
            ("limit=many", "limit"),
            ("limit=51", "limit"),
            ("sort_by=owner", "sort_by"),
            ("sort_order=up", "sort_order"),
            ("offset=-1", "offset"),
            ("all_users=maybe", "all_users"),
            ("user=bob", "user"),
        ]
        for query, field in bad_queries:
            answer = await http.get(f"/memory/facts?{query}", headers=auth(ADA))
            assert answer.status_code == 400, query
            assert answer.json()["error"]["field"] == field, query
        missing = await http.request("DELETE", "/memory/facts", headers=auth(ADA))
        assert missing.status_code == 400 and missing.json()["error"]["field"] == "key"
        long = await http.put("/memory/summary", json={"content": "x" * 8001}, headers=auth(ADA))
        assert long.status_code == 400 and long.json()["error"]["field"] == "content"


async def test_only_admins_list_every_users_facts(store_url):
    async with node_with(store_url, admins=["ada"]) as (_, http):
        for token, value in ((ADA, "tea"), (BOB, "coffee")):
            body = {"category": "drinks", "key": "favourite", "value": value}
            assert (await http.put("/memory/facts", json=body, headers=auth(token))).is_success
        refused = await http.get("/memory/facts?all_users=true", headers=auth(BOB))
        assert refused.status_code == 403
        assert refused.json()["error"] == {
            "code": "forbidden",
            "message": "all_users needs the memory.read_all permission",
            "field": "all_users",
        }
        everyone = await http.get("/memory/facts?all_users=true&sort_by=value", headers=auth(ADA))
        assert everyone.status_code == 200
        assert [(f["owner"], f["value"]) for f in everyone.json()["facts"]] == [
            ("ada", "tea"),
            ("bob", "coffee"),
        ]
        own = (await http.get("/memory/facts", headers=auth(ADA))).json()["facts"]
        assert [f["value"] for f in own] == ["tea"]


async def test_disabled_memory_has_no_tools_and_no_routes(store_url):
    async with node_with(store_url, enabled=False) as (node, http):
        assert not [n for n in node.tools.names() if n.startswith("memory")]
        assert (await http.get("/memory/facts", headers=auth(ADA))).status_code == 404


async def test_a_user_deletes_everything_memory_holds_about_them(store_url):
    async with node_with(store_url) as (node, http):
        memory = node.features["memory"].memory
        for token in (ADA, BOB):
            body = {"category": "c", "key": "k", "value": "v"}
            assert (await http.put("/memory/facts", json=body, headers=auth(token))).is_success
            summary = {"content": "about them"}
            assert (await http.put("/memory/summary", json=summary, headers=auth(token))).is_success
        await memory.mark_extracted("ada/s1")
        assert (await http.delete("/memory")).status_code == 401
        gone = await http.delete("/memory", headers=auth(ADA))
        assert gone.status_code == 200
        assert gone.json() == {"deleted": {"facts": 1, "summary": 1, "sessions": 1}}
        assert (await http.get("/memory/facts", headers=auth(ADA))).json()["total"] == 0
        assert (await http.get("/memory/summary", headers=auth(ADA))).json()["summary"] is None
        assert (await http.get("/memory/facts", headers=auth(BOB))).json()["total"] == 1
