"""The key-value table, on both backends: upsert, expiry, ordered listing, deletes."""

from __future__ import annotations

from datetime import timedelta

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
