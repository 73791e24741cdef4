"""Recovery of turns a crash cut off: closed visibly, settled by their input's kind, and the
sessions with inputs waiting listed so that they run.

A node runs :func:`recover` once every feature is ready (their input kinds are registered)
and before any opens; while it runs, the takeover of a dead node's work and the placement's
moves close cut-off turns the same way (:func:`close_cut_off`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from turnstile.actors.sessions.kinds import InputKinds, session_kinds
from turnstile.runtime.store import InboxItem, NodeRef, Store

__all__ = ["close_cut_off", "recover", "release_all"]

log = logging.getLogger("turnstile.node")

_RECOVERY_PAGE = 500
#: The input kinds recovery knows without a node's features: the sessions' own.
_SESSION_KINDS = session_kinds()


async def recover(
    store: Store,
    *,
    max_reruns: int = 0,
    node: NodeRef | None = None,
    kinds: InputKinds | None = None,
) -> list[str]:
    """Close turns cut off by a crash and list the sessions with inputs waiting.

    Which turns: with ``node`` (the registered node that starts), only those of dead nodes --
    inputs claimed by a node whose lease expired (it is declared dead), a stopped node, an
    earlier epoch of any node (this one's own included), or by no node at all; the inputs a
    live node is running are left to it (``store.take_over_dead_nodes``), and so are the
    sessions it runs a turn of. Without ``node``, every running input: the store is this
    process's alone.

    Every cut-off turn is closed visibly (``stream_end`` ``interrupted``; see
    :func:`close_cut_off`), and its input's kind (``kinds``) settles what it keeps for it.

    Returns:
        ids of sessions that have queued inputs (with ``node``: but no turn running on another
        live node).
    """
    if node is None:
        cut = await store.interrupt_running()
        await close_cut_off(store, cut, max_reruns=max_reruns, kinds=kinds)
        return await store.sessions_with_queued_inputs()
    taken = await store.take_over_dead_nodes(node, unclaimed=True)
    for dead in taken.nodes:
        log.warning(
            "node %r epoch %d is dead (its lease expired at %s): its work moves",
            dead.id,
            dead.epoch,
            dead.lease_expires_at.isoformat(),
        )
    await close_cut_off(store, taken.inputs, max_reruns=max_reruns, kinds=kinds)
    await release_all(store, taken.leases)
    return await store.sessions_with_queued_inputs(node=node)


async def release_all(store: Store, leases: dict[str, int]) -> None:
    """Release the sessions a take-over leased to close their cut-off turns."""
    for session_id, fence in leases.items():
        await store.release_session(session_id, fence)


async def close_cut_off(
    store: Store,
    items: Sequence[InboxItem],
    *,
    max_reruns: int = 0,
    kinds: InputKinds | None = None,
) -> None:
    """Close the turns of ``items`` (inputs recovery moved to ``interrupted``) visibly.

    Each gets a ``stream_end`` ``interrupted`` in its session (and the ``stream_start`` the
    crash took, if it did), and its input's kind settles what it keeps for it (``kinds``, the
    node's input kinds: a scheduled turn's run record says so; without ``kinds`` only the
    sessions' own kinds are known, which keep nothing). With
    ``max_reruns`` (``[limits] max_turn_reruns``), its input is then queued again, first in its
    session, as long as it has run again fewer times than that (counted in the row's detail,
    ``reruns``): the turn runs again, and its tool calls carry the same idempotency keys as
    before.
    """
    for item in items:
        reruns = (item.detail or {}).get("reruns", 0)
        again = isinstance(reruns, int) and reruns < max_reruns
        closure: list[tuple[str, dict[str, Any]]] = []
        if not await _turn_started(store, item):
            # A turn's stream_start is stored with the events that follow it, so a crash
            # can take it; without it the transcript would lose the input that began it.
            content = item.payload.get("content", "")
            closure.append(
                ("stream_start", {"input_id": item.id, "source": item.source, "content": content})
            )
        closure.append(
            (
                "stream_end",
                {
                    "input_id": item.id,
                    "status": "interrupted",
                    "text": "",
                    "error": "the node stopped during this turn"
                    + ("; it runs again" if again else ""),
                },
            )
        )
        await store.append_events(item.session_id, closure)
        if again:
            # The run record, if any, stays as it is: the turn run again settles it.
            await store.requeue_input(item.id, {"reruns": reruns + 1})
            log.warning(
                "input %s of session %s was interrupted by a restart; it runs again (%d of %d)",
                item.id,
                item.session_id,
                reruns + 1,
                max_reruns,
            )
            continue
        log.warning("input %s of session %s was interrupted by a restart", item.id, item.session_id)
        await (kinds or _SESSION_KINDS).get(item.source).interrupted(item)


async def _turn_started(store: Store, item: InboxItem) -> bool:
    """Whether the session's log holds ``item``'s ``stream_start``.

    Reads back from the end of the log: turns run one at a time, so meeting an earlier turn's
    ``stream_end`` or this input's own ``turn_queued`` first means its turn never got a start.
    """
    end = await store.last_seq(item.session_id)
    while end > 0:
        after = max(0, end - _RECOVERY_PAGE)
        for event in reversed(await store.read_events(item.session_id, after, end - after)):
            mine = event.payload.get("input_id") == item.id
            if mine and event.type == "stream_start":
                return True
            if event.type == "stream_end" or (mine and event.type == "turn_queued"):
                return False
        end = after
    return False
