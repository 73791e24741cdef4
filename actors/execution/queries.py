"""The execution feature's queries on ``background_tasks``: store operations, one function
per backend.

Times are passed in as the store keeps them (``store.db_time``) and come back as aware
datetimes; ``args`` and ``result`` are JSON text, bounded by the caller.

A task is written three times on its way: :data:`START` (one transaction that counts the
session's running tasks, through every node, inserts the row unless they are at the limit, and
forgets the session's oldest finished tasks past the ones kept), :data:`FINISH` (one ``UPDATE``
of a row that is still ``running``, with the key of the notice that will tell it: a row another
node closed as ``lost`` meanwhile stays lost, and the caller learns it) and :data:`MARK_TOLD`,
once the notice is stored in its session. :data:`CLOSE_LOST` closes the running tasks of one
ended incarnation with a conditional ``UPDATE … WHERE state = 'running' AND node_id = … AND
node_epoch = …``, so of any number of nodes sweeping at once exactly one gets each row back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from turnstile.runtime.store import ops

__all__ = [
    "CLOSE_LOST",
    "DROP_SESSION",
    "FINISH",
    "GET",
    "LIST",
    "LOOK",
    "MARK_TOLD",
    "START",
    "StoredTask",
]


class StoredTask(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``background_tasks``.

    Attributes:
        id: the task's id (unique within its session).
        session_key: the session that started it.
        owner: that session's user.
        tool: the tool it runs.
        args: a bounded JSON summary of its arguments.
        state: ``running``, ``completed``, ``failed``, ``cancelled`` or ``lost``.
        result: ``{"success": …, "data" | "error": …}`` once it ended (None while running and
            for a cancelled task).
        started_at: when it started.
        finished_at: when it ended, or was found lost.
        node_id: the node that runs (ran) it.
        node_epoch: that node's epoch when it started the task.
        notice: the idempotency key of the notice that tells its session of its end (tasks
            that ended within one batch window share it); None for a lost task (told under
            ``background-lost:<id>``) and for rows written before execution's ``background``
            migration 2.
        notified_at: when its session was told (None: not yet).
    """

    id: str
    session_key: str
    owner: str
    tool: str
    args: str
    state: str
    result: dict[str, Any] | None
    started_at: datetime
    finished_at: datetime | None
    node_id: str
    node_epoch: int
    notice: str | None = None
    notified_at: datetime | None = None


_COLUMNS = (
    "id, session_key, owner, tool, args, state, result, started_at, finished_at, node_id,"
    " node_epoch, notice, notified_at"
)


