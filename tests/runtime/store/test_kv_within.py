"""``kv_put_within``: the prefix's count and the puts are one transaction, so 50 puts at once,
one below the limit, write exactly one (both backends)."""

from __future__ import annotations

import pytest
import trio


async def test_fifty_puts_at_once_one_below_the_limit_write_one(store):
    def items(i: int):
        return [("w", f"w{i}", {"i": i}, None), ("w.index", f"s\x1fw{i}", {"i": i}, None)]

    for i in range(4):
        assert (
            await store.kv_put_within(items(i), namespace="w.index", prefix="s\x1f", limit=5)
            is None
        )
    answers: list[int | None] = []

    async def put(i: int) -> None:
        answers.append(
            await store.kv_put_within(items(10 + i), namespace="w.index", prefix="s\x1f", limit=5)
        )

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(put, i)
    assert sorted(answers, key=lambda a: a is not None) == [None] + [5] * 49
    assert len(await store.kv_list("w.index")) == 5
    assert len(await store.kv_list("w")) == 5
    # another prefix counts on its own; a key that is a start of the prefix does not count
    other = [("w.index", "t\x1fw1", {}, None)]
    assert await store.kv_put_within(other, namespace="w.index", prefix="t\x1f", limit=1) is None
    await store.kv_put("w.index", [("s", {}, None)])
    assert await store.kv_put_within([], namespace="w.index", prefix="s\x1f", limit=6) is None
    with pytest.raises(ValueError, match="limit must be positive"):
        await store.kv_put_within([], namespace="w.index", prefix="s", limit=0)
