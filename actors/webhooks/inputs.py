"""The webhooks' turn input: an event an external system sent, as a session's inbox keeps it.

The feature writes it (``service.inbox_payload``: the sender's fields, then where they came
from) under ``source="webhook"`` and registers its kind with the sessions feature when it
starts. Its keys are its own: a GitHub failure's ``run_id`` is the CI run's id, which nothing
outside this feature reads (it is not a scheduler run).
"""

from __future__ import annotations

from typing import Any

import msgspec

from turnstile.actors.sessions.inputs import TurnPayload

__all__ = ["WEBHOOK_SOURCE", "WebhookEvent", "webhook_payload"]

#: The inbox source of every webhook event.
WEBHOOK_SOURCE = "webhook"


class WebhookEvent(TurnPayload, frozen=True, kw_only=True):
    """An event an external system sent (``source="webhook"``); its other keys (a failing CI
    run's ``name``, ``conclusion``, ``output_title``… or a hook's ``data``) reach the agent in
    ``TurnInput.payload`` as they were sent.

    Attributes:
        hook: who sent it: ``github`` or a declared hook's name.
        event: its kind (``check_run``, ``workflow_run``, or the sender's ``type``).
        delivery_id: the sender's delivery, unique (``github:<X-GitHub-Delivery>``).
        source_ref: what it is about (``owner/repo#check_run:<id>``).
    """

    hook: str = ""
    event: str = ""
    delivery_id: str = ""
    source_ref: str = ""


def webhook_payload(fields: dict[str, Any], event: WebhookEvent) -> dict[str, Any]:
    """The payload to store: the sender's ``fields`` as they were sent, then ``event``'s own
    keys (which win), less ``content`` (the inbox keeps it beside the payload).

    Built from the Struct, so what is written is what the reader decodes.
    """
    own = msgspec.to_builtins(event)
    own.pop("content", None)
    own.pop("was_injected", None)
    return {**fields, **own}
