"""The watchers feature's config section, ``[watchers]``: how many watchers a session may
run, how many checks run at once on a node, and how often their state is saved."""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["WatchersConfig"]


class WatchersConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[watchers]``.

    Attributes:
        max_per_session: watchers one session may have (running or paused); one more is
            refused with ``limit_exceeded``.
        max_concurrent_checks: checks running at once on this node, all sessions together;
            the others wait for a slot (late, never skipped).
        persist_interval: seconds between saves of the watchers' state (counts, history, last
            value): what a crash can cost, and what moves to another node on failover.
    """

    max_per_session: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 20
    max_concurrent_checks: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 64
    persist_interval: Annotated[float, msgspec.Meta(ge=0.1, le=60)] = 1.0
