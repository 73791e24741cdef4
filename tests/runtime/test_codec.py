"""The codec: round trips and typed decode errors that name the field."""

from __future__ import annotations

import pytest

from turnstile.runtime.codec import ClientMessage, Codec, Message
from turnstile.runtime.errors import DecodeError


class Send(ClientMessage, tag="send"):
    session_id: str
    content: str
    client_msg_id: str | None = None


class Stop(ClientMessage, tag="stop"):
    session_id: str


class Stored(Message, tag="stored"):
    n: int


CLIENT = Codec(Send | Stop)


@pytest.mark.parametrize(
    "raw, message, field",
    [
        (b'{"type":"nope"}', "unknown message type at $.type", "$.type"),
        (
            b'{"type":"send","session_id":1,"content":"x"}',
            "expected `str`, got `int` at $.session_id",
            "$.session_id",
        ),
        (
            b'{"type":"send","content":"x"}',
            "missing required field at $.session_id",
            "$.session_id",
        ),
        (b'{"type":"stop","session_id":"a","extra":1}', "unknown field at $.extra", "$.extra"),
        (b'{"session_id":"a"}', "missing required field at $.type", "$.type"),
        (b"[1]", "expected `object`, got `array`", None),
        (b"{bad", "malformed JSON: JSON is malformed: object keys must be strings (byte 1)", None),
    ],
)
def test_bad_frames_are_typed_errors_naming_the_field(raw, message, field):
    with pytest.raises(DecodeError) as info:
        CLIENT.decode_json(raw)
    assert str(info.value) == message
    assert info.value.field == field
    assert info.value.code == "bad_message"


def test_json_and_msgpack_round_trip_the_tagged_union():
    send = Send(session_id="s1", content="hi", client_msg_id="c1")
    assert CLIENT.decode_json(CLIENT.encode_json(send)) == send
    assert CLIENT.decode_msgpack(CLIENT.encode_msgpack(Stop(session_id="s"))) == Stop(
        session_id="s"
    )
    assert CLIENT.encode_json(Stop(session_id="s")) == b'{"type":"stop","session_id":"s"}'


def test_stored_messages_ignore_unknown_fields_so_old_readers_survive_new_writers():
    codec = Codec(Stored)
    assert codec.decode_json(b'{"type":"stored","n":1,"added_later":true}') == Stored(n=1)
    with pytest.raises(DecodeError, match=r"^expected `int`, got `str` at \$\.n$"):
        codec.convert({"type": "stored", "n": "x"})
