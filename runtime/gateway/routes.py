"""How a feature mounts HTTP routes on the gateway without the gateway knowing the feature.

A feature hands the composition root a list of ``HttpRoute``; ``build_app`` mounts each behind
the same front door as every other route: the bearer token is checked, path parameters follow
the id rule (a malformed one is ``400 bad_message`` naming it), bodies are bounded, decoded
through a ``Codec`` (size, depth, UTF-8) and typed errors become JSON answers with their status.
A handler gets an ``ApiRequest`` and returns what to answer: any msgspec-encodable value (sent
as JSON with the route's ``status``) or a Starlette ``Response`` for anything else (a 204, raw
bytes).

The one deliberate exception to the token is a route declared ``auth="signature"``: a webhook
receiver, whose sender cannot hold a user's token and proves itself by signing the raw body
instead (HMAC over the bytes as sent, which is why ``raw_body`` exists). The gateway checks no
token for it, ``request.user`` is empty, and the handler must verify the signature before it
trusts a byte of the body. The other exception is a route declared ``auth="public"``: it
serves what belongs to nobody (the files of a browser client, which must load before the person
has typed a token), gets no user and must read or change no user's data. Every other route,
whatever it is, stays token-protected: ``auth`` defaults to ``"bearer"``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from turnstile.runtime.codec import Codec

__all__ = ["ApiRequest", "HttpRoute", "RouteAuth", "RouteHandler"]

#: How a route authenticates: ``bearer`` (the user's token, checked by the gateway),
#: ``signature`` (no token; the handler verifies a signature over ``raw_body``) or ``public``
#: (no token and no user: static files that belong to nobody).
RouteAuth = Literal["bearer", "signature", "public"]


class ApiRequest(Protocol):
    """An authenticated HTTP request, as a feature's handler sees it."""

    #: the user the bearer token belongs to (empty on ``auth="signature"`` and ``"public"``
    #: routes).
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

    async def raw_body(self, max_bytes: int | None = None) -> bytes:
        """The body exactly as sent, for a signature over its bytes; read at most once.

        Args:
            max_bytes: refuse a larger body (None: the gateway's ``max_frame_bytes``).

        Raises:
            PayloadTooLarge: the body is (or says it is) larger than ``max_bytes``.
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
        auth: ``bearer`` (default): the gateway refuses a request without a user's token.
            ``signature``: the gateway checks no token and the handler authenticates the
            request itself from its ``raw_body`` (webhook receivers); say it only for such a
            handler. ``public``: no token and no user; only for what belongs to nobody and is
            the same for everyone (a browser client's static files).
    """

    method: str
    path: str
    handler: RouteHandler
    status: int = 200
    auth: RouteAuth = "bearer"

    def __post_init__(self) -> None:
        if self.auth not in ("bearer", "signature", "public"):
            raise ValueError(
                f"route auth must be 'bearer', 'signature' or 'public', got {self.auth!r}"
            )
