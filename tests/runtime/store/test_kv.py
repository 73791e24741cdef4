"""The key-value table, on both backends: upsert, expiry, ordered listing, deletes."""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import timedelta

import pytest
import trio

from tests.runtime.store._support import T0


async def test_put_get_list_delete_and_expiry(store, clock):
    await store.kv_put(
        "ns",
        [
            ("b", {"n": 2}, None),
            ("a", {"n": 1}, None),
            ("c", {"n": 3}, T0 + timedelta(seconds=10)),
        ],
    )
    await store.kv_put("other", [("a", {"n": 9}, None)])
    assert await store.kv_get("ns", "a") == {"n": 1}
    assert await store.kv_get("ns", "zz") is None
    assert await store.kv_list("ns") == [("a", {"n": 1}), ("b", {"n": 2}), ("c", {"n": 3})]
    assert await store.kv_list("ns", after_key="a", limit=1) == [("b", {"n": 2})]
    await store.kv_put("ns", [("a", {"n": 10}, None)])  # upsert
    assert await store.kv_get("ns", "a") == {"n": 10}
    clock.advance(seconds=11)
    assert await store.kv_get("ns", "c") is None  # expired reads as absent
    assert [k for k, _ in await store.kv_list("ns")] == ["a", "b"]
    assert await store.kv_purge_expired() == 1
    assert await store.kv_delete("ns", ["a", "missing"]) == 1
    assert await store.kv_list("ns") == [("b", {"n": 2})]
    assert await store.kv_list("other") == [("a", {"n": 9})]


async def test_append_numbers_items_gapless_and_keeps_the_newest(store, clock):
    assert [await store.kv_append("buf", {"n": i}) for i in range(3)] == [1, 2, 3]
    assert await store.kv_list("buf") == [(f"{i + 1:020d}", {"n": i}) for i in range(3)]
    assert await store.kv_get("buf", "") == {"seq": 3}  # the counter, never listed
    # keep: the oldest go in the same transaction; the numbers go on
    assert await store.kv_append("buf", {"n": 3}, keep=2) == 4
    assert [k for k, _ in await store.kv_list("buf")] == [f"{3:020d}", f"{4:020d}"]
    # deleting every item keeps the counter: a number is never given twice
    await store.kv_delete("buf", [k for k, _ in await store.kv_list("buf")])
    assert await store.kv_append("buf", {"n": 4}, expires_at=T0 + timedelta(seconds=5)) == 5
    clock.advance(seconds=6)
    assert await store.kv_list("buf") == []  # expired: a reader sees the gap (5 of 5)


async def test_append_from_several_stores_at_once_is_gapless(backend, clock):
    """Several writers (nodes, each with its store) appending to one namespace at once get
    every number once, 1 to N, and every item is stored under its own."""
    async with AsyncExitStack() as stack:
        stores = [await stack.enter_async_context(backend.open(clock)) for _ in range(3)]
        numbers: list[int] = []

        async def writer(s, w: int) -> None:
            for i in range(40):
                numbers.append(await s.kv_append("shared", {"w": w, "i": i}))

        async with trio.open_nursery() as nursery:
            for w, s in enumerate(stores):
                nursery.start_soon(writer, s, w)
        assert sorted(numbers) == list(range(1, 121))
        items = await stores[0].kv_list("shared")
        assert [k for k, _ in items] == [f"{n:020d}" for n in range(1, 121)]
        assert sorted((v["w"], v["i"]) for _, v in items) == [
            (w, i) for w in range(3) for i in range(40)
        ]


async def test_items_of_several_namespaces_go_in_one_commit(backend, monkeypatch):
    """``kv_put_items`` and ``kv_delete_items`` write rows of several namespaces (a watcher's
    row and its index entry) in one commit: a failed commit leaves all of them as they were.
    Issue 23's crash harness found a watcher's index entry left after its row was deleted in
    an earlier commit."""
    from turnstile.runtime.errors import StoreError
    from turnstile.runtime.store import faults

    monkeypatch.setenv(faults.ENV, "fail:2")
    async with backend.open() as store:
        both = [("w", "1", {"n": 1}, None), ("w.index", "s\x1f1", {"n": 1}, None)]
        await store.kv_put_items(both)  # write 1
        with pytest.raises(StoreError):  # write 2 fails: neither row changes
            await store.kv_put_items([(space, key, {"n": 2}, None) for space, key, _, _ in both])
        assert await store.kv_get("w", "1") == {"n": 1}
        assert await store.kv_get("w.index", "s\x1f1") == {"n": 1}
        pairs = [("w", "1"), ("w.index", "s\x1f1"), ("w", "missing")]
        assert await store.kv_delete_items(pairs) == 2  # write 3
        assert await store.kv_list("w") == [] and await store.kv_list("w.index") == []
        assert await store.kv_delete_items([]) == 0