def _time(value: str | datetime) -> datetime:
    """A time column: a datetime from PostgreSQL, ISO 8601 text from SQLite."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _task(row: Any) -> StoredTask:
    return StoredTask(
        id=row[0],
        session_key=row[1],
        owner=row[2],
        tool=row[3],
        args=row[4],
        state=row[5],
        result=None if row[6] is None else msgspec.json.decode(row[6]),
        started_at=_time(row[7]),
        finished_at=None if row[8] is None else _time(row[8]),
        node_id=row[9],
        node_epoch=row[10],
        notice=row[11],
        notified_at=None if row[12] is None else _time(row[12]),
    )


def _count(status: str) -> int:
    return int(status.split()[-1])


# ---- start, finish ------------------------------------------------------------------------------

_INSERT = (
    "INSERT INTO background_tasks (id, session_key, owner, tool, args, state, started_at,"
    " node_id, node_epoch) VALUES ({}, 'running', {}, {}, {})"
)
#: the session's finished tasks past the newest ``keep``
_OLD = (
    "DELETE FROM background_tasks WHERE session_key = {key} AND id IN (SELECT id FROM"
    " background_tasks WHERE session_key = {key} AND state <> 'running'"
    " ORDER BY started_at DESC, id LIMIT -1 OFFSET {keep})"
)


#: The columns ``_INSERT`` fills, in its order.
_TASK_FIELDS = (
    "id",
    "session_key",
    "owner",
    "tool",
    "args",
    "started_at",
    "node_id",
    "node_epoch",
)


#: the session's running tasks, on every node, up to ``limit``
_RUNNING_OF = (
    "SELECT count(*) FROM (SELECT 1 FROM background_tasks WHERE session_key = {key}"
    " AND state = 'running' LIMIT {limit}) AS running"
)
#: serialises the starts of one session's tasks across connections (and nodes), to the end of
#: the transaction
_LOCK_SESSION = "SELECT pg_advisory_xact_lock(hashtext('background_tasks:' || $1::text))"


def _start_sqlite(conn: Any, *, task: dict[str, Any], keep: int, limit: int) -> int | None:
    # in the writer's transaction: no other write runs between the count and the insert
    key = task["session_key"]
    (running,) = conn.execute(_RUNNING_OF.format(key="?1", limit="?2"), (key, limit)).fetchone()
    if running >= limit:
        return int(running)
    conn.execute(
        _INSERT.format("?, ?, ?, ?, ?", "?", "?", "?"),
        tuple(task[f] for f in _TASK_FIELDS),
    )
    conn.execute(_OLD.format(key="?1", keep="?2"), (key, keep))
    return None


async def _start_postgres(conn: Any, *, task: dict[str, Any], keep: int, limit: int) -> int | None:
    key = task["session_key"]
    async with conn.transaction():
        await conn.execute(_LOCK_SESSION, key)
        running = await conn.fetchval(_RUNNING_OF.format(key="$1", limit="$2"), key, limit)
        if running >= limit:
            return int(running)
        # the INSERT and the pruning in a data-modifying WITH
        await conn.execute(
            "WITH started AS ("
            + _INSERT.format("$1, $2, $3, $4, $5", "$6", "$7", "$8")
            + ") "
            + _OLD.format(key="$2", keep="$9").replace("LIMIT -1 ", ""),
            *(task[f] for f in _TASK_FIELDS),
            keep,
        )
    return None


#: ``(task: {id, session_key, owner, tool, args, started_at, node_id, node_epoch}, keep,
#: limit) -> None | running``: records a task as ``running`` and forgets the session's finished
#: tasks past the newest ``keep``, unless the session has ``limit`` tasks running on any node
#: (then how many, and nothing is written): the count and the insert in one transaction, on
#: PostgreSQL under a lock on the session, so starts at once through several nodes never pass
#: the limit.
START = ops.procedure(
    "execution.start", sqlite=_start_sqlite, postgres=_start_postgres, writes=True
)

_FINISH = (
    "UPDATE background_tasks SET state = {state}, result = {result}, finished_at = {now},"
    " notice = {notice} WHERE session_key = {key} AND id = {id} AND state = 'running'"
)


def _finish_sqlite(
    conn: Any,
    *,
    session_key: str,
    id: str,
    state: str,
    result: str | None,
    now: str,
    notice: str,
) -> bool:
    sql = _FINISH.format(state="?1", result="?2", now="?3", notice="?4", key="?5", id="?6")
    return conn.execute(sql, (state, result, now, notice, session_key, id)).rowcount == 1


async def _finish_postgres(
    conn: Any,
    *,
    session_key: str,
    id: str,
    state: str,
    result: str | None,
    now: datetime,
    notice: str,
) -> bool:
    sql = _FINISH.format(state="$1", result="$2", now="$3", notice="$4", key="$5", id="$6")
    return _count(await conn.execute(sql, state, result, now, notice, session_key, id)) == 1


#: ``(session_key, id, state, result, now, notice) -> bool``: the task ended, its session to be
#: told under the idempotency key ``notice`` (by its node, or after that node's end by a
#: sweep); False when the row is not ``running`` any more (closed as lost by another node,
#: which tells the session) or is gone (the session was deleted).
FINISH = ops.procedure(
    "execution.finish", sqlite=_finish_sqlite, postgres=_finish_postgres, writes=True
)


# ---- reading ------------------------------------------------------------------------------------

_GET = f"SELECT {_COLUMNS} FROM background_tasks WHERE session_key = {{}} AND id = {{}}"


def _get_sqlite(conn: Any, *, session_key: str, id: str) -> StoredTask | None:
    row = conn.execute(_GET.format("?", "?"), (session_key, id)).fetchone()
    return None if row is None else _task(row)


async def _get_postgres(conn: Any, *, session_key: str, id: str) -> StoredTask | None:
    row = await conn.fetchrow(_GET.format("$1", "$2"), session_key, id)
    return None if row is None else _task(row)


#: ``(session_key, id) -> StoredTask | None``: only the session's own task.
GET = ops.procedure("execution.get", sqlite=_get_sqlite, postgres=_get_postgres)

_LIST = (
    f"SELECT {_COLUMNS} FROM background_tasks WHERE session_key = {{}}"
    " ORDER BY started_at DESC, id LIMIT {}"
)


def _list_sqlite(conn: Any, *, session_key: str, limit: int) -> list[StoredTask]:
    return [_task(row) for row in conn.execute(_LIST.format("?", "?"), (session_key, limit))]


async def _list_postgres(conn: Any, *, session_key: str, limit: int) -> list[StoredTask]:
    return [_task(row) for row in await conn.fetch(_LIST.format("$1", "$2"), session_key, limit)]


#: ``(session_key, limit) -> [StoredTask]``: the session's tasks, newest first.
LIST = ops.procedure("execution.list", sqlite=_list_sqlite, postgres=_list_postgres)


# ---- lost tasks ---------------------------------------------------------------------------------

_RUNNING = "SELECT DISTINCT node_id, node_epoch FROM background_tasks WHERE state = 'running'"
_UNTOLD = (
    f"SELECT {_COLUMNS} FROM background_tasks WHERE state <> 'running' AND notified_at IS NULL"
    " ORDER BY finished_at LIMIT {}"
)


def _look_sqlite(conn: Any, *, limit: int) -> tuple[list[tuple[str, int]], list[StoredTask]]:
    running = [(row[0], row[1]) for row in conn.execute(_RUNNING)]
    return running, [_task(row) for row in conn.execute(_UNTOLD.format("?"), (limit,))]


async def _look_postgres(
    conn: Any, *, limit: int
) -> tuple[list[tuple[str, int]], list[StoredTask]]:
    running = [(row[0], row[1]) for row in await conn.fetch(_RUNNING)]
    return running, [_task(row) for row in await conn.fetch(_UNTOLD.format("$1"), limit)]


#: ``(limit) -> ([(node_id, node_epoch)], [StoredTask])``: the incarnations that run tasks,
#: and up to ``limit`` ended tasks (lost or not) whose session was not told yet.
LOOK = ops.procedure("execution.look", sqlite=_look_sqlite, postgres=_look_postgres)

_CLOSE_LOST = (
    "UPDATE background_tasks SET state = 'lost', result = {result}, finished_at = {now}"
    " WHERE state = 'running' AND node_id = {node} AND node_epoch = {epoch}"
    f" RETURNING {_COLUMNS}"
)


def _close_lost_sqlite(
    conn: Any, *, node_id: str, node_epoch: int, result: str, now: str
) -> list[StoredTask]:
    sql = _CLOSE_LOST.format(result="?1", now="?2", node="?3", epoch="?4")
    return [_task(row) for row in conn.execute(sql, (result, now, node_id, node_epoch))]


async def _close_lost_postgres(
    conn: Any, *, node_id: str, node_epoch: int, result: str, now: datetime
) -> list[StoredTask]:
    sql = _CLOSE_LOST.format(result="$1", now="$2", node="$3", epoch="$4")
    return [_task(row) for row in await conn.fetch(sql, result, now, node_id, node_epoch)]


#: ``(node_id, node_epoch, result, now) -> [StoredTask]``: closes as ``lost`` (with ``result``)
#: the tasks that incarnation was running; answers the rows this call closed (none when another
#: node closed them first).
CLOSE_LOST = ops.procedure(
    "execution.close_lost",
    sqlite=_close_lost_sqlite,
    postgres=_close_lost_postgres,
    writes=True,
)

_MARK_TOLD = (
    "UPDATE background_tasks SET notified_at = {now}"
    " WHERE session_key = {key} AND id = {id} AND notified_at IS NULL"
)


def _mark_told_sqlite(conn: Any, *, session_key: str, ids: list[str], now: str) -> None:
    sql = _MARK_TOLD.format(now="?1", key="?2", id="?3")
    conn.executemany(sql, [(now, session_key, id) for id in ids])


async def _mark_told_postgres(
    conn: Any, *, session_key: str, ids: list[str], now: datetime
) -> None:
    sql = _MARK_TOLD.format(now="$1", key="$2", id="ANY($3::text[])")
    await conn.execute(sql, now, session_key, ids)


#: ``(session_key, ids, now)``: the session of these ended tasks was told (its notice is
#: stored there), in one commit.
MARK_TOLD = ops.procedure(
    "execution.mark_told",
    sqlite=_mark_told_sqlite,
    postgres=_mark_told_postgres,
    writes=True,
)


def _drop_sqlite(conn: Any, *, session_key: str) -> int:
    sql = "DELETE FROM background_tasks WHERE session_key = ?"
    return conn.execute(sql, (session_key,)).rowcount


async def _drop_postgres(conn: Any, *, session_key: str) -> int:
    sql = "DELETE FROM background_tasks WHERE session_key = $1"
    return _count(await conn.execute(sql, session_key))


#: ``(session_key) -> rows deleted``: a deleted session's tasks.
DROP_SESSION = ops.procedure(
    "execution.drop_session", sqlite=_drop_sqlite, postgres=_drop_postgres, writes=True
)
