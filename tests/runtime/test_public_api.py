"""The kernel's public surface is deliberate: adding or removing a name is a visible change."""

from turnstile import runtime

EXPECTED = {
    "Actor", "ActorRef", "Supervisor", "Strategy", "CrashReport", "open_supervisor",
    "Registry", "RegistryStatistics", "VirtualRef", "Placement", "PlacedElsewhere",
    "Clock", "SystemClock", "MockWallClock", "utc", "TimerWheel", "TimerHandle",
    "Message", "ClientMessage", "Codec",
    "Store", "open_store",
    "TurnstileError", "ActorError", "MailboxFull", "ActorStopped", "ActorCrashed",
    "SupervisorEscalation", "DecodeError", "TimerError", "StoreError",
    "StoreUnavailable", "NotFound",
    "AlreadyExists", "ConflictError", "LeaseLost", "Fenced", "MigrationError",
    "InvalidArgument", "LimitExceeded",
    "Busy", "Unauthorized", "BlockedByAutomations",
}  # fmt: skip


def test_public_api_is_pinned():
    assert set(runtime.__all__) == EXPECTED
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None


# That the kernel imports no feature is an import contract (pyproject.toml [tool.importlinter],
# checked by scripts/lint-imports.sh over every module file), not a test of what happens to be
# imported.
