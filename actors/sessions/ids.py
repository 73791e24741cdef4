"""What a session id is: a name that means something only inside its owner's namespace.

A client names its sessions (``"main"``, ``"support-42"``); the runtime keys each session by
``"<owner>/<name>"`` (its *key*). The key is what the store, the registry (``session:<key>``),
jobs, watchers, background tasks and approvals hold; the name is what the owner sees and types.
User names cannot contain ``/`` (the config refuses them) and names cannot either (the gateway's
id pattern), so no name one user can choose reaches another user's key: Bob's ``"main"`` and
Ann's ``"main"`` are two sessions that know nothing of each other, and creating, reading or
deleting one says nothing about the other (compare Durable Objects names, which live in a
namespace).

Sessions the runtime derives from a session (the dedicated heartbeat session ``<name>.heartbeat``)
live in the parent's namespace, are created only by the runtime (a client cannot create a name
ending in a derived suffix), count against the owner's session limit, and are deleted with
their parent.
"""

from __future__ import annotations

from typing import Any

import msgspec

from turnstile.actors.sessions.agents.base import ToolResult

__all__ = [
    "DERIVED_SUFFIXES",
    "MAX_NAME_CHARS",
    "OWNER_SEPARATOR",
    "derived_key",
    "is_derived",
    "owner_of",
    "public_id",
    "public_result",
    "public_view",
    "session_key",
]

#: Between the owner and the name in a session key. Neither part may contain it.
OWNER_SEPARATOR = "/"

#: Name suffixes reserved for sessions the runtime derives from a session.
DERIVED_SUFFIXES = (".heartbeat",)

#: The longest name a client may give a session (the gateway's id limit).
MAX_NAME_CHARS = 128


def session_key(owner: str, name: str) -> str:
    """The key of ``owner``'s session ``name``.

    Raises:
        ValueError: ``owner`` or ``name`` is empty or contains the separator (the gateway and
            the config refuse such values before they get here; this is the last guard).
    """
    if not owner or not name or OWNER_SEPARATOR in owner or OWNER_SEPARATOR in name:
        raise ValueError(f"not a valid owner and session name: {owner!r}, {name!r}")
    return f"{owner}{OWNER_SEPARATOR}{name}"


def public_id(key: str) -> str:
    """The name the owner knows a session by (a key without an owner is returned as it is)."""
    _, sep, name = key.partition(OWNER_SEPARATOR)
    return name if sep else key


def owner_of(key: str) -> str | None:
    """The owner a key names, or None for a key without one."""
    owner, sep, _ = key.partition(OWNER_SEPARATOR)
    return owner if sep else None


def is_derived(name_or_key: str) -> bool:
    """Whether a session name (or key) is one the runtime derives from another session."""
    return name_or_key.endswith(DERIVED_SUFFIXES)


def derived_key(parent_key: str, suffix: str) -> str:
    """The key of the session derived from ``parent_key`` with ``suffix`` (``".heartbeat"``).

    Raises:
        ValueError: ``suffix`` is not a derived suffix, the parent is itself derived, or the
            derived name would be longer than a client could address (``MAX_NAME_CHARS``).
    """
    if suffix not in DERIVED_SUFFIXES:
        raise ValueError(f"{suffix!r} is not a derived-session suffix")
    if is_derived(parent_key):
        raise ValueError("a derived session has no derived sessions of its own")
    name = public_id(parent_key) + suffix
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(
            f"session name {public_id(parent_key)!r} is too long for a derived session "
            f"(at most {MAX_NAME_CHARS - len(suffix)} characters)"
        )
    return parent_key + suffix


def public_view(view: Any) -> Any:
    """A JSON-shaped answer with every ``session_id`` (at any depth) given as a name: what tools
    and routes return to an owner, who knows sessions by name."""
    if isinstance(view, dict):
        return {
            k: public_id(v) if k == "session_id" and isinstance(v, str) else public_view(v)
            for k, v in view.items()
        }
    if isinstance(view, list):
        return [public_view(v) for v in view]
    return view


def public_result(result: ToolResult) -> ToolResult:
    """A tool's result as the session's owner (and its agent) should read it: with names."""
    if not result.ok or not isinstance(result.data, (dict, list)):
        return result
    return msgspec.structs.replace(result, data=public_view(result.data))
