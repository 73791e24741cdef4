"""The memory feature's config section: ``[memory]``, long-term facts about each user.

Example::

    [memory]
    enabled = true
    search_limit = 15          # what memory.search returns when no limit is given
    max_search_limit = 50      # the most a search or a page may ask for
    max_facts_per_user = 10000
    max_value_chars = 2000
    max_summary_chars = 8000
    admins = ["ada"]           # users with memory.read_all: may list every user's facts
    extraction = true          # learn facts from idle sessions (needs a model server)
    stale_after_minutes = 30   # a session idle this long is extracted
    extraction_interval_seconds = 300  # how often idle sessions are looked for
    changes_kept = 20000       # change-log events kept per user (GET /memory/changes)
    summary_cache_seconds = 60  # a user's injected summary is read again at least this often

    [memory.embeddings]
    kind = "ollama"            # or "openai" (any OpenAI-compatible /v1/embeddings)
    base_url = "http://127.0.0.1:11434"   # empty: the chat server's ([openai] base_url)
    model = "nomic-embed-text"  # empty: no embedder, lexical search only
    api_key = ""
    dimensions = 768           # empty: asked of the embedder at start-up
    max_distance = 0.3         # cosine distance cutoff of the vector stage
    timeout = 30.0
    batch_size = 32
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "HARD_MAX_LIMIT",
    "HARD_MAX_SUMMARY_CHARS",
    "HARD_MAX_VALUE_CHARS",
    "EmbeddingsConfig",
    "MemoryConfig",
]

#: Bounds the config itself cannot exceed (the tool's parameter types carry them too).
HARD_MAX_LIMIT = 500
HARD_MAX_VALUE_CHARS = 8000
HARD_MAX_SUMMARY_CHARS = 64_000


class EmbeddingsConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[memory.embeddings]``: the embedding server, separate from the chat model.

    Attributes:
        kind: ``openai`` (``POST {base_url}/embeddings``) or ``ollama``
            (``POST {base_url}/api/embed``).
        base_url: the server; empty falls back to ``[openai] base_url`` (the reference's rule).
        model: the embedding model; empty means no embedder: lexical search only.
        api_key: sent as a bearer token; never logged.
        dimensions: the model's vector size; unset, it is asked of the embedder at start-up
            (one request). PostgreSQL's ``vector(N)`` column takes it.
        max_distance: the vector stage returns only facts within this cosine distance of the
            query (the reference's 0.3, set for nomic-embed-text; smaller models need more).
        timeout: seconds per request.
        batch_size: texts per request (backfill).
    """

    kind: Literal["openai", "ollama"] = "openai"
    base_url: str = ""
    model: str = ""
    api_key: str = ""
    dimensions: Annotated[int, msgspec.Meta(ge=1, le=16000)] | None = None
    max_distance: Annotated[float, msgspec.Meta(gt=0, le=2)] = 0.3
    timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=2048)] = 32


class MemoryConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[memory]``.

    Attributes:
        enabled: register the memory tools and routes (the tables are created either way, so
            turning it off and on again loses nothing).
        search_limit: results of a search that names no limit (the reference's 15).
        max_search_limit: the most results a search, or facts a page of the list, may ask for.
        max_facts_per_user: facts one user may have; saving a new key beyond it is refused
            (``limit_exceeded``); updating an existing key always works.
        max_value_chars: the longest fact value.
        max_summary_chars: the longest per-user summary.
        admins: user names holding ``memory.read_all``: they may list every user's facts
            (``GET /memory/facts?all_users=true``). Nobody else ever sees another's facts.
        extraction: extract facts from sessions idle for ``stale_after_minutes``
            (``extraction.py``); off anyway without a model server.
        stale_after_minutes: how long a session must be idle before it is extracted.
        extraction_interval_seconds: seconds between two looks for idle sessions.
        changes_kept: events the change log keeps per user (``changes.py``); beyond it the
            oldest go, and a client that had not seen them must reload (``reset``).
        summary_cache_seconds: how long a node keeps a user's summary for injection at most
            (``injection.py``). Writes drop it at once, on every node that hears of them; this
            bounds how stale it can get when a node did not hear (a lost notification, a
            write from outside). 0: every turn start reads it.
        embeddings: ``[memory.embeddings]``, the embedder of the vector search stage.
        vector_cache_mb: (SQLite) how much memory the vector stage may keep its users'
            embedding matrices in (``vector_cache``): 100,000 facts of 384 dimensions take
            about 150 MB; 0 reads them from the store at every search.
    """

    enabled: bool = True
    search_limit: Annotated[int, msgspec.Meta(ge=1, le=HARD_MAX_LIMIT)] = 15
    max_search_limit: Annotated[int, msgspec.Meta(ge=1, le=HARD_MAX_LIMIT)] = 50
    max_facts_per_user: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 10_000
    max_value_chars: Annotated[int, msgspec.Meta(ge=1, le=HARD_MAX_VALUE_CHARS)] = 2000
    max_summary_chars: Annotated[int, msgspec.Meta(ge=1, le=HARD_MAX_SUMMARY_CHARS)] = 8000
    admins: list[str] = msgspec.field(default_factory=list)
    extraction: bool = True
    stale_after_minutes: Annotated[int, msgspec.Meta(ge=1, le=10_080)] = 30
    extraction_interval_seconds: Annotated[float, msgspec.Meta(ge=1, le=86_400)] = 300.0
    changes_kept: Annotated[int, msgspec.Meta(ge=10, le=10_000_000)] = 20_000
    summary_cache_seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 60.0
    embeddings: EmbeddingsConfig = msgspec.field(default_factory=EmbeddingsConfig)
    vector_cache_mb: Annotated[int, msgspec.Meta(ge=0, le=65_536)] = 256

    def __post_init__(self) -> None:
        if self.search_limit > self.max_search_limit:
            raise ValueError("search_limit must be <= max_search_limit")
