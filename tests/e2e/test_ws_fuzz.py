"""The WebSocket under fire: 10,000 generated malformed frames against a real node.

Every frame is bad in one way (broken JSON or UTF-8, nesting past the limit, wrong types,
unknown frame types, bad or foreign ids, over the size limit). Each must get exactly one typed
``error`` frame on a connection that keeps working, or, for an over-size frame, the protocol's
own close (1009). Meanwhile two other clients (the same user on another connection, and another
user) send messages and must see every turn, in order, with nothing foreign and no error. After
the barrage the process holds no more memory than after a warm-up round (within 10%).

The frames come from a seeded generator, so a failure names a frame that reproduces.
"""

from __future__ import annotations

import gc
import json
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.support.node import ALICE, BOB, Client, connect, new_session, running_node
from turnstile.actors.config import Limits

TOTAL = 10_000
WARM_UP = 1_000
BATCH = 250  # frames in flight before their answers are read
OVERSIZE = 20  # of TOTAL, each closes its connection
FRAME_LIMIT = 64 * 1024
#: a hang guard for one answer (real clock), not a promise: generous for a 2-core box at load 8
WAIT = 60
ERROR_CODES = {"bad_message", "invalid_argument", "not_found", "limit_exceeded"}

#: A session of Bob's: for Alice it must look exactly like a session nobody has.
FOREIGN = "bob-private"

VALID_SHAPES: list[dict] = [
    {"type": "attach", "session_id": "mine"},
    {"type": "detach", "session_id": "mine"},
    {"type": "send", "session_id": "mine", "content": "hi", "client_msg_id": "m"},
    {"type": "stop", "session_id": "mine"},
    {"type": "call", "id": "c", "session_id": "mine", "tool": "echo", "arguments": {}},
    {"type": "set_policy", "session_id": "mine", "policy": "enqueue"},
    {"type": "approve", "session_id": "mine", "approval_id": "a"},
    {"type": "deny", "session_id": "mine", "approval_id": "a"},
]

WRONG_VALUES: list[object] = [None, 0, -1, 1.5, True, [], {}, [1, 2], {"a": 1}, 2**64]

BAD_IDS: list[str] = [
    "",
    "x" * 129,
    "trailing\n",
    "alice/mine",
    "bob/bob-private",
    "../mine",
    "sp ace",
    "nul\x00",
    "é",
    "mine\r\n",
    FOREIGN,  # well formed, but Bob's: not_found, exactly like a missing one
    "nobody-has-this",
]


def _bad_json(rng: random.Random) -> bytes:
    shape = json.dumps(rng.choice(VALID_SHAPES))
    kind = rng.randrange(5)
    if kind == 0:  # cut short
        return shape[: rng.randrange(1, len(shape) - 1)].encode()
    if kind == 1:  # trailing garbage
        return (shape + rng.choice(["x", "}", ",", " 1", "]"])).encode()
    if kind == 2:  # noise
        return bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 64)))
    if kind == 3:  # not JSON values at all
        return rng.choice([b"NaN", b"{'type': 'send'}", b"{type: send}", b"\x00", b"   "])
    return shape.replace('"', "'", rng.randrange(1, 4)).encode()


def _bad_utf8(rng: random.Random) -> bytes:
    shape = json.dumps(rng.choice(VALID_SHAPES)).encode()
    cut = rng.randrange(1, len(shape) - 1)
    poison = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
    return shape[:cut] + poison + shape[cut:]


def _deep(rng: random.Random) -> bytes:
    depth = rng.randrange(65, 3000)
    if rng.random() < 0.5:
        value = "[" * depth + "]" * depth
    else:
        value = '{"a":' * depth + "1" + "}" * depth
    frame = rng.choice(VALID_SHAPES)
    field = rng.choice([k for k in frame if k != "type"])
    prefix = json.dumps({**frame, field: None}).rsplit("null", 1)
    return (prefix[0] + value + prefix[1]).encode()


def _wrong_type(rng: random.Random) -> bytes:
    frame = dict(rng.choice(VALID_SHAPES))
    field = rng.choice([k for k in frame if k != "type"])
    if rng.random() < 0.3:
        del frame[field]  # a required field missing (optional ones get a wrong value instead)
        if field in ("client_msg_id", "arguments"):
            frame[field] = rng.choice([0, [], True])
    else:
        value = rng.choice(WRONG_VALUES)
        if field == "arguments" and isinstance(value, dict):
            value = [value]
        if field == "client_msg_id" and value is None:  # optional: null is a valid "none"
            value = 0
        frame[field] = value
    if frame["type"] == "attach" and rng.random() < 0.5:  # a good id, a bad cursor
        frame = {"type": "attach", "session_id": rng.choice(["mine", FOREIGN])}
        frame["after_seq"] = rng.choice([-1, 2**63, "3", 1.5, [], {}])
    return json.dumps(frame).encode()


