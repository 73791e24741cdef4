"""The embedding client: turns fact texts and queries into vectors, over HTTP.

Two server shapes, chosen by ``[memory.embeddings] kind``:

* ``openai``: any OpenAI-compatible server, ``POST {base_url}/embeddings`` with
  ``{"model", "input": [...]}``, answered ``{"data": [{"index", "embedding"}, ...]}``;
  ``base_url`` is the API root (``http://host:port/v1``), as the chat agent's.
* ``ollama``: ``POST {base_url}/api/embed`` with ``{"model", "input": [...]}``, answered
  ``{"embeddings": [[...], ...]}``; ``base_url`` is the server (``http://host:11434``; a
  trailing ``/v1``, as in a chat URL it fell back to, is dropped).

Every vector is L2-normalised here (cosine distance is unchanged by it), so the SQLite path
compares with a dot product. A fact is embedded as ``"category / key: value"``
(:func:`fact_text`): the category gives a short value the context a query asks about
("which drink…" is closer to ``food and drink / coffee: dark roast`` than to
``coffee: dark roast`` alone).

Errors (all :class:`EmbeddingError`, a ``TurnstileError``)::

    EmbeddingError
    ├── EmbedderUnavailable   cannot connect, timed out, 429 or 5xx: try again later
    ├── EmbedderRejected      any other 4xx: the request or the config is wrong (model name)
    └── BadEmbedding          an answer that is not the vectors asked for (shape, dimension)

The API key is sent as a bearer token and never logged or put in an error message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx

from turnstile.actors.memory.settings import EmbeddingsConfig
from turnstile.runtime.errors import TurnstileError

if TYPE_CHECKING:  # numpy is imported where vectors are made (~0.1 s a process otherwise)
    import numpy as np

__all__ = [
    "BadEmbedding",
    "Embedder",
    "EmbedderRejected",
    "EmbedderUnavailable",
    "EmbeddingError",
    "fact_text",
    "resolve_embedder",
]

log = logging.getLogger("turnstile.memory")


class EmbeddingError(TurnstileError):
    """The embedder could not turn texts into vectors."""

    code = "embedding_error"


class EmbedderUnavailable(EmbeddingError):
    """Cannot connect, timed out, or the server answered 429 or 5xx."""

    code = "embedder_unavailable"


class EmbedderRejected(EmbeddingError):
    """The server refused the request (a 4xx other than 429): a wrong model name, a bad key."""

    code = "embedder_rejected"


class BadEmbedding(EmbeddingError):
    """The answer is not one vector per text, of the expected dimension."""

    code = "bad_embedding"


def fact_text(category: str, key: str, value: str) -> str:
    """The text a fact is embedded as: ``"category / key: value"``."""
    return f"{category} / {key}: {value}"


class Embedder:
    """An embedding server, called over HTTP (one short-lived client per call).

    Args:
        kind: ``openai`` or ``ollama``.
        base_url: the server (see the module docstring).
        model: the model name sent with every request.
        api_key: sent as ``Authorization: Bearer``; empty for none.
        dimensions: the vector size expected (None: whatever the first answer has).
        timeout: seconds for each request.
        batch_size: texts per request.
        transport: an httpx transport (tests).
    """

    def __init__(
        self,
        *,
        kind: str,
        base_url: str,
        model: str,
        api_key: str = "",
        dimensions: int | None = None,
        timeout: float = 30.0,
        batch_size: int = 32,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if kind not in ("openai", "ollama"):
            raise ValueError("kind must be openai or ollama")
        base_url = base_url.rstrip("/")
        if kind == "ollama":
            base_url = base_url.removesuffix("/v1")
        self.kind = kind
        self.base_url = base_url
        self.model = model
        self._api_key = api_key
        self.dimensions = dimensions
        self.timeout = timeout
        self.batch_size = batch_size
        self._transport = transport

    def __repr__(self) -> str:
        return f"Embedder(kind={self.kind!r}, base_url={self.base_url!r}, model={self.model!r})"

    def describe(self) -> str:
        """One line for the start-up log (no key)."""
        return f"{self.kind} model {self.model!r} at {self.base_url}, {self.dimensions} dimensions"

    @property
    def url(self) -> str:
        return (
            f"{self.base_url}/embeddings" if self.kind == "openai" else f"{self.base_url}/api/embed"
        )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One L2-normalised float32 vector per text (shape ``[len(texts), dimensions]``),
        ``batch_size`` texts per request.

        Raises:
            EmbedderUnavailable, EmbedderRejected, BadEmbedding: see the module docstring.
        """
        import numpy as np

        if not texts:
            return np.zeros((0, self.dimensions or 0), dtype=np.float32)
        parts = []
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        async with httpx.AsyncClient(
            timeout=self.timeout, transport=self._transport, headers=headers
        ) as client:
            for start in range(0, len(texts), self.batch_size):
                batch = list(texts[start : start + self.batch_size])
                parts.append(await self._request(client, batch))
        vectors = np.concatenate(parts)
        if self.dimensions is None:
            self.dimensions = vectors.shape[1]
        elif vectors.shape[1] != self.dimensions:
            raise BadEmbedding(
                f"embedder returned {vectors.shape[1]} dimensions, expected {self.dimensions}"
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.all(norms > 0):
            raise BadEmbedding("embedder returned a zero vector")
        return (vectors / norms).astype(np.float32)

    async def _request(self, client: httpx.AsyncClient, batch: list[str]) -> np.ndarray:
        try:
            response = await client.post(self.url, json={"model": self.model, "input": batch})
        except httpx.TimeoutException:
            raise EmbedderUnavailable(f"embedder at {self.base_url} timed out") from None
        except httpx.HTTPError as exc:
            raise EmbedderUnavailable(
                f"cannot reach the embedder at {self.base_url}: {type(exc).__name__}"
            ) from None
        status = response.status_code
        if status == 429 or status >= 500:
            raise EmbedderUnavailable(f"embedder at {self.base_url} answered {status}")
        if status != 200:
            raise EmbedderRejected(
                f"embedder at {self.base_url} refused the request ({status}): {response.text[:200]}"
            )
        try:
            return _vectors(self.kind, response.json(), len(batch))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadEmbedding(f"embedder answer is not {len(batch)} vectors: {exc}") from None


def _vectors(kind: str, body: Any, n: int) -> np.ndarray:
    if kind == "openai":
        rows = sorted(body["data"], key=lambda item: item["index"])
        vectors = [row["embedding"] for row in rows]
    else:
        vectors = body["embeddings"]
    import numpy as np

    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] != n or array.shape[1] == 0:
        raise ValueError(f"shape {array.shape}")
    return array


def resolve_embedder(
    config: EmbeddingsConfig,
    chat_base_url: str | None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Embedder | None:
    """The embedder ``[memory.embeddings]`` describes, or None when none is configured.

    An empty ``base_url`` falls back to the chat server's (``[openai] base_url``), the
    reference's rule; no ``model``, or no address at all, is no embedder (lexical search only).
    """
    base_url = config.base_url or chat_base_url or ""
    if not config.model or not base_url:
        return None
    return Embedder(
        kind=config.kind,
        base_url=base_url,
        model=config.model,
        api_key=config.api_key,
        dimensions=config.dimensions,
        timeout=config.timeout,
        batch_size=config.batch_size,
        transport=transport,
    )
