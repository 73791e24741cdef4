"""The scheduling feature's config section: ``[heartbeat]``, the agent's heartbeat defaults."""

from __future__ import annotations

import msgspec

__all__ = ["HeartbeatDefaults"]


class HeartbeatDefaults(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The agent's heartbeat defaults, ``[heartbeat]``: what ``set_heartbeat`` uses for any
    setting the call leaves out (validated by the tool's own bounds when the node starts)."""

    interval_minutes: int | None = None
    checklist: str | None = None
    active_hours_start: str | None = None
    active_hours_end: str | None = None
    timezone: str | None = None
    model_override: str | None = None
    tool_profile: str | None = None
    max_tokens: int | None = None
    suppress_threshold: int | None = None
    on_error: str | None = None
    session: str | None = None
    alert_channel: str | None = None
