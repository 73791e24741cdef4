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
  JSON text sent in ``text[]`` arrays (``append_events``, a feature's batch of rows) is the escaped
  text.
  Both backends store the same escaped JSON: one decoder reads either.
* **text columns on PostgreSQL** (ids, sources, a fact's key and value, a webhook's body):
  :func:`text_codecs` is the codec of the ``text`` type on every connection of the store,
  applying :func:`escape_text` to scalar parameters and :func:`unescape_text` to results, so
  every feature's query gets it without a line of its own. A string a ``->>`` extracts from
  escaped JSON is escaped the same way, so it reads back right too. SQLite keeps text as is.

The common case costs a ``memchr`` or two over the bytes (no allocation); only JSON holding
U+0000 or ``ESC`` takes the slow path (splits and replaces, in C). Measured by
``python -m bench.escaping``.

A lone surrogate (``"\\ud800"`` from ``json.loads``) is not text: it has no UTF-8 form and no
database can store it, so the store's ``encode_json`` refuses it (:class:`InvalidArgument`, a 400 at
the gateway) on both backends alike. Clients' frames never hold one: msgspec refuses the escape
when decoding them (a ``DecodeError``).

Not covered: a ``text[]`` parameter's elements go through asyncpg's own array codec, so a raw
U+0000 in one still fails on PostgreSQL (no kernel array holds client text other than escaped
JSON); a NOTIFY payload is delivered as written (escaped) to listeners.
"""

from __future__ import annotations

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
_ESC2 = ESC + ESC
_ESC_NUL = ESC + "0"
_ESC_BYTES = ESC.encode()
_ESC_BYTES2 = _ESC_BYTES + _ESC_BYTES
_ESC_NUL_BYTES = _ESC_BYTES + b"0"
_NUL_JSON = b"\\u0000"
#: ``_ESC_BYTES``'s first byte and ``_NUL_JSON``'s, as ints: ``int in bytes`` is a ``memchr``
#: (about 20 ns on a short payload), where ``bytes in bytes`` costs a buffer acquisition
#: (about 250 ns) and a whole-sequence search about 0.6 ns a byte; most payloads hold neither.
_ESC_LEAD = _ESC_BYTES[0]
_BACKSLASH = ord("\\")


def escape_json(data: bytes) -> str:
    """msgspec's JSON ``data`` as the text the store writes (U+0000 and :data:`ESC` escaped)."""
    if (_BACKSLASH in data and _NUL_JSON in data) or (_ESC_LEAD in data and _ESC_BYTES in data):
        # In msgspec's output a backslash only starts an escape, and a run of them is escaped
        # backslashes (pairs) then perhaps the start of one escape: splitting at the pairs,
        # leftmost first, keeps ``\\u0000`` (a backslash, then the text u0000) as it is.
        data = b"\\\\".join(
            part.replace(_ESC_BYTES, _ESC_BYTES2).replace(_NUL_JSON, _ESC_NUL_BYTES)
            for part in data.split(b"\\\\")
        )
    return data.decode()


def unescape_json(text: str | bytes) -> str | bytes:
    """JSON text as the store wrote it -> JSON text for the decoder."""
    if isinstance(text, bytes):
        if _ESC_LEAD not in text or _ESC_BYTES not in text:
            return text
        text = text.decode()
    elif ESC not in text:  # immediate for ASCII or Latin-1 text: ESC cannot be in it
        return text
    return _unpair(text, "\\u0000")


def escape_text(text: str) -> str:
    """A string as PostgreSQL's ``text`` holds it (U+0000 and :data:`ESC` escaped)."""
    if "\x00" in text or ESC in text:
        return text.replace(ESC, _ESC2).replace("\x00", _ESC_NUL)
    return text


def unescape_text(text: str) -> str:
    """A ``text`` value as :func:`escape_text` wrote it -> the string."""
    if ESC not in text:
        return text
    return _unpair(text, "\x00")


def _unpair(text: str, nul: str) -> str:
    # The writer emits ESC only as the first of a pair, so the pairs are the leftmost ones:
    # split at ``ESC ESC``, then what is left of ``ESC 0`` is U+0000 (an ``ESC`` before anything
    # else, never written by this code, stays).
    if _ESC2 not in text:
        return text.replace(_ESC_NUL, nul)
    return ESC.join(part.replace(_ESC_NUL, nul) for part in text.split(_ESC2))


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
