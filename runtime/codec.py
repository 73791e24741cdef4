"""One place where messages become bytes and bytes become messages.

Messages are ``msgspec.Struct`` types tagged by a ``type`` field and grouped into tagged
unions; a ``Codec`` built once per union decodes JSON (the wire, the store) and msgpack
(compact internal payloads) with one reusable decoder each. Anything malformed or unknown is a
``DecodeError`` whose ``field`` names the culprit (``"$.session_id"``), so the gateway can answer
with an ``error`` frame that says exactly what was wrong.
"""

from __future__ import annotations

import re
from typing import Any, Generic, TypeVar

import msgspec

from runtime.errors import DecodeError

__all__ = ["Message", "ClientMessage", "Codec"]

T = TypeVar("T")

_AT_PATH = re.compile(r" - at `(?P<path>[^`]+)`$")


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
    """

    __slots__ = ("type", "_json_decoder", "_msgpack_decoder")

    _json_encoder = msgspec.json.Encoder()
    _msgpack_encoder = msgspec.msgpack.Encoder()

    def __init__(self, type_: Any) -> None:
        self.type = type_
        self._json_decoder = msgspec.json.Decoder(type_)
        self._msgpack_decoder = msgspec.msgpack.Decoder(type_)

    def encode_json(self, message: T) -> bytes:
        """``message`` as JSON bytes."""
        return self._json_encoder.encode(message)

    def encode_msgpack(self, message: T) -> bytes:
        """``message`` as msgpack bytes."""
        return self._msgpack_encoder.encode(message)

    def decode_json(self, data: bytes | str) -> T:
        """Parse and validate JSON.

        Raises:
            DecodeError: malformed JSON, an unknown ``type``, a missing or ill-typed field.
        """
        try:
            return self._json_decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise _decode_error(exc) from None
        except msgspec.DecodeError as exc:
            raise DecodeError(f"malformed JSON: {exc}") from None

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

    def convert(self, obj: Any) -> T:
        """Validate an already-parsed object (a dict from elsewhere) into the message type.

        Raises:
            DecodeError: as for ``decode_json``.
        """
        try:
            return msgspec.convert(obj, self.type)
        except msgspec.ValidationError as exc:
            raise _decode_error(exc) from None


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
