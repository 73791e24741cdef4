"""W3C Trace Context's ``tracestate``, as a node keeps and passes it on: bounded, checked.

A caller's ``tracestate`` (vendors' entries that go with its ``traceparent``) arrives in an
HTTP header or a WebSocket ``send`` frame, and is stored with the input in the durable inbox so
that the turn, on any node, carries it on. It is text someone else wrote, kept in the store and
sent on to the exporter, so a node keeps only what W3C Trace Context (level 1) allows, within
the bounds it names: at most :data:`MAX_TRACESTATE_MEMBERS` list members and
:data:`MAX_TRACESTATE_CHARS` characters. A malformed value is dropped, never an error (W3C: a
``tracestate`` that does not parse must not fail the request, and the ``traceparent`` still
counts).

Pure (no OpenTelemetry): ``runtime.tracing`` applies it to every parent given as headers and to
what it stores, and a test can table it.
"""

from __future__ import annotations

import re

__all__ = ["MAX_TRACESTATE_CHARS", "MAX_TRACESTATE_MEMBERS", "checked_tracestate"]

#: The most list members a ``tracestate`` may have (W3C: "a maximum of 32 list-members"); one
#: with more is dropped whole.
MAX_TRACESTATE_MEMBERS = 32
#: The most characters of a ``tracestate`` a node keeps and passes on (W3C: vendors "SHOULD
#: propagate at least 512 characters"); a longer one is cut by whole members, as W3C says.
MAX_TRACESTATE_CHARS = 512
#: The longest ``tracestate`` read at all; anything longer is dropped unread.
_TRACESTATE_READ_CHARS = 8192
#: A ``tracestate`` list member, ``key=value``, as W3C Trace Context (level 1) writes them:
#: a simple key or a multi-tenant ``tenant@system`` key; a value of printable ASCII but ``,``
#: and ``=``, not ending in a space.
_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
#: Entries longer than this are the first a cut drops (W3C).
_LONG_MEMBER = 128


def checked_tracestate(value: str | None) -> str | None:
    """``value``, a W3C ``tracestate``, as a node keeps and passes it on, or None to drop it.

    Its list members are read as W3C says (optional white space around them, empty ones
    skipped); a member that is not ``key=value`` as W3C writes them, a key given twice, or more
    than :data:`MAX_TRACESTATE_MEMBERS` members, and the whole value is malformed: dropped (the
    ``traceparent`` still counts; W3C asks that a malformed ``tracestate`` never fail a
    request). Longer than :data:`MAX_TRACESTATE_CHARS`, it is cut by whole members: those
    over 128 characters first, then from the end (W3C's order), until it fits.

    Returns:
        the members joined by ``,``; None for None, an empty value, or one dropped.
    """
    if not value or len(value) > _TRACESTATE_READ_CHARS:
        return None
    members: list[str] = []
    keys: set[str] = set()
    for raw in value.split(","):
        member = raw.strip(" \t")
        if not member:
            continue
        if _MEMBER.fullmatch(member) is None:
            return None
        key = member.partition("=")[0]
        if key in keys:
            return None
        keys.add(key)
        members.append(member)
    if not members or len(members) > MAX_TRACESTATE_MEMBERS:
        return None
    if len(",".join(members)) > MAX_TRACESTATE_CHARS:
        members = [m for m in members if len(m) <= _LONG_MEMBER]
        while members and len(",".join(members)) > MAX_TRACESTATE_CHARS:
            members.pop()
    return ",".join(members) or None
