"""``Memory``: what the tools and routes call, over the feature's queries.

It applies the rules the queries do not know: the config's limits, the reference's confidence
defaults, expiry as days from now, the search order (stages merged without duplicates), and
who may read whose facts.

Confidence (``../shared/reference/memory.md``). A save without a confidence gets the one the
reference's extractor gives its source: ``tool_call`` and ``auto_discovery`` 95,
``user_explicit`` 90, anything else (``conversation``) 70. The tool's guidance gives the model
the reference's scale for choosing one itself: tool output 95, user statement 80, web 50,
guess 30. On a second save of the same ``(category, key)`` the reference's ``upsert_fact``
simply updates: the new value, source, confidence, expiry and context replace the old ones
(``created_at`` stays; ``updated_at`` and ``last_verified_at`` move). There is no "keep the
higher confidence" rule in the reference, so there is none here.

Embeddings. With an embedder (``[memory.embeddings]``), a save embeds ``"category / key:
value"`` before writing and stores the vector with the fact; a search embeds the query and runs
the vector stage (facts within ``max_distance``, nearest first) before the lexical one. The
embedder failing never fails either: the fact is saved without a vector (``backfill`` embeds it
later) and the search is lexical only. After a failure, saves and searches leave the embedder
alone for ``RETRY_AFTER`` seconds; the first failure is a warning, the rest are debug lines.

Changes. With a change log (``changes.py``; the node's feature always gives one), every write
(save, forget, summary, deleting a user) appends its events to the owner's log in the same
transaction and publishes them on the ``memory`` topic once committed, one write per owner at a
time so they are published in order.

Copies. Whoever keeps a copy of memory's rows (the summary cache) subscribes
(``Memory.subscribe``) and is told after every write which user's memory changed and what of
it (``notices.UserChanged``). With a change log, setting a summary and deleting a user also
announce it to the other nodes on the same database, in the write's transaction; ``listen``
hears theirs and tells the subscribers the same way (``notices.py``).

It is over 400 lines because every write (save, forget, summary, deleting a user) goes through the
same rules in order: the limits, the embedder and its backoff, the change log in the write's
transaction, publishing in order per owner, the subscribers told; they share the class's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import trio

from turnstile.actors.memory.account_queries import (
    DELETE_USER,
    END_SESSION,
    EXTRACTED_AT,
    GET_SUMMARY,
    LIST,
    MARK_EXTRACTED,
    SET_SUMMARY,
)
from turnstile.actors.memory.changes import (
    DELETE_USER_LOGGED,
    FORGET_LOGGED,
    SAVE_LOGGED,
    SET_SUMMARY_LOGGED,
    ChangeLog,
)
from turnstile.actors.memory.embeddings import Embedder, EmbeddingError, fact_text
from turnstile.actors.memory.notices import CHANNEL, Notices, Subscriber, announcement
from turnstile.actors.memory.queries import (
    DETECT,
    FORGET,
    INDEX_UNINDEXED,
    SAVE,
    SORT_KEYS,
    UNINDEXED,
    Fact,
    SearchPath,
    Summary,
    VectorPath,
)
from turnstile.actors.memory.search_queries import SEARCH
from turnstile.actors.memory.settings import MemoryConfig
from turnstile.actors.memory.stages import both, merge
from turnstile.actors.memory.state_queries import (
    EXTRACTION_STATE,
    SessionState,
)
from turnstile.actors.memory.vector_cache import VectorCache
from turnstile.actors.memory.vector_queries import (
    MISSING_EMBEDDINGS,
    SET_EMBEDDINGS,
    VECTOR_SEARCH,
    VECTOR_SETUP,
)
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.store import Store

__all__ = ["DEFAULT_CONFIDENCE", "INDEX_BATCH", "RETRY_AFTER", "SOURCES", "Memory"]

log = logging.getLogger("turnstile.memory")

SOURCES = ("conversation", "tool_call", "auto_discovery", "user_explicit")

#: The reference extractor's confidence by source; ``conversation`` gets its default, 70.
DEFAULT_CONFIDENCE = {"tool_call": 95, "auto_discovery": 95, "user_explicit": 90}
_OTHER_CONFIDENCE = 70

#: Seconds during which saves and searches skip an embedder that just failed (they store
#: without a vector and search lexically), so an unresponsive one costs one timeout, not one
#: per call; a backfill always tries, and its success ends the pause.
RETRY_AFTER = 30.0

#: Facts given their search tokens per transaction by ``Memory.index_unindexed``.
INDEX_BATCH = 2000


def default_confidence(source: str) -> int:
    """The confidence a fact from ``source`` gets when the caller names none."""
    return DEFAULT_CONFIDENCE.get(source, _OTHER_CONFIDENCE)


class Memory:
    """Long-term facts about users, their summaries and the extraction state of sessions.

    Args:
        store: the node's store (the ``memory`` migration set applied).
        clock: its wall time dates rows and decides expiry.
        config: ``[memory]``.
        embedder: the embedding client (``embeddings.resolve_embedder``); None: lexical only.
        changes: the change log (``changes.py``): every write then also appends its events and
            publishes them once committed (the node's feature gives one; None: writes are not
            logged, for a store opened with the ``memory`` set alone).
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        config: MemoryConfig,
        embedder: Embedder | None = None,
        changes: ChangeLog | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.embedder = embedder
        self.changes = changes
        #: decided by ``start``; ``fts5`` until then on SQLite, ``tsvector`` on PostgreSQL.
        self.search_path = SearchPath("fts5" if store.backend == "sqlite" else "tsvector")
        #: facts without search tokens at ``start`` (written before migration 5), which
        #: ``index_unindexed`` gives them
        self.unindexed = 0
        #: decided by ``start``: how embeddings are stored and searched (``none`` until then).
        self.vector_path = VectorPath("none", why="not started")
        #: when the embedder started failing (``trio.current_time()``), and when saves and
        #: searches try it again
        self._failing_since: float | None = None
        self._retry_at = 0.0
        #: who is told of each write (``subscribe``, ``listen``)
        self.notices = Notices()

    async def start(self) -> SearchPath:
        """Decide the lexical and the vector search paths (creating pg_trgm, pgvector, the
        vector column and the indexes where possible) and log each once; count the facts
        whose search tokens are not written yet (``unindexed``: the caller then runs
        ``index_unindexed``, the node's feature in the background)."""
        self.search_path = await self.store.run(DETECT)
        log.info("memory search: %s", self.search_path.describe())
        if self.search_path.missing:
            log.warning(
                "memory search: could not create index %s: searches of a user with many facts"
                " are slower (see docs/memory.md, 'Search at scale')",
                ", ".join(self.search_path.missing),
            )
        self.unindexed = await self.store.run(UNINDEXED)
        if self.unindexed:
            log.info(
                "memory search: %d facts from before the search tokens (migration 5) are not"
                " indexed yet; until they are, a search reads its user's such facts directly",
                self.unindexed,
            )
        dimensions = None
        if self.embedder is None:
            log.info("memory embeddings: no embedder configured: lexical search only")
        else:
            dimensions = self.embedder.dimensions
            if dimensions is None:
                try:
                    dimensions = (await self.embedder.embed(["dimension probe"])).shape[1]
                except EmbeddingError as exc:
                    log.warning(
                        "memory embeddings: cannot ask the embedder its dimension (%s); set"
                        " [memory.embeddings] dimensions: lexical search only until restart",
                        exc,
                    )
                    self.embedder = None
        path = await self.store.run(VECTOR_SETUP, dimensions=dimensions)
        if path.kind == "numpy" and self.config.vector_cache_mb:
            path = replace(path, cache=VectorCache(self.config.vector_cache_mb * 2**20))
        self.vector_path = path
        if self.embedder is not None:
            cutoff = f", max distance {self.config.embeddings.max_distance}"
            log.info(
                "memory embeddings: %s; vector search: %s%s",
                self.embedder.describe(),
                path.describe(),
                cutoff if path.kind != "none" else "",
            )
        if path.kind == "none":
            self.embedder = None
        if path.reset:
            log.warning(
                "memory embeddings: the dimension changed to %s: every stored embedding was"
                " dropped; run `turnstile memory backfill`",
                path.dimensions,
            )
        return self.search_path

    async def index_unindexed(self, batch_size: int = INDEX_BATCH) -> int:
        """Write the search tokens of every fact that has none (a database from before
        migration 5), ``batch_size`` a transaction, and log how many; safe to run again and
        beside searches and saves (a save writes its fact's tokens itself). Returns how many
        facts it indexed."""
        done, after, started = 0, 0, trio.current_time()
        while after is not None:
            n, after = await self.store.run(INDEX_UNINDEXED, after=after, limit=batch_size)
            done += n
        if done:
            log.info(
                "memory search: indexed %d facts from before the search tokens in %.1f s",
                done,
                trio.current_time() - started,
            )
        self.unindexed = 0
        return done

    async def _embed(self, texts: list[str], what: str) -> Any:
        """The texts' vectors, or None when there is no embedder or it failed (logged)."""
        if self.embedder is None:
            return None
        if self._failing_since is not None and trio.current_time() < self._retry_at:
            return None  # it failed a moment ago: do not make every call wait for it
        try:
            vectors = await self.embedder.embed(texts)
        except EmbeddingError as exc:
            # a warning when it starts failing, then quietly: an outage must not flood the log
            level = logging.DEBUG if self._failing_since is not None else logging.WARNING
            self._failing_since = self._failing_since or trio.current_time()
            self._retry_at = trio.current_time() + RETRY_AFTER
            log.log(level, "memory embeddings: %s without a vector: %s", what, exc)
            return None
        self._answered()
        return vectors

    def _answered(self) -> None:
        if self._failing_since is not None:
            self._failing_since = None
            log.info("memory embeddings: the embedder answers again")

    def _now(self) -> datetime:
        return self.clock.now()

    def is_admin(self, user: str) -> bool:
        """Whether ``user`` holds ``memory.read_all``."""
        return user in self.config.admins

    # ---- who keeps a copy ----

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call ``subscriber(notice)`` after every write of a user's memory from now on: this
        node's (``UserChanged``, once the write ended, whether it committed, failed or was
        cancelled) and, while ``listen`` runs, what the other nodes announce (``UserChanged``
        for a summary set or a user deleted; ``AllChanged`` when announcements may have been
        missed). A subscriber must not block; one that raises is logged.

        Returns:
            a function that ends the subscription.
        """
        return self.notices.subscribe(subscriber)

    async def listen(self) -> None:
        """Hear the other nodes' announcements and tell the subscribers, forever (cancel to
        stop); after every (re)connection they are told ``AllChanged``. On SQLite (one node)
        that is all it does."""
        await self.store.listen(CHANNEL, self.notices.heard)

    # ---- facts ----

    async def save(
        self,
        owner: str,
        *,
        category: str,
        key: str,
        value: str,
        source: str = "conversation",
        confidence: int | None = None,
        expires_days: int | None = None,
        source_context: str | None = None,
    ) -> Fact:
        """Insert or update ``owner``'s fact ``(category, key)``.

        Raises:
            InvalidArgument: empty category or key, a value over ``max_value_chars``, an
                unknown source, a confidence outside 0–100 (``field`` names it).
            LimitExceeded: a new key beyond ``max_facts_per_user``.
        """
        category, key, value = category.strip(), key.strip(), value.strip()
        for name, text in (("category", category), ("key", key), ("value", value)):
            if not text:
                raise InvalidArgument(f"{name} must not be empty", field=name)
        if len(value) > self.config.max_value_chars:
            raise InvalidArgument(
                f"value must be at most {self.config.max_value_chars} characters", field="value"
            )
        if source not in SOURCES:
            raise InvalidArgument(f"source must be one of {', '.join(SOURCES)}", field="source")
        if confidence is None:
            confidence = default_confidence(source)
        elif not 0 <= confidence <= 100:
            raise InvalidArgument("confidence must be 0-100", field="confidence")
        now = self._now()
        expires_at = None
        if expires_days is not None:
            if expires_days < 1:
                raise InvalidArgument("expires_days must be >= 1", field="expires_days")
            expires_at = self.store.db_time(now + timedelta(days=expires_days))
        fact: dict[str, Any] = {
            "category": category,
            "key": key,
            "value": value,
            "source": source,
            "confidence": confidence,
            "expires_at": expires_at,
            "source_context": source_context or None,
            "embedding": None,
        }
        vectors = await self._embed([fact_text(category, key, value)], "fact saved")
        if vectors is not None:
            fact["embedding"] = vectors[0]
        args = {
            "owner": owner,
            "fact": fact,
            "now": self.store.db_time(now),
            "max_facts": self.config.max_facts_per_user,
            "vector": self.vector_path,
        }
        with self.notices.telling(owner, "facts"):
            if self.changes is not None:
                return await self.changes.write(SAVE_LOGGED, **args)
            return await self.store.run(SAVE, **args)

    def check_limit(self, limit: int | None, *, default: int | None = None) -> int:
        """``limit`` or the default, checked against ``max_search_limit``.

        Raises:
            InvalidArgument: below 1 or above the maximum (``field="limit"``).
        """
        if limit is None:
            return default if default is not None else self.config.search_limit
        if not 1 <= limit <= self.config.max_search_limit:
            raise InvalidArgument(f"limit must be 1-{self.config.max_search_limit}", field="limit")
        return limit

    async def search(self, owner: str, query: str, limit: int | None = None) -> list[Fact]:
        """``owner``'s facts matching ``query``, best first, never expired, each once.

        The stages' results come in the reference's order: the vector stage's (with an
        embedder: facts within ``max_distance`` of the query, nearest first), then the lexical
        one's (FTS5 bm25 on SQLite, tsvector stages on PostgreSQL, both over the user's own
        tokens); ``merge`` keeps the first occurrence of each fact. The two run at once (the
        lexical stage needs no embedding, so it also overlaps the embedder's answer): a search
        takes the longer of them, not their sum. An embedder that fails leaves the lexical
        stage alone.

        Raises:
            InvalidArgument: a limit outside 1–``max_search_limit``.
        """
        limit = self.check_limit(limit)
        now = self.store.db_time(self._now())
        found: dict[str, list[Fact]] = {"vector": [], "lexical": []}

        async def vector() -> None:
            vectors = await self._embed([query], "search") if query.strip() else None
            if vectors is not None:
                found["vector"] = await self.store.run(
                    VECTOR_SEARCH,
                    owner=owner,
                    vector=vectors[0],
                    now=now,
                    limit=limit,
                    max_distance=self.config.embeddings.max_distance,
                    path=self.vector_path,
                )

        async def lexical() -> None:
            found["lexical"] = await self.store.run(
                SEARCH, owner=owner, query=query, now=now, limit=limit, path=self.search_path
            )

        await both(vector, lexical)
        return merge([found["vector"], found["lexical"]], limit)

    async def forget(self, owner: str, key: str, category: str | None = None) -> int:
        """Delete ``owner``'s facts with ``key`` (in ``category`` if given); how many went."""
        category = None if category is None else category.strip()
        with self.notices.telling(owner, "facts"):
            if self.changes is not None:
                now = self.store.db_time(self._now())
                return await self.changes.write(
                    FORGET_LOGGED, owner=owner, key=key.strip(), category=category, now=now
                )
            return await self.store.run(FORGET, owner=owner, key=key.strip(), category=category)

    async def list_facts(
        self,
        owner: str | None,
        *,
        limit: int | None = None,
        offset: int = 0,
        search: str | None = None,
        sort_by: str = "category",
        sort_order: str = "desc",
        category: str | None = None,
    ) -> tuple[list[Fact], int]:
        """A page of facts (``owner=None``: every user's; the caller checks ``is_admin``)
        and how many match in all. Sorted as the reference's ``get_all_facts``: by category,
        descending, unless told otherwise. ``category`` keeps only that category's facts
        (exactly, as saved: surrounding spaces are stripped).

        Raises:
            InvalidArgument: a bad limit, offset, sort key or order (``field`` names it).
        """
        limit = self.check_limit(limit, default=self.config.max_search_limit)
        if offset < 0:
            raise InvalidArgument("offset must be >= 0", field="offset")
        if sort_by not in SORT_KEYS:
            raise InvalidArgument(f"sort_by must be one of {', '.join(SORT_KEYS)}", "sort_by")
        if sort_order not in ("asc", "desc"):
            raise InvalidArgument("sort_order must be asc or desc", field="sort_order")
        return await self.store.run(
            LIST,
            owner=owner,
            now=self.store.db_time(self._now()),
            limit=limit,
            offset=offset,
            search=search or None,
            sort_by=sort_by,
            sort_order=sort_order,
            category=None if category is None else category.strip(),
        )

    # ---- summary ----

    async def get_summary(self, owner: str) -> Summary | None:
        """``owner``'s summary, if one was set."""
        return await self.store.run(GET_SUMMARY, owner=owner)

    async def set_summary(self, owner: str, content: str) -> Summary:
        """Replace ``owner``'s summary.

        Raises:
            InvalidArgument: longer than ``max_summary_chars``.
        """
        if len(content) > self.config.max_summary_chars:
            raise InvalidArgument(
                f"content must be at most {self.config.max_summary_chars} characters",
                field="content",
            )
        now = self.store.db_time(self._now())
        with self.notices.telling(owner, "summary") as notice:
            if self.changes is not None:
                return await self.changes.write(
                    SET_SUMMARY_LOGGED,
                    owner=owner,
                    content=content,
                    now=now,
                    announce=announcement(notice),
                )
            return await self.store.run(SET_SUMMARY, owner=owner, content=content, now=now)

    # ---- extraction state ----

    async def mark_extracted(self, session_key: str, at: datetime | None = None) -> None:
        """Record that ``session_key`` was processed by extraction (at ``at``, default now)."""
        when = self.store.db_time(at if at is not None else self._now())
        await self.store.run(MARK_EXTRACTED, session_key=session_key, at=when)

    async def extracted_at(self, session_key: str) -> datetime | None:
        """When ``session_key`` was last processed, or None."""
        return await self.store.run(EXTRACTED_AT, session_key=session_key)

    @property
    def stale_after(self) -> timedelta:
        """How long a session must be idle before extraction takes it."""
        return timedelta(minutes=self.config.stale_after_minutes)

    async def extraction_state(
        self,
        owner: str | None,
        *,
        after: str | None = None,
        limit: int = 100,
        due: bool | None = None,
    ) -> tuple[list[SessionState], datetime]:
        """Sessions by key after ``after``, with their last activity and extraction time
        (``owner=None``: every user's; the caller checks ``is_admin``); ``due`` keeps only
        the sessions the sweep would (True) or would not (False) take now.

        Returns:
            the sessions and the cut-off they were judged against (``now - stale_after``):
            a session is due when its ``updated_at`` is before it and it was not extracted
            since.
        """
        cutoff = self._now() - self.stale_after
        sessions = await self.store.run(
            EXTRACTION_STATE,
            owner=owner,
            cutoff=self.store.db_time(cutoff),
            after=after,
            due=due,
            limit=limit,
        )
        return sessions, cutoff

    async def end_session(self, session_key: str) -> None:
        """Forget a deleted session's extraction state (a ``hooks.on_session_end``)."""
        await self.store.run(END_SESSION, session_key=session_key)

    # ---- embeddings ----

    async def backfill(
        self, batch_size: int | None = None, *, everything: bool = False
    ) -> dict[str, int]:
        """Embed every user's unexpired facts that have no embedding (or one of another
        dimension), ``batch_size`` at a time; safe to run again (it finds nothing to do).
        ``everything=True`` embeds every unexpired fact anew (after changing to a model of
        the same dimension, whose old vectors cannot be told apart).

        Returns:
            ``{"embedded": n, "remaining": m}``: facts given a vector, and facts still
            without one (a value changed meanwhile; a fact saved during the run).

        Raises:
            EmbeddingError: the embedder failed (what was embedded before stays).
            RuntimeError: no embedder, or no vector storage on this backend.
        """
        if self.embedder is None or self.vector_path.kind == "none":
            raise RuntimeError(f"no vector search on this node: {self.vector_path.describe()}")
        batch_size = batch_size or self.config.embeddings.batch_size
        dimensions = self.vector_path.dimensions
        embedded, after = 0, 0
        while True:
            rows = await self.store.run(
                MISSING_EMBEDDINGS,
                after=after,
                limit=batch_size,
                dimensions=dimensions,
                now=self.store.db_time(self._now()),
                everything=everything,
            )
            if not rows:
                break
            vectors = await self.embedder.embed([fact_text(c, k, v) for _, c, k, v in rows])
            self._answered()
            embedded += await self.store.run(
                SET_EMBEDDINGS,
                rows=[(r[0], r[3], vec) for r, vec in zip(rows, vectors, strict=True)],
                path=self.vector_path,
            )
            after = rows[-1][0]
        remaining = await self.store.run(
            MISSING_EMBEDDINGS,
            after=0,
            limit=0,
            dimensions=dimensions,
            now=self.store.db_time(self._now()),
            count=True,
        )
        return {"embedded": embedded, "remaining": remaining}

    # ---- a user's data ----

    async def delete_user(self, owner: str) -> dict[str, int]:
        """Delete everything memory holds about ``owner``: facts, summary, their sessions'
        extraction state. Returns the rows deleted by kind. With a change log, the user's log
        keeps only the ``memory_deleted`` event (counts, no content), and the other nodes are
        told to forget their copies (``notices.py``)."""
        with self.notices.telling(owner, "deleted") as notice:
            if self.changes is not None:
                now = self.store.db_time(self._now())
                return await self.changes.write(
                    DELETE_USER_LOGGED, owner=owner, now=now, announce=announcement(notice)
                )
            return await self.store.run(DELETE_USER, owner=owner)
