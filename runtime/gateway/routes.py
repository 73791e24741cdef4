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

A route also describes itself for the API document the gateway serves at ``/openapi.json``
(``runtime.gateway.openapi``): a ``summary``, the msgspec types of its request ``body``, its
``query`` string (a Struct whose fields are the parameters) and its answers (``response`` for
``status``, ``responses`` for any other), the request ``headers`` it reads and the error
statuses it answers (``errors``; the gateway adds those it gives itself: 400 for a malformed
path parameter, query or body, 401 for a missing token, 408 for a body too slow). Every error
answer has the one shape ``ErrorAnswer`` unless ``responses`` says otherwise. The document is
built from these, never written by hand, so describing a route is describing it once.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import msgspec

from turnstile.runtime.codec import Codec
from turnstile.runtime.errors import DecodeError

__all__ = [
    "ApiError",
    "ApiRequest",
    "ErrorAnswer",
    "HttpRoute",
    "Param",
    "Reply",
    "RouteAuth",
    "RouteHandler",
    "decode_query",
]

T = TypeVar("T")

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
    #: the query string's parameters (without the gateway's ``token``).
    query: Mapping[str, str]
    #: the request's headers (case-insensitive).
    headers: Mapping[str, str]

    async def body(self, codec: Codec[T]) -> T:
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


class ApiError(msgspec.Struct, omit_defaults=True):
    """What went wrong: a stable ``code`` (``docs/protocol.md``), a ``message`` for people and,
    for bad input, the ``field`` at fault (a parameter, a header, or a JSON path such as
    ``$.content``)."""

    code: str
    message: str
    field: str | None = None
    #: ``placed_elsewhere`` (421, several nodes): the node that holds the session, and where
    #: it can be reached
    node: str | None = None
    node_address: str | None = None


class ErrorAnswer(msgspec.Struct):
    """The body of every error answer of the HTTP API."""

    error: ApiError


@dataclass(frozen=True, slots=True)
class Param:
    """A request header a route reads (``HttpRoute.headers``), for the API document.

    Attributes:
        name: the header's name as it is usually spelt (``Idempotency-Key``).
        type: its msgspec type (constraints in ``Annotated``), ``str`` by default.
        required: whether the route refuses a request without it.
        description: what it carries.
    """

    name: str
    type: Any = str
    required: bool = False
    description: str = ""


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer a route may give, for the API document (``HttpRoute.responses``).

    Attributes:
        type: the msgspec type of its JSON body; None for no body (a 204, a 304).
        description: when it is given.
        media_type: the body's media type when it is not JSON (``text/html``), or the media
            types it may have (a tuple); its schema is then a string.
        headers: response headers it carries (``Retry-After``).
    """

    type: Any = None
    description: str = ""
    media_type: str | tuple[str, ...] = "application/json"
    headers: tuple[Param, ...] = ()


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
            handler, and list the signature's headers in ``headers``. ``public``: no token and
            no user; only for what belongs to nobody and is the same for everyone (a browser
            client's static files).
        summary: one line saying what the route does (the API document's summary).
        description: more, when the summary is not enough.
        body: the msgspec type of the JSON body the handler decodes (None: it reads none).
        response: the msgspec type of the body answered with ``status`` (None with status 204,
            or when ``responses`` describes ``status``).
        responses: every other answer by status (a ``Reply``, or a bare type for a JSON body):
            another success status, or an error answered with a body of its own.
        query: a msgspec Struct whose fields are the query parameters the handler reads.
        headers: the request headers the handler reads.
        errors: the error statuses the handler answers (``ErrorAnswer`` bodies): 404, 409,
            413, 429 … (400, 401 and 408 are added where the gateway gives them).
    """

    method: str
    path: str
    handler: RouteHandler
    status: int = 200
    auth: RouteAuth = "bearer"
    summary: str = ""
    description: str = ""
    body: Any = None
    response: Any = None
    responses: Mapping[int, Reply | Any] = field(default_factory=dict)
    query: Any = None
    headers: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.auth not in ("bearer", "signature", "public"):
            raise ValueError(
                f"route auth must be 'bearer', 'signature' or 'public', got {self.auth!r}"
            )
        if self.query is not None and not (
            isinstance(self.query, type) and issubclass(self.query, msgspec.Struct)
        ):
            raise ValueError(f"route query must be a msgspec Struct type, got {self.query!r}")
        if any(not 400 <= status <= 599 for status in self.errors):
            raise ValueError(f"route errors must be 4xx or 5xx statuses, got {self.errors!r}")


_AT = re.compile(r" - at `\$\.?(?P<field>[^`]*)`$")


def decode_query(query: Mapping[str, str], type_: type[T]) -> T:
    """The query string as ``type_``, a msgspec Struct whose fields are the parameters (text
    converted: ``limit=5``, ``all_users=true``). Declare the same Struct as the route's
    ``query`` so the API document says what is read.

    Raises:
        DecodeError: an unknown parameter (when ``type_`` forbids unknown fields), a missing
            one or a bad value; ``field`` names the parameter.
    """
    try:
        return msgspec.convert(dict(query), type_, strict=False)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.startswith(("Object contains unknown field", "Object missing required field")):
            name = text.split("`")[1]
            what = "unknown" if "unknown" in text else "missing"
            raise DecodeError(f"{what} query parameter {name!r}", field=name) from None
        match = _AT.search(text)
        message = text[: match.start()] if match else text
        raise DecodeError(
            message[:1].lower() + message[1:], field=match["field"] if match else None
        ) from None
