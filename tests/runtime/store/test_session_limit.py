"""``create_session(max_per_owner=)``: the owner's count and the insert are one transaction, so
50 creations at once, one below the limit, make exactly one session (both backends)."""

from __future__ import annotations

import pytest
import trio

from turnstile.runtime.errors import AlreadyExists, LimitExceeded


async def test_fifty_creations_at_once_one_below_the_limit_make_one(store):
    for i in range(4):
        await store.create_session(f"ada/{i}", "ada", max_per_owner=5)
    created: list[str] = []
    refused: list[str] = []

    async def create(i: int) -> None:
        try:
            created.append((await store.create_session(f"ada/p{i}", "ada", max_per_owner=5)).id)
        except LimitExceeded as exc:
            refused.append(str(exc))

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(create, i)
    assert len(created) == 1
    assert refused == ["user 'ada' already has 5 sessions (limit 5)"] * 49
    assert len(await store.list_sessions(owner="ada")) == 5
    await store.create_session("bob/1", "bob", max_per_owner=5)  # his count is his own


async def test_the_limit_is_checked_before_the_id(store):
    await store.create_session("ada/a", "ada", max_per_owner=2)
    with pytest.raises(AlreadyExists, match="session 'ada/a' already exists"):
        await store.create_session("ada/a", "ada", max_per_owner=2)
    await store.create_session("ada/b", "ada", max_per_owner=2)
    with pytest.raises(LimitExceeded, match=r"^user 'ada' already has 2 sessions \(limit 2\)$"):
        await store.create_session("ada/a", "ada", max_per_owner=2)
    with pytest.raises(ValueError, match="max_per_owner must be positive"):
        await store.create_session("ada/c", "ada", max_per_owner=0)
