"""What the http module's exchanges look like outside the exchange itself: the request headers
a tool call may set, what a response becomes in a tool's result (the headers kept, the body as
JSON, text or base64, read up to a cap), and URLs as they may appear in logs (no userinfo,
query or fragment: where secrets travel).

Apart from ``tools/modules/http.py`` because none of it touches the network or the netguard:
they are pure functions of a request's fields or a response, shared by ``get``, ``post`` and
``download``.
"""

from __future__ import annotations

import base64
import logging
import re
from typing import Any

import httpx
import msgspec

from turnstile.runtime.errors import InvalidArgument

__all__ = ["RESPONSE_HEADERS", "RedactUrls", "redact_url"]


def redact_url(url: str | httpx.URL) -> str:
    """``url`` as ``scheme://host[:port]/path``: no userinfo, query string or fragment, which
    is where secrets travel. Something that does not parse is replaced entirely."""
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
        return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))
    except Exception:  # a log line must never fail, nor leak what it could not parse
        return "<unparsable url>"


class RedactUrls(logging.Filter):
    """A logging filter that replaces every URL argument of a record with ``redact_url``'s
    form (httpx passes its request URL as an ``httpx.URL`` argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(
            isinstance(arg, httpx.URL) for arg in record.args
        ):
            record.args = tuple(
                redact_url(arg) if isinstance(arg, httpx.URL) else arg for arg in record.args
            )
        return True


_REDACT_URLS = RedactUrls()
logging.getLogger("httpx").addFilter(_REDACT_URLS)  # idempotent: one filter object

#: Response headers copied into results.
RESPONSE_HEADERS = (
    "content-type",
    "content-length",
    "content-encoding",
    "content-disposition",
    "content-language",
    "location",
    "last-modified",
    "etag",
    "cache-control",
    "expires",
    "date",
    "retry-after",
    "www-authenticate",
    "x-request-id",
)

_RESPONSE_HEADER_SET = frozenset(RESPONSE_HEADERS)

_FORBIDDEN_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _check_headers(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise InvalidArgument(f"header name {name!r} is not valid", field="headers")
        if name.lower() in _FORBIDDEN_HEADERS:
            raise InvalidArgument(f"header {name!r} may not be set", field="headers")
        if any(c in value for c in "\r\n\x00"):
            raise InvalidArgument(f"header {name!r} contains a line break", field="headers")
    return headers


def _selected_headers(response: httpx.Response) -> dict[str, str]:
    """The ``RESPONSE_HEADERS`` the response has, in one pass (a repeated one joined with
    ``", "``, as ``Headers[name]`` does)."""
    selected: dict[str, str] = {}
    for name, value in response.headers.multi_items():
        if name in _RESPONSE_HEADER_SET:
            selected[name] = f"{selected[name]}, {value}" if name in selected else value
    return selected


def _mime(response: httpx.Response) -> str:
    content_type: str = response.headers.get("content-type", "")  # httpx: get() -> Any
    return content_type.split(";", 1)[0].strip().lower()


def _is_json(mime: str) -> bool:
    return mime == "application/json" or mime.endswith("+json")


def _is_text(mime: str) -> bool:
    return (
        mime.startswith("text/")
        or _is_json(mime)
        or mime.endswith("+xml")
        or mime
        in (
            "application/xml",
            "application/javascript",
            "application/x-www-form-urlencoded",
            "application/x-ndjson",
            "application/yaml",
        )
    )


def _render_body(response: httpx.Response, data: bytes, truncated: bool) -> dict[str, Any]:
    mime = _mime(response)
    if _is_json(mime) and not truncated and data:
        try:
            return {"body": msgspec.json.decode(data), "encoding": "json"}
        except msgspec.DecodeError:
            pass  # not really JSON: shown as text
    if _is_text(mime) or not mime:
        charset = response.charset_encoding or "utf-8"
        try:
            text = data.decode(charset, errors="replace" if mime else "strict")
        except LookupError:
            text = data.decode("utf-8", errors="replace")
        except UnicodeDecodeError:  # no content type and not UTF-8: binary
            text = None
        if text is not None:
            return {"body": text, "encoding": "text"}
    return {"body": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


async def _read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    buffer = bytearray()
    async for chunk in response.aiter_bytes():
        room = limit - len(buffer)
        if len(chunk) > room:
            buffer += chunk[:room]
            return bytes(buffer), True
        buffer += chunk
    return bytes(buffer), False
