"""``fold_input``, on both backends: a queued input goes straight to ``done`` (folded into the
running turn by the session's holder, for a message another node stored with the policy
``inject``), once, and only while it is still queued and the writer still holds the lease."""

from __future__ import annotations

import pytest

from tests.runtime.store.test_session_leases import two_nodes
from turnstile.runtime.errors import Fenced


async def test_a_queued_input_is_folded_once_and_a_claimed_one_is_not(store):
    await store.create_session("s", "ada")
    running = await store.enqueue_input("s", "user", {"content": "long"})
    await store.claim_next_input("s")
    more = await store.enqueue_input("s", "user", {"content": "more"})
    behind = await store.enqueue_input("s", "user", {"content": "behind"})
    folded = await store.fold_input(more.id, {"injected_into": running.id})
    assert (folded.id, folded.state, folded.detail) == (
        more.id,
        "done",
        {"injected_into": running.id},
    )
    assert await store.fold_input(more.id, {"injected_into": running.id}) is None  # once
    assert await store.fold_input(running.id) is None  # running: not queued
    assert await store.fold_input(999) is None
    await store.finish_input(running.id, "done")
    assert (await store.claim_next_input("s")).id == behind.id  # the folded one never runs
    assert await store.fold_input(behind.id) is None


async def test_a_fold_whose_lease_moved_stores_nothing(store):
    await store.create_session("s", "ada")
    a, b = await two_nodes(store)
    held = await store.acquire_session("s", a)
    queued = await store.enqueue_input("s", "user", {"content": "more"})
    await store.release_session("s", held.fence)
    await store.acquire_session("s", b)
    with pytest.raises(Fenced):
        await store.fold_input(queued.id, {"injected_into": 1}, fence=held.fence)
    assert [i.state for i in await store.list_inputs("s")] == ["queued"]


async def test_a_folded_input_unfolds_once_and_runs_in_its_own_row(store):
    """``unfold_input``: the turn a folded input went into closed before its agent took it,
    so the same row is queued again (its key kept, its detail cleared) and claimed next."""
    await store.create_session("s", "ada")
    running = await store.enqueue_input("s", "user", {"content": "long"})
    await store.claim_next_input("s")
    keyed = await store.enqueue_keyed(
        "s",
        "notification",
        {"content": "task ended"},
        "background:bg-1",
        state="done",
        detail={"injected_into": running.id},
    )
    assert await store.unfold_input(running.id) is None  # running: not folded
    unfolded = await store.unfold_input(keyed.item.id)
    assert (unfolded.id, unfolded.state, unfolded.detail, unfolded.idempotency_key) == (
        keyed.item.id,
        "queued",
        None,
        "background:bg-1",
    )
    assert await store.unfold_input(keyed.item.id) is None  # once
    await store.finish_input(running.id, "done")
    assert (await store.claim_next_input("s")).id == keyed.item.id
    same = await store.enqueue_keyed(
        "s", "notification", {"content": "task ended"}, "background:bg-1"
    )
    assert (same.item.id, same.created) == (keyed.item.id, False)  # the key still answers


async def test_an_unfold_whose_lease_moved_stores_nothing(store):
    await store.create_session("s", "ada")
    a, b = await two_nodes(store)
    held = await store.acquire_session("s", a)
    queued = await store.enqueue_input("s", "user", {"content": "more"})
    await store.fold_input(queued.id, {"injected_into": 1}, fence=held.fence)
    await store.release_session("s", held.fence)
    await store.acquire_session("s", b)
    with pytest.raises(Fenced):
        await store.unfold_input(queued.id, fence=held.fence)
    assert [i.state for i in await store.list_inputs("s")] == ["done"]
