"""How a feature mounts HTTP routes on the gateway without the gateway knowing the feature.

A feature hands the composition root a list of ``HttpRoute``; ``build_app`` mounts each behind
the same front door as every other route: the bearer token is checked, path parameters follow
the id rule (a malformed one is ``400 bad_message`` naming it), bodies are bounded, decoded
through a ``Codec`` (size, depth, UTF-8) and typed errors become JSON answers with their status.
A handler gets an ``ApiRequest`` and returns what to answer: any msgspec-encodable value (sent
as JSON with the route's ``status``) or a Starlette ``Response`` for anything else (a 204, raw
bytes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from turnstile.runtime.codec import Codec

__all__ = ["ApiRequest", "HttpRoute", "RouteHandler"]


class ApiRequest(Protocol):
    """An authenticated HTTP request, as a feature's handler sees it."""

    #: the user the bearer token belongs to.
    user: str
    #: path parameters, already checked against the id rule.
    path: Mapping[str, str]
    #: the query string's parameters.
    query: Mapping[str, str]
    #: the request's headers (case-insensitive).
    headers: Mapping[str, str]

    async def body(self, codec: Codec) -> Any:
        """The body decoded by ``codec`` (an empty body is ``{}``), bounded in size and time.

        Raises:
            DecodeError: too large, malformed or not what ``codec`` expects.
            RequestTimeout: the body did not arrive in time.
        """
        ...


RouteHandler = Callable[[ApiRequest], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class HttpRoute:
    """One endpoint a feature adds: ``method path`` answered by ``handler``.

    Attributes:
        method: ``GET``, ``POST``, ``DELETE`` …
        path: a Starlette path (``/sessions/{id}/jobs``); every ``{param}`` must follow the id
            rule (``1-128 characters of A-Z a-z 0-9 _ . : -``).
        handler: ``async (request) -> answer``.
        status: the status of a successful answer that is not a ``Response``.
    """

    method: str
    path: str
    handler: RouteHandler
    status: int = 200
