"""Memory facts round-trip on both backends with any data (issue 23, 'Any data'): a fact's
category, key, value and source context holding U+0000 or the store's escape character are
read back as saved (``runtime/store/escaping.py``; on PostgreSQL through the connections'
``text`` codec: memory's queries are unchanged), and a fact is found by a search for its word."""

from __future__ import annotations

import itertools

import trio
from hypothesis import given
from hypothesis import strategies as st

from tests.actors.memory.test_memory_queries import open_memory
from tests.runtime.store.test_any_data import _TRICKY, NAME, SETTINGS, TEXT


def _kept(text: str) -> bool:
    return bool(text.strip())


async def test_facts_round_trip(backend, clock):
    async with open_memory(backend, clock, max_facts_per_user=10_000) as memory:
        owners = itertools.count()

        @SETTINGS
        @given(
            category=NAME.filter(_kept),
            key=NAME.filter(_kept),
            value=st.text(
                st.one_of(_TRICKY, st.characters(blacklist_categories=("Cs",))),
                min_size=1,
                max_size=200,
            ).filter(_kept),
            context=TEXT,
        )
        def prop(category, key, value, context):
            owner = f"u{next(owners)}"

            async def run():
                saved = await memory.save(
                    owner, category=category, key=key, value=value, source_context=context
                )
                want = (category.strip(), key.strip(), value.strip(), context or None)
                assert (saved.category, saved.key, saved.value, saved.source_context) == want
                (listed,), _ = await memory.list_facts(owner)
                assert (listed.category, listed.key, listed.value, listed.source_context) == want

            trio.from_thread.run(run)

        await trio.to_thread.run_sync(prop)


async def test_a_fact_with_nul_is_found_by_its_words(backend, clock):
    async with open_memory(backend, clock) as memory:
        await memory.save("ada", category="web", key="page", value="zebra\x00crossing \ufdd0 here")
        (found,) = await memory.search("ada", "zebra")
        assert found.value == "zebra\x00crossing \ufdd0 here"
