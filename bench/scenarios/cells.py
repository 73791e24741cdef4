"""Scenario ``cells``: users split over two PostgreSQL databases (cells) by a router.

Past the point where one PostgreSQL stops (``docs/performance.md``, "Capacity model"), users
are split over several PostgreSQL clusters, each with its own nodes: a **cell**. Nothing of a
user's sessions, inbox, events, jobs or memory is shared between cells; a **router** in front
(the load balancer's rule, or a thin proxy) sends each user's requests to their cell. This
scenario simulates that on the local server with two databases, a node on each, in one
process (the box has 2 cores, so two cells cannot add cores here: what is measured is that
the split costs nothing per turn, keeps every user's rows in one cell, and what a move costs).

* **Router**: rendezvous hashing of the user over the cells (adding a cell moves only the
  users it wins), plus an override table for users moved by hand.
* **One cell** (baseline): every user's turns on cell A's node: turns/s.
* **Two cells**: the same users and turns, each sent to the node the router names: turns/s,
  and every session row checked to be in its user's cell and in no other.
* **A move**: one user moved from A to B while the others keep their cells: their requests
  held, their turns finished, their actors passivated on A, their rows (sessions, inbox,
  events) copied to B, the override set, their rows deleted on A; then a message through B's
  node continues each moved session's log at the next seq. Each cell's inbox ids come from its
  own range (cell B's identity starts at 10^12), so copied rows keep their ids.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from bench.harness import Measure, ScenarioResult
from bench.pgschema import PG_DSN, PostgresUnavailable
from turnstile.actors.config import Config, Limits
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.actors.sessions.feature import SessionsFeature
from turnstile.actors.settings import NodeConfig
from turnstile.runtime.store.postgres_thread import AsyncioThread, open_asyncio_thread

#: What moves with a user, in the order rows must be written (sessions first: the others
#: reference them). The features' own tables (jobs, watchers, memory) move the same way.
USER_TABLES = ("sessions", "inbox", "events")
CELL_B_IDS = 10**12  # where cell B's inbox ids start: ids stay unique across cells


@dataclass(frozen=True)
class Sizes:
    users: int
    sessions: int  # per user
    messages: int  # per session


FULL = Sizes(50, 10, 10)
QUICK = Sizes(20, 5, 5)


class Router:
    """Which cell a user's requests go to: an override, else rendezvous hashing."""

    def __init__(self, cells: Sequence[str]) -> None:
        self.cells = list(cells)
        self.moved: dict[str, str] = {}

    def cell_of(self, user: str) -> str:
        moved = self.moved.get(user)
        if moved is not None:
            return moved
        return max(self.cells, key=lambda cell: _weight(cell, user))


