"""One place where messages become bytes and bytes become messages.

Messages are ``msgspec.Struct`` types tagged by a ``type`` field and grouped into tagged
unions; a ``Codec`` built once per union decodes JSON (the wire, the store) and msgpack
(compact internal payloads) with one reusable decoder each. Anything malformed or unknown is a
``DecodeError`` whose ``field`` names the culprit (``"$.session_id"``), so the gateway can answer
with an ``error`` frame that says exactly what was wrong.

Hostile input is a ``DecodeError`` too, never another exception: invalid UTF-8, and JSON nested
deeper than the codec's ``max_depth`` (``MAX_JSON_DEPTH`` for what clients send), which is
checked before decoding — msgspec would otherwise recurse until Python's recursion limit and
raise ``RecursionError``, and a value just under that limit would fail later, wherever it is
encoded again.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Generic, TypeVar, overload

import msgspec

from turnstile.runtime.errors import DecodeError

__all__ = ["MAX_JSON_DEPTH", "Message", "ClientMessage", "Codec", "check_json_depth"]

T = TypeVar("T")

#: How deeply JSON from a client may nest objects and arrays (a frame's object is level 1).
#: Generous for any real payload (metadata, tool arguments, watcher params), far below the
#: depth at which decoding or re-encoding would hit Python's recursion limit.
MAX_JSON_DEPTH = 64

_AT_PATH = re.compile(r" - at `(?P<path>[^`]+)`\Z")
#: A JSON string (escapes included), written so the regex engine never backtracks into it.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: +1 for an opening bracket, -1 for a closing one, 0 for every other byte.
_BRACKET_STEP = [0] * 256
_BRACKET_STEP[ord("[")] = _BRACKET_STEP[ord("{")] = 1
_BRACKET_STEP[ord("]")] = _BRACKET_STEP[ord("}")] = -1


def check_json_depth(data: bytes | str, max_depth: int) -> None:
    """Refuse JSON that nests objects and arrays more than ``max_depth`` levels deep.

    Brackets inside strings do not count. The common case (fewer opening brackets than the
    limit) costs two ``bytes.count`` calls; otherwise one pass without a Python-level loop.

    Raises:
        DecodeError: the nesting is deeper than ``max_depth``.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return
    outside_strings = _JSON_STRING.sub(b"", data)
    deepest = max(itertools.accumulate(map(_BRACKET_STEP.__getitem__, outside_strings)), default=0)
    if deepest > max_depth:
        raise DecodeError(f"malformed JSON: nested deeper than {max_depth} levels")


class Message(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Base for every message. Subclasses set their ``type`` tag with ``tag=...``, pass
    ``kw_only=True`` when a required field follows one with a default (msgspec applies it per
    class), and give new fields defaults so stored messages stay readable."""


class ClientMessage(Message, forbid_unknown_fields=True):
    """Base for frames that come from clients: unknown fields are an error, not ignored."""


class Codec(Generic[T]):
    """Encode and decode one message type or tagged union.

    Args:
        type_: a Struct type, or a ``Union[...]`` of tagged Struct types.
        max_depth: refuse JSON nested deeper than this (``check_json_depth``); None checks
            nothing before decoding (for trusted data such as the store's own rows), and a
            nesting deep enough to exhaust the stack is still a ``DecodeError``.
    """

    __slots__ = ("type", "max_depth", "_json_decoder", "_msgpack_decoder")

    _json_encoder = msgspec.json.Encoder()
    _msgpack_encoder = msgspec.msgpack.Encoder()

    # A class gives its own type (``Codec(Ping)`` is a ``Codec[Ping]``); a union or another
    # form is not a ``type[T]`` to the checker, so its codec is annotated where it is built
    # (``CLIENT_FRAMES: Codec[ClientFrame] = Codec(ClientFrame)``), as msgspec's decoders are.
    @overload
    def __init__(self: Codec[T], type_: type[T], *, max_depth: int | None = None) -> None: ...
    @overload
    def __init__(self: Codec[Any], type_: Any, *, max_depth: int | None = None) -> None: ...
    def __init__(self, type_: Any, *, max_depth: int | None = None) -> None:
        self.type = type_
        self.max_depth = max_depth
        self._json_decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type_)
        self._msgpack_decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(type_)

    def encode_json(self, message: T) -> bytes:
        """``message`` as JSON bytes."""
        return self._json_encoder.encode(message)

    def encode_msgpack(self, message: T) -> bytes:
        """``message`` as msgpack bytes."""
        return self._msgpack_encoder.encode(message)

    def decode_json(self, data: bytes | str) -> T:
        """Parse and validate JSON.

        Raises:
            DecodeError: malformed JSON (invalid UTF-8 and too deep a nesting included), an
                unknown ``type``, a missing or ill-typed field.
        """
        if self.max_depth is not None:
            check_json_depth(data, self.max_depth)
        try:
            return self._json_decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise _decode_error(exc) from None
        except msgspec.DecodeError as exc:
            raise DecodeError(f"malformed JSON: {exc}") from None
        except UnicodeDecodeError:
            raise DecodeError("malformed JSON: invalid UTF-8") from None
        except RecursionError:
            raise DecodeError("malformed JSON: nested too deeply") from None

    def decode_msgpack(self, data: bytes) -> T:
        """Parse and validate msgpack.

        Raises:
            DecodeError: as for ``decode_json``.
        """
        try:
            return self._msgpack_decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise _decode_error(exc) from None
        except msgspec.DecodeError as exc:
            raise DecodeError(f"malformed msgpack: {exc}") from None
        except UnicodeDecodeError:
            raise DecodeError("malformed msgpack: invalid UTF-8") from None
        except RecursionError:
            raise DecodeError("malformed msgpack: nested too deeply") from None

    def convert(self, obj: Any) -> T:
        """Validate an already-parsed object (a dict from elsewhere) into the message type.

        Raises:
            DecodeError: as for ``decode_json``.
        """
        try:
            converted: T = msgspec.convert(obj, self.type)
            return converted
        except msgspec.ValidationError as exc:
            raise _decode_error(exc) from None
        except RecursionError:
            raise DecodeError("value nested too deeply") from None


def _decode_error(exc: msgspec.ValidationError) -> DecodeError:
    """Turn msgspec's "Expected `int`, got `str` - at `$.seq`" into message + field."""
    text = str(exc)
    match = _AT_PATH.search(text)
    field = "$" if match is None else match["path"]
    message = _lower_first(text if match is None else text[: match.start()])
    if message.startswith("invalid value") and field.endswith(".type"):
        message = "unknown message type"
    elif message.startswith("object missing required field"):
        name = message.split("`")[1]
        field = f"{field}.{name}"
        message = "missing required field"
    elif message.startswith("object contains unknown field"):
        name = message.split("`")[1]
        field = f"{field}.{name}"
        message = "unknown field"
    elif match is None:
        return DecodeError(message)
    return DecodeError(f"{message} at {field}", field=field)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
