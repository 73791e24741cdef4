"""The memory feature: long-term facts about each user, a summary per user, and the
extraction state of sessions (``docs/memory.md``).

It owns its tables (the ``memory`` migration set, ``schema.py``, and the change log's,
``changes.py``), registers the ``memory.*`` tools and the ``/memory`` routes when ``[memory]
enabled`` (the tables exist either way), offers the ``memory`` topic on the gateway (every
change to a user's memory, pushed to that user's WebSockets), and forgets a deleted session's
extraction state. At start-up it decides, once, how search runs on this backend and logs it.
It injects each user's summary into their turns from a cache (``injection.py``) that memory
tells of every write; with several nodes, it listens for what the others write
(``notices.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from turnstile.actors.feature import NodeContext
from turnstile.actors.memory.changes import CHANGES, TOPIC, ChangeLog
from turnstile.actors.memory.embeddings import resolve_embedder
from turnstile.actors.memory.extraction import Extractor, start_extraction
from turnstile.actors.memory.injection import SummaryCache
from turnstile.actors.memory.routes import memory_routes
from turnstile.actors.memory.schema import MEMORY
from turnstile.actors.memory.service import Memory
from turnstile.actors.memory.settings import MemoryConfig
from turnstile.actors.memory.tools import register_memory_tools
from turnstile.actors.sessions.agents import Agent
from turnstile.runtime.gateway.routes import HttpRoute

__all__ = ["MemoryFeature"]


class MemoryFeature:
    """``[memory]``; uses nothing the other features set when they start. Its work (the search
    backfill, the extraction sweep) begins in ``open``.

    Attributes:
        memory: the service, once started (None before, or when disabled).
        summaries: the cached summaries injected into every turn (``injection``).
        extraction_model: the agent extraction asks (tests); None uses ``[openai]``.
        extractor: the running extraction sweep (None when extraction is off).
    """

    name = "memory"
    needs: tuple[str, ...] = ("sessions",)
    after: tuple[str, ...] = ()
    migrations = [MEMORY, CHANGES]

    def __init__(self) -> None:
        self.memory: Memory | None = None
        self.summaries: SummaryCache | None = None
        self.extraction_model: Agent | None = None
        self.extractor: Extractor | None = None

    async def start(self, node: NodeContext) -> None:
        config = node.section("memory", MemoryConfig)
        if not config.enabled:
            return
        chat_url = node.config.openai.get("base_url")  # the reference's fallback address
        embedder = resolve_embedder(config.embeddings, chat_url)
        topics = node.topics
        changes = ChangeLog(
            node.store,
            config.changes_kept,
            lambda owner, events: topics.publish(owner, TOPIC, events),
        )
        topics.register(TOPIC, changes)
        self.memory = memory = Memory(node.store, node.clock, config, embedder, changes)
        await memory.start()
        register_memory_tools(node.tools, memory)
        node.hooks.on_session_end.append(memory.end_session)
        # the cache subscribes to memory: every write, here or (listening) elsewhere, tells it
        self.summaries = summaries = SummaryCache(memory, ttl=config.summary_cache_seconds)
        node.hooks.turn_context.append(summaries.turn_context)
        if node.membership is not None:  # other nodes share the store: hear what they write
            node.start_soon(memory.listen, name="memory listener")

    async def open(self, node: NodeContext) -> None:
        """The search backfill (facts from before the per-user search tokens; searches read
        them meanwhile) and the extraction sweep begin."""
        memory = self.memory
        if memory is None:
            return
        if memory.unindexed:
            node.start_soon(memory.index_unindexed, name="memory search backfill")
        self.extractor = start_extraction(node, memory, self.extraction_model)

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        if self.memory is None:
            return []
        return memory_routes(node, self.memory, self.extractor)
