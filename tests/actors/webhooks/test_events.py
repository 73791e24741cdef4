"""The webhooks feature's event encodes as docs/protocol.md documents it."""

from __future__ import annotations

from tests.support.events import frame
from turnstile.actors.webhooks.events import SourceBinding

TAIL = ',"session_id":"s1","seq":1,"ts":"2025-01-01T00:00:00Z"}'


def test_a_binding_names_the_action_the_source_and_how():
    event = SourceBinding(action="bound", source="github:acme/app#3", via="pull_request")
    assert (
        frame(event)
        == (
            '{"action":"bound","source":"github:acme/app#3","via":"pull_request",'
            '"type":"source_binding"' + TAIL
        ).encode()
    )
