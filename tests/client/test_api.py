"""``turnstile.client``'s public surface, and that importing it loads no part of the server
(the import contract checks the imports; this checks what a fresh interpreter loads)."""

from __future__ import annotations

import json
import subprocess
import sys

import turnstile.client


def test_the_public_names():
    assert sorted(turnstile.client.__all__) == sorted(
        [
            "open_client",
            "Client",
            "SessionStream",
            "StreamStatistics",
            "TopicStream",
            "TopicEvent",
            "TopicReset",
            "new_client_msg_id",
            "Event",
            "UnknownEvent",
            "decode_event",
            "decode_topic_event",
            "Ack",
            "ApprovalDecided",
            "SessionEvent",
            "TurnQueued",
            "StreamStart",
            "ThinkingDelta",
            "StreamDelta",
            "ToolStarted",
            "ToolCalled",
            "StreamEnd",
            "SessionSync",
            "ApprovalRequired",
            "ApprovalResolved",
            "JobUpdate",
            "RecallUpdate",
            "WatcherUpdate",
            "Notification",
            "MemoryChange",
            "FactSaved",
            "FactForgotten",
            "SummaryChanged",
            "MemoryDeleted",
            "TurnstileClientError",
            "BadRequest",
            "Unauthorized",
            "Forbidden",
            "NotFound",
            "SessionDeleted",
            "Conflict",
            "PlacedElsewhere",
            "LimitExceeded",
            "ServerError",
            "StoreUnavailable",
            "ToolError",
            "ConnectionLost",
        ]
    )
    for name in turnstile.client.__all__:
        assert getattr(turnstile.client, name) is not None


def is_events(module: str) -> bool:
    return module.startswith("turnstile.actors.") and module.endswith((".events", ".event_types"))


def test_importing_the_client_loads_no_part_of_the_server():
    code = (
        "import json, sys, turnstile.client, turnstile.client.terminal; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('turnstile'))))"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )
    # the features' packages are loaded as the parents of their event modules; nothing else
    allowed = {"turnstile.actors", *(m.rsplit(".", 1)[0] for m in loaded if is_events(m))}
    server = [
        m
        for m in loaded
        if m.startswith(("turnstile.runtime", "turnstile.tools", "turnstile.actors"))
        and not is_events(m)
        and m not in allowed
    ]
    assert server == []
    assert "turnstile.protocol" in loaded
