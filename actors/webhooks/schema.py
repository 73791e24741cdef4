"""The webhooks feature's tables: its own migration set, ``"webhooks"``.

=======================  ========================================================================
``webhook_deliveries``   one delivery a sender made, by its id (``github:<X-GitHub-Delivery>``,
                         ``hook:<name>:<webhook-id>``): the primary key is what makes a
                         redelivery do nothing, however many arrive at once. ``event_key``
                         (step 2) is what the event is, whatever delivery carries it
                         (``github:owner/repo#check_run:<id>:<attempt>:<conclusion>``; null for
                         Standard Webhooks, whose signed id is the event's, and for rows from
                         before it): unique too, so the same failure resent under a new
                         delivery id does nothing either. ``state`` is
                         ``routed`` (it has targets) or ``unrouted`` (nobody to deliver to:
                         kept, listed over HTTP, never dropped). Kept ``[webhooks]
                         retention_days``, then pruned.
``webhook_targets``      one session a delivery goes to: ``accepted`` when recorded (with the
                         delivery, in one transaction), ``delivered`` once the session's inbox
                         holds it (``input_id``), ``dropped`` when the session was deleted first.
                         ``claimed_until`` is a lease, so one deliverer at a time tries it.
``webhook_bindings``     a session bound to a source key (``github:owner/repo#3``): events for
                         the key go to it. Deleted with the session.
=======================  ========================================================================

Bindings and targets carry the session's owner, so every listing filters on the caller.
"""

from __future__ import annotations

from turnstile.runtime.store import Migration, MigrationSet

__all__ = ["WEBHOOKS"]


def _tables(time: str, json: str, serial: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE webhook_deliveries (
            id TEXT PRIMARY KEY,
            hook TEXT NOT NULL,
            event TEXT NOT NULL,
            source_ref TEXT NOT NULL,
            source_keys {json} NOT NULL,
            owner TEXT,
            state TEXT NOT NULL CHECK (state IN ('routed', 'unrouted')),
            content TEXT NOT NULL,
            payload {json} NOT NULL,
            received_at {time} NOT NULL
        )""",
        "CREATE INDEX webhook_deliveries_received ON webhook_deliveries (received_at)",
        "CREATE INDEX webhook_deliveries_unrouted ON webhook_deliveries (owner, received_at)"
        " WHERE state = 'unrouted'",
        f"""CREATE TABLE webhook_targets (
            delivery_id TEXT NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
            session_key TEXT NOT NULL,
            owner TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('accepted', 'delivered', 'dropped')),
            input_id {serial},
            attempts INTEGER NOT NULL DEFAULT 0,
            claimed_until {time},
            error TEXT,
            updated_at {time} NOT NULL,
            PRIMARY KEY (delivery_id, session_key)
        )""",
        "CREATE INDEX webhook_targets_accepted ON webhook_targets (updated_at)"
        " WHERE state = 'accepted'",
        "CREATE INDEX webhook_targets_session ON webhook_targets (session_key)",
        f"""CREATE TABLE webhook_bindings (
            session_key TEXT NOT NULL,
            source_key TEXT NOT NULL,
            owner TEXT NOT NULL,
            via TEXT NOT NULL,
            created_at {time} NOT NULL,
            PRIMARY KEY (session_key, source_key)
        )""",
        "CREATE INDEX webhook_bindings_source ON webhook_bindings (source_key)",
    )


#: Step 2: a delivery's event identity, unique where there is one (nulls never collide, on
#: either database), so rows recorded by the release before it keep none and stay valid.
_EVENT_KEY = (
    "ALTER TABLE webhook_deliveries ADD COLUMN event_key TEXT",
    "CREATE UNIQUE INDEX webhook_deliveries_event ON webhook_deliveries (event_key)",
)

#: The feature's migration set.
WEBHOOKS = MigrationSet(
    "webhooks",
    (
        Migration(
            1,
            "deliveries, targets, bindings",
            sqlite=_tables("TEXT", "TEXT", "INTEGER"),
            postgres=_tables("TIMESTAMPTZ", "JSONB", "BIGINT"),
        ),
        Migration(2, "delivery event identity", _EVENT_KEY),
    ),
)
