"""Background tasks whose node ended before they did: closed as ``lost``, their sessions told once.

A task runs on the node that started it; its row in ``background_tasks`` names that node's
incarnation. When the incarnation ends first (a crash, a clean stop, a node declared dead),
:class:`LostTasks` closes the row as ``lost`` — at the next start of that node, or at the next
sweep of any node — and tells its session::

    [BACKGROUND TASK FAILED] task_id=bg-…, tool=http.get, elapsed=31.0s
    Error: lost: node 'a' stopped before the task finished

The same pass tells what an ended incarnation finished but did not get to tell: a task whose end
is stored (with its notice's key) and whose session was not marked told — the node died between
the two, or its session could not be reached. Those are told from their rows, grouped by that
key, so a notice the dead node did store is not stored again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from turnstile.actors.execution.background_task import stored_result, stored_text
from turnstile.actors.execution.queries import CLOSE_LOST, LOOK, MARK_TOLD, StoredTask
from turnstile.actors.sessions.actor import Inject
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import NotFound
from turnstile.runtime.membership import ended_by
from turnstile.runtime.store import ClusterView, NodeRecord, NodeRef, Store

__all__ = ["LostTasks"]

log = logging.getLogger("turnstile.background")

#: Lost tasks told per pass of :class:`LostTasks` (the rest at the next one).
_TELL_PER_PASS = 200


class LostTasks:
    """Closes as ``lost`` the running tasks of node incarnations that have ended, and tells
    their sessions, once.

    A pass (:meth:`close`) reads which incarnations run tasks and which lost tasks were not
    told yet (one read); closes the tasks of every incarnation that ``view`` shows ended
    (:func:`~runtime.membership.ended_by`) with one conditional ``UPDATE`` each, so however
    many nodes pass at once each task is closed by one; then tells each lost task's session
    its failure and marks it told. A tell that fails (the session's queue is full, the store
    did not answer) is tried again at the next pass, by this node or another; the notice
    carries the idempotency key ``background-lost:<task id>``, so a session told twice (two
    nodes passing at once over an untold task) stores it once.

    Args:
        store: the node's store.
        clock: the node's clock (``finished_at`` of the tasks it closes).
        tell: ``async (session_key, Inject)``: delivers the notice, on this node or another.
    """

    def __init__(
        self, store: Store, clock: Clock, tell: Callable[[str, Any], Awaitable[Any]]
    ) -> None:
        self.store = store
        self.clock = clock
        self.tell = tell

    async def close(self, view: ClusterView) -> list[StoredTask]:
        """One pass over ``view`` (a fresh or older ``store.list_nodes()``: an incarnation it
        shows ended never comes back). Returns the tasks it closed.

        Raises:
            StoreError: the store did not answer (nothing is lost: the next pass redoes it).
        """
        running, untold = await self.store.run(LOOK, limit=_TELL_PER_PASS)
        # lost tasks are told by whoever passes; ended ones by their own node, unless it ended
        pending = {
            (t.session_key, t.id): t
            for t in untold
            if t.state == "lost" or ended_by(view, NodeRef(t.node_id, t.node_epoch)) is not None
        }
        closed: list[StoredTask] = []
        for node_id, epoch in running:
            current = ended_by(view, NodeRef(node_id, epoch))
            if current is None:
                continue
            why = _lost_because(current, epoch)
            result = ToolResult(ok=False, error={"code": "lost", "message": why})
            rows = await self.store.run(
                CLOSE_LOST,
                node_id=node_id,
                node_epoch=epoch,
                result=stored_result(result),
                now=self.store.db_time(self.clock.now()),
            )
            if rows:
                log.warning(
                    "closed %d background task(s) of node %r epoch %d as lost (%s): %s",
                    len(rows),
                    node_id,
                    epoch,
                    why,
                    ", ".join(f"{t.id} (session {t.session_key})" for t in rows),
                )
            closed.extend(rows)
            pending.update({(t.session_key, t.id): t for t in rows})
        notices: dict[tuple[str, str], list[StoredTask]] = {}
        for task in sorted(pending.values(), key=lambda t: (t.finished_at, t.id)):
            key = task.notice if task.state != "lost" and task.notice else None
            notices.setdefault((task.session_key, key or f"background-lost:{task.id}"), []).append(
                task
            )
        for (session_key, key), tasks in notices.items():
            await self._tell(session_key, key, tasks)
        return closed

    async def _tell(self, session_key: str, key: str, tasks: list[StoredTask]) -> None:
        """One notice for ``tasks`` under ``key``: a lost task's own, or the key its node stored
        with the tasks' ends (the notice it may have stored before it died)."""
        ids = [t.id for t in tasks]
        notice = Inject(
            source="notification",
            content="\n\n".join(stored_text(t) for t in tasks),
            payload={"background_tasks": ids},
            idempotency_key=key,
        )
        try:
            await self.tell(session_key, notice)
        except NotFound:
            pass  # the session is gone: nobody to tell
        except Exception as exc:
            log.warning(
                "telling session %s of background task(s) %s failed (tried again at the next"
                " sweep): %s",
                session_key,
                ", ".join(ids),
                exc,
            )
            return
        await self.store.run(
            MARK_TOLD,
            session_key=session_key,
            ids=ids,
            now=self.store.db_time(self.clock.now()),
        )


def _lost_because(current: NodeRecord, epoch: int) -> str:
    if current.epoch > epoch:
        return (
            f"lost: node {current.id!r} epoch {epoch} ended before the task finished (the node"
            f" started again as epoch {current.epoch})"
        )
    return f"lost: node {current.id!r} stopped before the task finished"
