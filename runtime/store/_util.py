"""Helpers of the front and the backends: argument checks, JSON, timestamps, error messages."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from turnstile.runtime.clock import utc
from turnstile.runtime.errors import ConflictError, Fenced, InvalidArgument, NotFound
from turnstile.runtime.store.escaping import escape_json, not_text, unescape_json
from turnstile.runtime.store.records import FINAL_INPUT_STATES, INPUT_STATES

_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


# -- arguments --------------------------------------------------------------------------------


def check_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    return value


#: The longest idempotency key the inbox stores.
MAX_IDEMPOTENCY_KEY_CHARS = 255
#: Visible ASCII only (``!`` to ``~``): no spaces, control characters or line breaks, so that a
#: key is safe in a log line and in an HTTP header, and compares byte for byte on both backends.
_IDEMPOTENCY_KEY = re.compile(r"[!-~]+")


def check_idempotency_key(value: object, field: str = "idempotency_key") -> str:
    """``value`` if it is a well-formed idempotency key, else ``InvalidArgument`` naming
    ``field``: 1 to :data:`MAX_IDEMPOTENCY_KEY_CHARS` visible ASCII characters."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a string, not {type(value).__name__}", field=field)
    if not 1 <= len(value) <= MAX_IDEMPOTENCY_KEY_CHARS or not _IDEMPOTENCY_KEY.fullmatch(value):
        raise InvalidArgument(
            f"{field} must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} visible ASCII characters"
            " (no spaces or control characters)",
            field=field,
        )
    return value


#: The longest lease a node may take (a day): longer would leave a dead node's work waiting.
MAX_LEASE_SECONDS = 86400.0
#: A node id: 1 to 128 characters, letters, digits and ``. _ : @ -``, starting with a letter
#: or a digit (a host name, ``host:port``, or a name of the operator's choice).
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


def check_node_id(value: object, field: str = "id") -> str:
    """``value`` if it is a well-formed node id, else ``InvalidArgument`` naming ``field``."""
    if not isinstance(value, str) or not _NODE_ID.fullmatch(value):
        raise InvalidArgument(
            f"{field} must be 1 to 128 letters, digits or . _ : @ - (starting with a letter or"
            " a digit)",
            field=field,
        )
    return value


#: PostgreSQL refuses a NOTIFY payload of 8000 bytes or more
MAX_NOTIFY_BYTES = 7999
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def check_channel(channel: object) -> str:
    """``channel`` if it is a notification channel name, else ``InvalidArgument``."""
    if not isinstance(channel, str) or not _CHANNEL.fullmatch(channel):
        raise InvalidArgument(
            "channel must be 1-63 lower-case letters, digits or _, not starting with a digit",
            field="channel",
        )
    return channel


def check_fence(fence: object) -> int | None:
    """The ``fence`` argument of a fenced write: None (unfenced) or a lease epoch."""
    return None if fence is None else check_int(fence, "fence")


def check_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return value


def check_limit(limit: object) -> int:
    check_int(limit, "limit")
    if limit <= 0:  # type: ignore[operator]
        raise ValueError("limit must be positive")
    return limit  # type: ignore[return-value]


def check_time(value: object, what: str) -> datetime:
    """An aware UTC datetime (naive input is taken to be UTC)."""
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__}")
    return utc(value)


def check_input_states(states: Sequence[str] | None) -> list[str] | None:
    if states is None:
        return None
    if isinstance(states, str):
        raise TypeError("states must be a sequence of str, not a str")
    for s in states:
        if s not in INPUT_STATES:
            raise ValueError(f"unknown input state {s!r}")
    return list(states)


def check_input_state(state: object) -> str:
    """``state`` must name an input state (whether the move is legal is checked later)."""
    if state not in INPUT_STATES:
        raise ValueError(f"unknown input state {state!r}")
    return state


def transition_error(input_id: int, current: str, target: str) -> ConflictError:
    return ConflictError(f"cannot move input {input_id} from {current} to {target}")


def finish_allowed(current: str, target: str) -> bool:
    return current == "running" and target in FINAL_INPUT_STATES


# -- JSON -------------------------------------------------------------------------------------


def encode_json(value: dict[str, Any], what: str = "payload") -> str:
    """A dict as the JSON text the store writes (U+0000 escaped, ``runtime/store/escaping.py``);
    anything else (or anything unencodable) is a TypeError, a string holding a lone surrogate
    an ``InvalidArgument`` naming ``what``."""
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a dict, not {type(value).__name__}")
    try:
        return escape_json(_json_encoder.encode(value))
    except UnicodeEncodeError as exc:
        raise not_text(what, exc) from None
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(f"{what} is not JSON-encodable: {exc}") from None


def encode_optional_json(value: dict[str, Any] | None, what: str = "detail") -> str | None:
    return None if value is None else encode_json(value, what)


def decode_json(text: str | bytes) -> Any:
    """JSON text as :func:`encode_json` wrote it -> the value."""
    return _json_decoder.decode(unescape_json(text))


def decode_optional_json(text: str | bytes | None) -> Any:
    return None if text is None else _json_decoder.decode(unescape_json(text))


# -- timestamps (SQLite stores fixed-width ISO-8601 text, so text order is time order) ----------


def format_ts(dt: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC (always 27 characters)."""
    return utc(dt).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_ts(text: str) -> datetime:
    return utc(datetime.fromisoformat(text))


# -- errors -----------------------------------------------------------------------------------


def no_session(session_id: str) -> NotFound:
    return NotFound(f"no session with id {session_id!r}")


def fenced(session_id: str, fence: int, current: int) -> Fenced:
    return Fenced(session_id, fence, current)


def no_input(input_id: int) -> NotFound:
    return NotFound(f"no input with id {input_id}")


def check_events(events: object) -> list[tuple[str, str]]:
    """``[(type, payload), ...]`` -> ``[(type, payload as JSON), ...]``."""
    if isinstance(events, str | bytes | dict) or not isinstance(events, Sequence):
        raise TypeError("events must be a sequence of (type, payload) pairs")
    out = []
    for event in events:
        if not isinstance(event, tuple | list) or len(event) != 2:
            raise TypeError("events must be a sequence of (type, payload) pairs")
        type_, payload = event
        out.append((check_text(type_, "event type"), encode_json(payload)))
    return out
