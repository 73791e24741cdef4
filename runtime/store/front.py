"""The store: one class, assembled from one part per area.

Each part (``runtime/store/sessions.py``, ``inbox.py``, ``claims.py``, ``events.py``,
``nodes.py``, ``leases.py``, ``kv.py``) holds that area's operations
(:mod:`runtime.store.ops`: the SQL for both backends, written once where it is the same, and
how rows become records) next to the methods that check their arguments once, with the same
typed errors for both backends (:mod:`runtime.store._util`), encode JSON and times, and run
them. Adding an operation touches that part, and :mod:`runtime.store.records` when it answers
a new kind of record. The backends under it only run operations
(:mod:`runtime.store.backend`). :func:`runtime.store.open_store` hands out a :class:`Store`.
"""

from __future__ import annotations

from turnstile.runtime.store.announce import AnnounceMethods
from turnstile.runtime.store.claims import ClaimMethods
from turnstile.runtime.store.closing import CloseMethods
from turnstile.runtime.store.events import MAX_EVENT_TYPES, EventMethods
from turnstile.runtime.store.inbox import InboxMethods
from turnstile.runtime.store.kv import KVMethods
from turnstile.runtime.store.leases import LeaseMethods
from turnstile.runtime.store.nodes import NodeMethods
from turnstile.runtime.store.sessions import SessionMethods

__all__ = ["MAX_EVENT_TYPES", "Store", "StoreFront"]


class Store(
    SessionMethods,
    InboxMethods,
    AnnounceMethods,
    ClaimMethods,
    CloseMethods,
    EventMethods,
    NodeMethods,
    LeaseMethods,
    KVMethods,
):
    """The durable store: sessions, their inboxes and event logs, the nodes sharing it, small
    key-value state, and any feature's own tables (:meth:`run`).

    Args:
        engine: the backend (:class:`~runtime.store.backend.Backend`) that runs operations.
        clock: its wall time stamps every row.

    Attributes:
        backend: ``"sqlite"`` or ``"postgres"``.
        clock: the clock whose wall time stamps every row.
        engine: the backend object.
        claimer: the node incarnation ``claim_next_input`` records as the claimer of what it
            claims; None (no node registered through this store) records none.
    """


#: The name the store's one implementation had when a protocol stood beside it.
StoreFront = Store
