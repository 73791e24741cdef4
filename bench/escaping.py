"""Micro-benchmark: what the U+0000 escape (``runtime/store/escaping.py``) costs the hot paths.

``python -m bench.escaping`` times, per call, the store's JSON encode and decode of typical
payloads (a user message, a text delta, a 4 KB tool result, a scheduled turn's input) the way
the code before encoded them (msgspec alone) and the way it does now (msgspec plus the escape),
and the PostgreSQL ``text`` codec on a short id. Best of five repeats, in nanoseconds.
"""

from __future__ import annotations

import timeit
from typing import Any

import msgspec

from turnstile.runtime.store import decode_json, encode_json
from turnstile.runtime.store.escaping import escape_text, unescape_text

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()


def old_encode_json(value: dict[str, Any], what: str = "payload") -> str:
    """``encode_json`` as it was before the escape (c7f86ef^)."""
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a dict, not {type(value).__name__}")
    try:
        return _enc.encode(value).decode()
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(f"{what} is not JSON-encodable: {exc}") from None


def old_decode_json(text: str | bytes) -> Any:
    """``decode_json`` as it was before the escape."""
    return _dec.decode(text)


PAYLOADS = {
    "user message": {"text": "what's the weather in Zürich tomorrow?", "client": "web"},
    "text delta": {"delta": "Sure — here is a summary of the page", "turn": 7},
    "tool result 4KB": {
        "tool": "http.get",
        "call_id": "call_01",
        "result": {"status": 200, "body": ("lorem ipsum dolor sit amet, " * 150)[:4096]},
    },
    "scheduled input": {"prompt": "check the build", "job_id": "j-1", "kind": "cron"},
    "non-ASCII 4KB": {"tool": "http.get", "result": {"body": ("Grüße, 東京 — ok\n" * 300)[:4096]}},
    "with NUL 4KB": {"tool": "http.get", "result": {"body": ("ab\x00cd" * 820)[:4096]}},
}


def _best(stmt, number: int = 20000) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e9


def main() -> None:
    print(
        f"{'payload':<18} {'enc before':>10} {'enc after':>10} {'dec before':>10} {'dec after':>10}"
    )
    for name, value in PAYLOADS.items():
        text = encode_json(value)
        old_text = old_encode_json(value)
        row = (
            _best(lambda: old_encode_json(value)),  # noqa: B023
            _best(lambda: encode_json(value)),  # noqa: B023
            _best(lambda: old_decode_json(old_text)),  # noqa: B023
            _best(lambda: decode_json(text)),  # noqa: B023
        )
        print(f"{name:<18} " + " ".join(f"{ns:>10.0f}" for ns in row))
    key = "ada/build-watcher"
    print(
        f"text codec on {key!r}: escape {_best(lambda: escape_text(key)):.0f} ns,"
        f" unescape {_best(lambda: unescape_text(key)):.0f} ns"
    )


if __name__ == "__main__":
    main()