def _unknown_type(rng: random.Random) -> bytes:
    return json.dumps(
        rng.choice(
            [
                {"type": rng.choice(["hax", "ATTACH", "attach ", "", "result", "error", "ack"])},
                {"type": None, "session_id": "mine"},
                {"type": 7},
                {"session_id": "mine"},
                [],
                ["attach", "mine"],
                "attach",
                42,
                None,
            ]
        )
    ).encode()


def _bad_id(rng: random.Random) -> bytes:
    frame = dict(rng.choice(VALID_SHAPES))
    # Detaching a well-formed id nobody is attached to is a harmless "detached": not malformed.
    frame["session_id"] = rng.choice(BAD_IDS[:-2] if frame["type"] == "detach" else BAD_IDS)
    if rng.random() < 0.3 and frame["type"] in ("approve", "deny"):
        frame["session_id"] = "mine"
        frame["approval_id"] = rng.choice(["x" * 129, "no-such-approval", 5])
    if frame["type"] == "call" and rng.random() < 0.3:
        frame["id"] = rng.choice(["x" * 129, 5, None])
    return json.dumps(frame).encode()


GENERATORS: list[Callable[[random.Random], bytes]] = [
    _bad_json,
    _bad_utf8,
    _deep,
    _wrong_type,
    _unknown_type,
    _bad_id,
]


def malformed_frames(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.choice(GENERATORS)(rng) for _ in range(count)]


def rss_bytes() -> int:
    pages = Path("/proc/self/statm").read_text().split()[1]
    return int(pages) * os.sysconf("SC_PAGE_SIZE")


async def _barrage(client: Client, frames: list[bytes]) -> None:
    """Send ``frames`` in batches; each must be answered by exactly one typed error frame."""
    for start in range(0, len(frames), BATCH):
        batch = frames[start : start + BATCH]
        for raw in batch:
            await client.ws.send_message(raw)  # bytes: a binary frame, read as JSON all the same
        for raw in batch:
            with trio.fail_after(WAIT):
                frame = json.loads(await client.ws.get_message())
            assert frame["type"] == "error", (raw[:200], frame)
            assert frame["code"] in ERROR_CODES, (raw[:200], frame)
            assert frame["message"], (raw[:200], frame)
            if frame.get("session_id") == FOREIGN:
                assert frame["code"] == "not_found", (raw[:200], frame)


async def _bystander(node, token: str, session_id: str, done: trio.Event, log: list[dict]):
    """Send a message now and then until ``done``; every turn must complete, in order."""
    async with connect(node, token) as client:
        await client.send(type="attach", session_id=session_id)
        await client.expect("attached", session_id=session_id)
        sent = 0
        while not done.is_set():
            await client.send(
                type="send", session_id=session_id, content=f"m{sent}", client_msg_id=str(sent)
            )
            ack = await client.expect("ack", client_msg_id=str(sent))
            end = await client.expect("stream_end", input_id=ack["input_id"])
            assert (end["status"], end["text"]) == ("completed", f"You said: m{sent}")
            sent += 1
            await trio.sleep(0.01)  # pace, not synchronisation: the turn above has ended
        log.extend(client.frames)
        assert sent > 0


@pytest.mark.slow
async def test_ten_thousand_malformed_frames_get_typed_errors_and_harm_nobody(tmp_path):
    frames = malformed_frames(seed=9, count=TOTAL - OVERSIZE)
    async with running_node(tmp_path, limits=Limits(max_frame_bytes=FRAME_LIMIT)) as node:
        await new_session(node, "mine")
        await new_session(node, FOREIGN, token=BOB)
        done = trio.Event()
        seen: dict[str, list[dict]] = {"alice": [], "bob": []}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_bystander, node, ALICE, "mine", done, seen["alice"])
            nursery.start_soon(_bystander, node, BOB, FOREIGN, done, seen["bob"])
            async with connect(node) as fuzzer:
                await _barrage(fuzzer, frames[:WARM_UP])
                gc.collect()
                warm = rss_bytes()
                await _barrage(fuzzer, frames[WARM_UP:])
                # The connection that took every one of them still works.
                await fuzzer.send(type="attach", session_id="mine")
                await fuzzer.expect("attached", session_id="mine")
            for n in range(OVERSIZE):  # over the limit: the protocol's own close, then reconnect
                async with connect(node) as client:
                    await client.ws.send_message("x" * (FRAME_LIMIT + 1 + n))
                    with pytest.raises(ConnectionClosed) as closed:
                        with trio.fail_after(WAIT):
                            await client.ws.get_message()
                    assert closed.value.reason.code == 1009
            done.set()
        gc.collect()
        after = rss_bytes()
    assert after <= warm * 1.10, f"memory grew from {warm} to {after} bytes"
    for user, session_id in (("alice", "mine"), ("bob", FOREIGN)):
        frames_seen = seen[user]
        assert not [f for f in frames_seen if f["type"] == "error"], user
        assert {f["session_id"] for f in frames_seen if "session_id" in f} == {session_id}
        seqs = [f["seq"] for f in frames_seen if "seq" in f and f["type"] != "session_sync"]
        assert seqs == list(range(1, len(seqs) + 1)), user  # every event, once, in order
