"""The webhooks API's request and response bodies (msgspec Structs): what the routes decode and
answer, and what ``/openapi.json`` documents for them."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

from turnstile.actors.webhooks.tools import Source

__all__ = [
    "Accepted",
    "Answered",
    "BindBody",
    "BindingList",
    "BindingMade",
    "BindingView",
    "DeliveriesQuery",
    "DeliveryList",
    "DeliveryView",
    "TargetView",
    "UnboundQuery",
    "UnroutedList",
    "UnroutedQuery",
    "UnroutedView",
]


class BindBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /sessions/{id}/bindings``."""

    source: Source


class UnboundQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``DELETE /sessions/{id}/bindings``'s query."""

    source: Source


class UnroutedQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``GET /webhooks/unrouted``'s query."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100
    all_users: bool = False


class DeliveriesQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``GET /webhooks/deliveries``'s query."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100
    all_users: bool = False


class Accepted(msgspec.Struct, omit_defaults=True):
    """A new delivery, recorded and queued in ``sessions`` sessions (or recorded
    ``unrouted``: no session was bound to it); or, while the store is unavailable, ``spooled``:
    kept on the node's disk and ingested once the store is back (``sessions`` and ``unrouted``
    are not known yet, and absent)."""

    accepted: bool
    sessions: int | UnsetType = UNSET
    unrouted: bool | UnsetType = UNSET
    spooled: bool | UnsetType = UNSET


class Answered(msgspec.Struct, omit_defaults=True):
    """A delivery that starts nothing new: ``duplicate`` (recorded before), GitHub's ``ping``
    (``ok``, ``event``), or ``ignored`` with the ``reason`` (an event that wakes nobody)."""

    duplicate: bool | UnsetType = UNSET
    ok: bool | UnsetType = UNSET
    event: str | UnsetType = UNSET
    ignored: bool | UnsetType = UNSET
    reason: str | UnsetType = UNSET


class UnroutedView(msgspec.Struct, kw_only=True):
    """A delivery no session was bound to. ``owner`` only with ``all_users``."""

    delivery_id: str
    hook: str
    event: str
    source_ref: str
    source_keys: list[str]
    owner: str | None | UnsetType = UNSET
    received_at: str
    content: str
    payload: dict[str, Any]


class UnroutedList(msgspec.Struct):
    """``GET /webhooks/unrouted``: newest first."""

    unrouted: list[UnroutedView]


class TargetView(msgspec.Struct, kw_only=True):
    """A session a delivery went to (its name), and how far it got. ``owner`` only with
    ``all_users``."""

    session: str
    owner: str | UnsetType = UNSET
    state: str
    input_id: int | None
    attempts: int
    error: str | None


class DeliveryView(msgspec.Struct, kw_only=True):
    """A recorded delivery: ``state`` ``routed`` or ``unrouted``, and its targets (only the
    caller's sessions, unless all users' were asked for)."""

    delivery_id: str
    hook: str
    event: str
    source_ref: str
    state: str
    owner: str | None | UnsetType = UNSET
    received_at: str
    targets: list[TargetView]


class DeliveryList(msgspec.Struct, omit_defaults=True):
    """``GET /webhooks/deliveries``: newest first; with ``all_users``, also the node's
    ``counts`` by hook: each outcome, and ``refused`` by reason."""

    deliveries: list[DeliveryView]
    counts: dict[str, dict[str, Any]] | UnsetType = UNSET


class BindingView(msgspec.Struct):
    """A source whose CI events wake the session, how it was bound, and when."""

    source: str
    via: str
    created_at: str


class BindingList(msgspec.Struct):
    """``GET /sessions/{id}/bindings``."""

    bindings: list[BindingView]


class BindingMade(BindingView):
    """``POST /sessions/{id}/bindings``: the binding; ``created`` false when it was bound
    already."""

    created: bool