def _weight(cell: str, user: str) -> int:
    digest = hashlib.blake2b(f"{cell}\0{user}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class _Ends:
    """A subscriber: the inputs whose turn ended, and an event to wait for the next end."""

    __slots__ = ("ended", "changed")

    def __init__(self) -> None:
        self.ended: set[int] = set()
        self.changed = trio.Event()

    def offer(self, session_id: str, seq: int, frame: bytes) -> bool:
        if b'"stream_end"' in frame:
            head = frame.split(b",", 1)[0]  # '{"input_id":N' (msgspec writes it first)
            if head.startswith(b'{"input_id":'):
                self.ended.add(int(head[12:]))
                self.changed.set()
        return True

    def lagged(self, session_id: str, last_seq: int) -> None:
        pass

    def deleted(self, session_id: str) -> None:
        pass

    async def until(self, input_id: int) -> None:
        while input_id not in self.ended:
            self.changed = trio.Event()
            await self.changed.wait()


@dataclass
class _Run:
    one_cell: float = 0.0
    two_cells: float = 0.0
    split: dict[str, int] = field(default_factory=dict)
    misplaced: int = 0
    move_s: float = 0.0
    moved_rows: int = 0
    continued: int = 0
    moved_sessions: int = 0
    route_us: float = 0.0


async def _admin(aio: AsyncioThread, sql: str, dsn: str = PG_DSN, *args: Any) -> list[Any]:
    import asyncpg

    conn = await aio.call(partial(asyncpg.connect, dsn, timeout=10))
    try:
        return await aio.call(conn.fetch, sql, *args)
    finally:
        await aio.call(conn.close)


async def _turns(nodes: dict[str, Any], router: Router, names: list[tuple[str, str]], m: int):
    """Every session runs ``m`` turns, one after another, through the node its user's cell
    names; the seconds it took."""

    async def drive(user: str, sid: str) -> None:
        directory = nodes[router.cell_of(user)].directory
        ends = _Ends()
        await directory.attach(user, sid, ends)
        try:
            for i in range(m):
                submitted = await directory.submit(user, sid, f"m{i}")
                assert submitted.input_id is not None
                await ends.until(submitted.input_id)
        finally:
            await directory.detach(user, sid, ends)

    start = time.perf_counter()
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            for user, sid in names:
                nursery.start_soon(drive, user, sid)
    return time.perf_counter() - start


async def _copy_user(aio: AsyncioThread, src: str, dst: str, user: str) -> int:
    """Copy ``user``'s rows from the database ``src`` to ``dst``; the rows copied."""
    import asyncpg

    a = await aio.call(partial(asyncpg.connect, src, timeout=10))
    b = await aio.call(partial(asyncpg.connect, dst, timeout=10))
    copied = 0
    try:
        ids = [
            r["id"]
            for r in await aio.call(a.fetch, "SELECT id FROM sessions WHERE owner = $1", user)
        ]
        tx = b.transaction()
        await aio.call(tx.start)
        try:
            for table in USER_TABLES:
                where = "owner = $1" if table == "sessions" else "session_id = ANY($1::text[])"
                rows = await aio.call(
                    a.fetch,
                    f"SELECT * FROM {table} WHERE {where}",
                    user if table == "sessions" else ids,
                )
                if rows:
                    columns = list(rows[0].keys())
                    await aio.call(
                        partial(b.copy_records_to_table, table, records=rows, columns=columns)
                    )
                    copied += len(rows)
            # the lease names a node of the old cell: the new cell's nodes place it afresh
            await aio.call(
                b.execute,
                "UPDATE sessions SET lease_node = NULL, lease_node_epoch = NULL WHERE owner = $1",
                user,
            )
            await aio.call(tx.commit)
        except BaseException:
            await aio.call(tx.rollback)
            raise
        await aio.call(a.execute, "DELETE FROM sessions WHERE owner = $1", user)
    finally:
        await aio.call(a.close)
        await aio.call(b.close)
    return copied


async def _run(sizes: Sizes, dsns: dict[str, str], aio: AsyncioThread) -> _Run:
    out = _Run()
    agent = ScriptedAgent()
    users = [f"user{u:03d}" for u in range(sizes.users)]
    names = [(u, f"s{i}") for u in users for i in range(sizes.sessions)]
    limits = Limits(max_sessions_per_user=max(100, 2 * sizes.sessions))
    async with AsyncExitStack() as stack:
        nodes = {}
        for cell, dsn in dsns.items():
            config = Config(store=dsn, limits=limits, node=NodeConfig(id=f"cell-{cell}"))
            nodes[cell] = await stack.enter_async_context(
                open_node(config, agent=agent, features=[SessionsFeature(agent)], serve=False)
            )
        # ids unique across cells: cell B's inbox ids come from a range of their own
        await _admin(aio, f"ALTER TABLE inbox ALTER COLUMN id RESTART WITH {CELL_B_IDS}", dsns["b"])

        # -- one cell: everyone on A (sessions of their own, gone before the next phase) --
        alone = Router(["a"])
        first = [(user, f"p{sid}") for user, sid in names]
        for user, sid in first:
            await nodes["a"].directory.create_session(user, session_id=sid)
        out.one_cell = (
            len(names) * sizes.messages / await _turns(nodes, alone, first, sizes.messages)
        )
        for address in nodes["a"].directory.registry.active("session"):
            await nodes["a"].directory.registry.deactivate(address)
        await _admin(aio, "DELETE FROM sessions", dsns["a"])

        # -- two cells: the router splits the same users --
        router = Router(["a", "b"])
        t0 = time.perf_counter()
        for _ in range(100):
            for user in users:
                router.cell_of(user)
        out.route_us = (time.perf_counter() - t0) / (100 * len(users)) * 1e6
        for user, sid in names:
            await nodes[router.cell_of(user)].directory.create_session(user, session_id=sid)
        out.two_cells = (
            len(names) * sizes.messages / await _turns(nodes, router, names, sizes.messages)
        )
        for cell, dsn in dsns.items():
            rows = await _admin(
                aio, "SELECT owner, count(*) AS n FROM sessions GROUP BY owner", dsn
            )
            out.split[cell] = sum(r["n"] for r in rows)
            out.misplaced += sum(r["n"] for r in rows if router.cell_of(r["owner"]) != cell)

        # -- a move: the first user of cell A goes to B --
        mover = next(u for u in users if router.cell_of(u) == "a")
        mine = [sid for user, sid in names if user == mover]
        start = time.perf_counter()
        for sid in mine:  # nothing of theirs stays active on A (their turns are done)
            key = await nodes["a"].directory.owned_key(mover, sid)
            await nodes["a"].directory.registry.deactivate(f"session:{key}")
        out.moved_rows = await _copy_user(aio, dsns["a"], dsns["b"], mover)
        router.moved[mover] = "b"
        out.move_s = time.perf_counter() - start
        out.moved_sessions = len(mine)
        before = {}
        for sid in mine:
            before[sid] = (await nodes["b"].directory.get_session(mover, sid)).last_seq
        await _turns(nodes, router, [(mover, sid) for sid in mine], 1)
        for sid in mine:
            after = await nodes["b"].directory.read_events(mover, sid, after_seq=before[sid])
            if after and after[0].seq == before[sid] + 1:
                out.continued += 1
        left = await _admin(
            aio, "SELECT count(*) AS n FROM sessions WHERE owner = $1", dsns["a"], mover
        )
        out.misplaced += left[0]["n"]
    return out


def run(quick: bool = False) -> ScenarioResult:
    """Two cells behind a router; see the module docstring."""
    sizes = QUICK if quick else FULL
    load = os.getloadavg()
    tag = uuid.uuid4().hex[:8]
    names = {"a": f"bench_cell_a_{tag}", "b": f"bench_cell_b_{tag}"}
    base = PG_DSN.rsplit("/", 1)[0]
    dsns = {cell: f"{base}/{db}" for cell, db in names.items()}

    async def main() -> _Run | str:
        async with open_asyncio_thread() as aio:
            try:
                for db in names.values():
                    await _admin(aio, f"CREATE DATABASE {db}")
            except (OSError, TimeoutError) as exc:
                return f"PostgreSQL at {PG_DSN} is not reachable ({exc!r})"
            try:
                return await _run(sizes, dsns, aio)
            finally:
                for db in names.values():
                    await _admin(aio, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")

    try:
        r = trio.run(main)
    except PostgresUnavailable as exc:
        r = str(exc)
    if isinstance(r, str):
        return ScenarioResult("cells", [], [f"Skipped: {r}."])
    turns = sizes.users * sizes.sessions * sizes.messages
    measures = [
        Measure(
            f"turns/s, two cells ({turns:,} turns)",
            r.two_cells,
            "turns/s",
            baseline="one cell",
            baseline_value=r.one_cell,
            target=">= 0.9x one cell (2 cores: no cores to add)",
            ok=r.two_cells >= 0.9 * r.one_cell,
        ),
        Measure("router: cell of a user", r.route_us, "µs"),
        Measure("sessions in cell A / B", r.split.get("a", 0), f"/ {r.split.get('b', 0)}"),
        Measure(
            "rows outside their user's cell", r.misplaced, "rows", target="0", ok=r.misplaced == 0
        ),
        Measure(
            f"a user's move ({r.moved_sessions} sessions, {r.moved_rows:,} rows)",
            r.move_s * 1e3,
            "ms",
        ),
        Measure(
            "moved sessions whose log continues at the next seq",
            r.continued,
            f"of {r.moved_sessions}",
            target="all",
            ok=r.continued == r.moved_sessions,
        ),
    ]
    notes = [
        f"Load average before: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; "
        f"{sizes.users} users x {sizes.sessions} sessions x {sizes.messages} turns, both "
        "cells' nodes in this one process on the local PostgreSQL (two databases)."
    ]
    return ScenarioResult("cells", measures, notes)
