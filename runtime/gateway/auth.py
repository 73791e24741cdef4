"""Who is calling: bearer tokens mapped to users, and the WebSocket Origin allow-list."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from urllib.parse import urlsplit

from turnstile.runtime.errors import Unauthorized

__all__ = ["Auth"]


class Auth:
    """Resolves bearer tokens to user names.

    Args:
        tokens: token → user name.
        allowed_origins: browser origins allowed to open a WebSocket. Clients that send no
            ``Origin`` (CLIs, servers) are allowed; so are loopback origins
            (``http://localhost:*``, ``http://127.0.0.1:*``) when ``allow_loopback_origins``.
    """

    def __init__(
        self,
        tokens: Mapping[str, str],
        allowed_origins: list[str] | None = None,
        *,
        allow_loopback_origins: bool = True,
    ) -> None:
        if not tokens:
            raise ValueError("at least one user token is required")
        self._tokens = dict(tokens)
        self.allowed_origins = {o.rstrip("/") for o in allowed_origins or []}
        self.allow_loopback_origins = allow_loopback_origins

    def user_for(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str:
        """The user a request authenticates as.

        The token comes from ``Authorization: Bearer <token>``, or the ``token`` query parameter
        (browsers cannot set headers on a WebSocket).

        Raises:
            Unauthorized: no token, or an unknown one.
        """
        token = None
        header = headers.get("authorization")
        if header:
            scheme, _, value = header.partition(" ")
            if scheme.lower() == "bearer" and value.strip():
                token = value.strip()
        if token is None:
            token = query.get("token")
        if not token:
            raise Unauthorized("missing bearer token")
        for known, user in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return user
        raise Unauthorized("invalid token")

    def origin_allowed(self, origin: str | None) -> bool:
        """Whether a WebSocket from ``origin`` may connect."""
        if origin is None:
            return True
        origin = origin.rstrip("/")
        if origin in self.allowed_origins:
            return True
        if self.allow_loopback_origins:
            parts = urlsplit(origin)
            return parts.scheme in ("http", "https") and parts.hostname in (
                "localhost",
                "127.0.0.1",
                "::1",
            )
        return False
