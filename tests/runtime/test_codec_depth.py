"""The codec's nesting limit: counted on brackets outside strings, exact at the boundary."""

from __future__ import annotations

from typing import Any

import pytest

from turnstile.runtime.codec import MAX_JSON_DEPTH, Codec, check_json_depth
from turnstile.runtime.errors import DecodeError

TOO_DEEP = f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels"


def arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (arrays(MAX_JSON_DEPTH), True),
        (arrays(MAX_JSON_DEPTH + 1), False),
        ('{"a":' * MAX_JSON_DEPTH + "1" + "}" * MAX_JSON_DEPTH, True),
        ('{"a":' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1), False),
        # Many brackets side by side are not deep.
        ("[" + ",".join(["[]"] * 1000) + "]", True),
        # Brackets inside strings, escaped quotes included, never count.
        ('["' + "[{" * 1000 + '"]', True),
        ('["\\"' + "[" * 1000 + '\\\\"]', True),
        ('["\\\\", ' + arrays(MAX_JSON_DEPTH) + "]", False),
    ],
)
def test_depth_is_counted_outside_strings(text: str, ok: bool) -> None:
    for data in (text, text.encode()):
        if ok:
            check_json_depth(data, MAX_JSON_DEPTH)
        else:
            with pytest.raises(DecodeError) as caught:
                check_json_depth(data, MAX_JSON_DEPTH)
            assert (str(caught.value), caught.value.field) == (TOO_DEEP, None)


def test_a_codec_without_a_limit_still_turns_exhausted_recursion_into_a_decode_error() -> None:
    codec: Codec[Any] = Codec(Any)
    with pytest.raises(DecodeError, match=r"\Amalformed JSON: nested too deeply\Z"):
        codec.decode_json(arrays(100_000))
    with pytest.raises(DecodeError, match=r"\Amalformed JSON: invalid UTF-8\Z"):
        codec.decode_json(b'"\xff"')
