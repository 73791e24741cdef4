"""Any string round-trips: U+0000, which PostgreSQL cannot hold, kept by a private escape.

PostgreSQL's ``text`` refuses the byte 0x00 and ``jsonb`` refuses the JSON escape ``\\u0000``
(SQLite takes both), so a tool result, a webhook body or a fact holding U+0000 failed there.
The store writes such a string with an escape of its own and reads it back as it was:

* the escape character :data:`ESC` is U+FDD0, a Unicode *noncharacter* (permanently reserved
  for a process's internal use, never assigned);
* U+0000 is written ``ESC "0"`` and ``ESC`` itself ``ESC ESC``; reading turns those two pairs
  back and leaves anything else (an ``ESC`` before another character, which this code never
  writes) as it is.

Two places apply it:

* **JSON** (every payload, metadata, spec, kv value, detail): :func:`escape_json` rewrites
  msgspec's output, where U+0000 is always the escape ``\\u0000``, inside every string (keys
  included), and :func:`unescape_json` turns it back before decoding. The JSON stays JSON, so
  ``jsonb`` takes it, ``->>`` still extracts numbers and ASCII keys (``seq``, ``run_id``), and
  JSON text sent in ``text[]`` arrays (``append_events``, ``fire_jobs``) is the escaped text.
  Both backends store the same escaped JSON: one decoder reads either.
* **text columns on PostgreSQL** (ids, sources, a fact's key and value, a webhook's body):
  :func:`text_codecs` is the codec of the ``text`` type on every connection of the store,
  applying :func:`escape_text` to scalar parameters and :func:`unescape_text` to results, so
  every feature's query gets it without a line of its own. A string a ``->>`` extracts from
  escaped JSON is escaped the same way, so it reads back right too. SQLite keeps text as is.

The common case costs two substring searches over the bytes (C speed, no allocation); only a
string holding U+0000 or ``ESC`` takes the slow path (one regex pass).

A lone surrogate (``"\\ud800"`` from ``json.loads``) is not text: it has no UTF-8 form and no
database can store it, so the store's ``encode_json`` refuses it (:class:`InvalidArgument`, a 400 at
the gateway) on both backends alike. Clients' frames never hold one: msgspec refuses the escape
when decoding them (a ``DecodeError``).

Not covered: a ``text[]`` parameter's elements go through asyncpg's own array codec, so a raw
U+0000 in one still fails on PostgreSQL (no kernel array holds client text other than escaped
JSON); a NOTIFY payload is delivered as written (escaped) to listeners.
"""

from __future__ import annotations

import re
from typing import Any

from turnstile.runtime.errors import InvalidArgument

__all__ = [
    "ESC",
    "escape_json",
    "escape_text",
    "not_text",
    "text_codecs",
    "unescape_json",
    "unescape_text",
]

#: The escape character: U+FDD0, a noncharacter.
ESC = "\ufdd0"
_ESC_BYTES = ESC.encode()
_NUL_JSON = b"\\u0000"

# In msgspec's output a backslash only starts an escape: matching an escaped backslash first
# keeps ``\\u0000`` (a backslash, then the text u0000) from being read as U+0000.
_JSON_TOKEN = re.compile(rb"\\\\|\\u0000|" + re.escape(_ESC_BYTES))
_JSON_OUT = {b"\\\\": b"\\\\", _NUL_JSON: _ESC_BYTES + b"0", _ESC_BYTES: _ESC_BYTES + _ESC_BYTES}
_PAIR = re.compile(ESC + "([0" + ESC + "])")


def _json_out(match: re.Match[bytes]) -> bytes:
    return _JSON_OUT[match.group()]


def _json_in(match: re.Match[str]) -> str:
    return "\\u0000" if match.group(1) == "0" else ESC


def _text_in(match: re.Match[str]) -> str:
    return "\x00" if match.group(1) == "0" else ESC


def escape_json(data: bytes) -> str:
    """msgspec's JSON ``data`` as the text the store writes (U+0000 and :data:`ESC` escaped)."""
    if _NUL_JSON in data or _ESC_BYTES in data:
        data = _JSON_TOKEN.sub(_json_out, data)
    return data.decode()


def unescape_json(text: str | bytes) -> str | bytes:
    """JSON text as the store wrote it -> JSON text for the decoder."""
    if isinstance(text, bytes):
        if _ESC_BYTES not in text:
            return text
        text = text.decode()
    elif ESC not in text:
        return text
    return _PAIR.sub(_json_in, text)


def escape_text(text: str) -> str:
    """A string as PostgreSQL's ``text`` holds it (U+0000 and :data:`ESC` escaped)."""
    if "\x00" in text or ESC in text:
        return text.replace(ESC, ESC + ESC).replace("\x00", ESC + "0")
    return text


def unescape_text(text: str) -> str:
    """A ``text`` value as :func:`escape_text` wrote it -> the string."""
    if ESC not in text:
        return text
    return _PAIR.sub(_text_in, text)


def text_codecs() -> dict[str, Any]:
    """Keyword arguments for asyncpg's ``Connection.set_type_codec("text", ...)``."""
    return {
        "schema": "pg_catalog",
        "encoder": escape_text,
        "decoder": unescape_text,
        "format": "text",
    }


def not_text(what: str, exc: UnicodeEncodeError) -> InvalidArgument:
    """The error for a string with no UTF-8 form (a lone surrogate) in ``what``."""
    return InvalidArgument(
        f"{what} holds a lone surrogate (U+{ord(exc.object[exc.start]):04X}), which is not text",
        field=what,
    )
