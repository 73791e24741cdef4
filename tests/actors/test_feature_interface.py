"""The feature interface, from the outside: a feature package of one's own plugs into a node
through ``open_node(features=...)`` and gets what the built-in ones get: its tables (migration
sets recorded under its name), its tools, its routes behind the gateway's front door, and the
sessions' hooks (what ends with a session)."""

from __future__ import annotations

from contextlib import asynccontextmanager

import httpx
import msgspec

from turnstile.actors.config import Config
from turnstile.actors.feature import NodeContext
from turnstile.actors.node import default_features, open_node
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.runtime.gateway import HttpRoute
from turnstile.runtime.store import Migration, MigrationSet, ops
from turnstile.tools.registry import ToolCall

ADA, BOB = "ada-token-0123456789", "bob-token-0123456789"
GREETINGS_V1 = Migration(
    1,
    "greetings table",
    statements=("CREATE TABLE greetings (session_id TEXT PRIMARY KEY, n INTEGER NOT NULL)",),
)
GREETINGS_V2 = Migration(
    2, "greetings index", statements=("CREATE INDEX greetings_n ON greetings (n)",)
)


class NoParams(msgspec.Struct, forbid_unknown_fields=True):
    """``greet.hello`` takes nothing."""


def _hello_sqlite(conn, key):
    conn.execute(
        "INSERT INTO greetings VALUES (?, 1) ON CONFLICT (session_id) DO UPDATE SET n = n + 1",
        (key,),
    )
    return conn.execute("SELECT n FROM greetings WHERE session_id = ?", (key,)).fetchone()[0]


async def _hello_postgres(conn, key):
    return await conn.fetchval(
        "INSERT INTO greetings VALUES ($1, 1) ON CONFLICT (session_id)"
        " DO UPDATE SET n = greetings.n + 1 RETURNING n",
        key,
    )


def _count_sqlite(conn, key):
    row = conn.execute("SELECT n FROM greetings WHERE session_id = ?", (key,)).fetchone()
    return 0 if row is None else row[0]


async def _count_postgres(conn, key):
    return await conn.fetchval("SELECT n FROM greetings WHERE session_id = $1", key) or 0


def _forget_sqlite(conn, key):
    conn.execute("DELETE FROM greetings WHERE session_id = ?", (key,))


async def _forget_postgres(conn, key):
    await conn.execute("DELETE FROM greetings WHERE session_id = $1", key)


HELLO = ops.procedure(
    "greetings.hello", sqlite=_hello_sqlite, postgres=_hello_postgres, writes=True
)
COUNT = ops.procedure("greetings.count", sqlite=_count_sqlite, postgres=_count_postgres)
FORGET = ops.procedure(
    "greetings.forget", sqlite=_forget_sqlite, postgres=_forget_postgres, writes=True
)


class Greetings:
    """A feature of one's own: a table of its own (a migration set and its queries), a tool
    that counts hellos in it, an endpoint that reads the count, and a hook that forgets a
    deleted session's count."""

    name = "greetings"

    def __init__(self, *migrations: Migration) -> None:
        self.migrations = [MigrationSet("greetings", migrations or (GREETINGS_V1,))]
        self.ended: list[str] = []
        self.store = None

    async def start(self, node: NodeContext) -> None:
        self.store = store = node.store

        async def hello(call: ToolCall, params: NoParams) -> dict[str, int]:
            return {"count": await store.run(HELLO, key=call.session_id)}

        node.tools.register("greet.hello", NoParams, hello, "Say hello; count the hellos.")
        node.hooks.on_session_end.append(self.end)

    async def end(self, key: str) -> None:
        self.ended.append(key)
        await self.store.run(FORGET, key=key)

    def routes(self, node: NodeContext) -> list[HttpRoute]:
        async def count(request) -> dict[str, int]:
            key = await node.directory.owned_key(request.user, request.path["id"])
            return {"count": await node.store.run(COUNT, key=key)}

        return [HttpRoute("GET", "/sessions/{id}/greetings", count)]


@asynccontextmanager
async def node_with(tmp_path, feature: Greetings):
    agent = ScriptedAgent(token_delay=0)
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    async with open_node(
        config,
        tokens={ADA: "ada", BOB: "bob"},
        agent=agent,
        features=[*default_features(agent), feature],
        serve=False,
    ) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            yield node, http


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_feature_of_ones_own_gets_tables_tools_routes_and_hooks(tmp_path):
    greetings = Greetings()
    async with node_with(tmp_path, greetings) as (node, http):
        assert (
            await http.post("/sessions", json={"id": "s1"}, headers=auth(ADA))
        ).status_code == 201
        for expected in (1, 2):
            result = await node.directory.call_tool("ada", "s1", "greet.hello", {})
            assert result.ok and result.data == {"count": expected}
        answer = await http.get("/sessions/s1/greetings", headers=auth(ADA))
        assert answer.status_code == 200 and answer.json() == {"count": 2}
        # behind the same front door as every route: no token, someone else's, a bad id
        assert (await http.get("/sessions/s1/greetings")).status_code == 401
        assert (await http.get("/sessions/s1/greetings", headers=auth(BOB))).status_code == 404
        bad = await http.get("/sessions/s%201/greetings", headers=auth(ADA))
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "id"
        applied = [(m.set_name, m.version) for m in await node.store.migrations()]
        assert ("greetings", 1) in applied
        assert (await http.delete("/sessions/s1", headers=auth(ADA))).status_code == 204
        assert greetings.ended == ["ada/s1"]
        assert await node.store.run(COUNT, key="ada/s1") == 0


async def test_a_features_rows_outlive_the_node_and_a_new_step_runs_alone(tmp_path):
    async with node_with(tmp_path, Greetings(GREETINGS_V1)) as (node, http):
        await http.post("/sessions", json={"id": "s1"}, headers=auth(ADA))
        await node.directory.call_tool("ada", "s1", "greet.hello", {})
    # step 1 again would fail (the table exists): only step 2 may run
    async with node_with(tmp_path, Greetings(GREETINGS_V1, GREETINGS_V2)) as (node, http):
        mine = [m.version for m in await node.store.migrations() if m.set_name == "greetings"]
        assert mine == [1, 2]
        answer = await http.get("/sessions/s1/greetings", headers=auth(ADA))
        assert answer.json() == {"count": 1}


async def test_features_may_be_given_in_any_order(tmp_path):
    """The node derives the start order from what each feature declares (``start_order``): the
    sessions feature, which the others need, may come last, first or anywhere."""
    greetings = Greetings()
    agent = ScriptedAgent(token_delay=0)
    features = [greetings, *default_features(agent)[::-1]]
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    async with open_node(config, agent=agent, features=features, serve=False) as node:
        await node.directory.create_session("ada", session_id="s1")
        result = await node.directory.call_tool("ada", "s1", "greet.hello", {})
        assert result.ok and result.data == {"count": 1}
        assert (await node.directory.submit("ada", "s1", "hello")).input_id
