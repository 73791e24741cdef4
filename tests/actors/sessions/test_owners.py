"""The per-node cache of which sessions exist (``actors/sessions/owners.py``): how long it keeps
an entry, and that a forget wins over a read that raced it. Across nodes:
``test_sessions_cluster.py``."""

from __future__ import annotations

import pytest
import trio

from turnstile.actors.sessions.owners import OwnerCache, OwnerCacheStatistics


async def test_an_entry_is_kept_its_seconds_and_then_read_again(autojump_clock):
    cache = OwnerCache(10.0)
    cache.put("ada/s", "ada", cache.generation())
    await trio.sleep(9.9)
    assert cache.get("ada/s") == "ada"
    await trio.sleep(0.1)
    assert cache.get("ada/s") is None  # the bound on a delete whose announcement was lost
    assert cache.statistics() == OwnerCacheStatistics(cached=0, forgotten=0)


async def test_a_read_that_raced_a_forget_keeps_nothing():
    cache = OwnerCache()
    before = cache.generation()  # a miss reads the store...
    cache.forget("ada/s")  # ...while a delete is heard
    cache.put("ada/s", "ada", before)  # what was read may be the deleted row
    assert cache.get("ada/s") is None
    cache.put("ada/s", "ada", cache.generation())
    assert cache.get("ada/s") == "ada"


async def test_forget_and_forget_all():
    cache = OwnerCache()
    for key in ("ada/s", "ada/t", "bob/s"):
        cache.put(key, key.partition("/")[0], cache.generation())
    cache.forget("ada/s")
    assert [cache.get(k) for k in ("ada/s", "ada/t", "bob/s")] == [None, "ada", "bob"]
    cache.forget_all()
    assert cache.statistics() == OwnerCacheStatistics(cached=0, forgotten=2)


async def test_zero_seconds_keeps_nothing_and_the_size_is_bounded():
    off = OwnerCache(0)
    off.put("ada/s", "ada", off.generation())
    assert off.get("ada/s") is None
    small = OwnerCache(max_entries=2)
    for key in ("ada/a", "ada/b", "ada/c"):
        small.put(key, "ada", small.generation())
    assert small.statistics().cached == 1  # emptied before the third
    with pytest.raises(ValueError, match="^seconds must be >= 0$"):
        OwnerCache(-1)
