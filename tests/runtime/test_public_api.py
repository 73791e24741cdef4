"""The kernel's public surface is deliberate: adding or removing a name is a visible change."""

from turnstile import runtime

EXPECTED = {
    "Actor", "ActorRef", "Supervisor", "Strategy", "CrashReport", "open_supervisor",
    "Registry", "RegistryStatistics", "VirtualRef",
    "Clock", "SystemClock", "MockWallClock", "utc", "TimerWheel", "TimerHandle",
    "Message", "ClientMessage", "Codec",
    "Store", "open_store",
    "TurnstileError", "ActorError", "MailboxFull", "ActorStopped", "ActorCrashed",
    "SupervisorEscalation", "DecodeError", "TimerError", "StoreError", "NotFound",
    "AlreadyExists", "ConflictError", "MigrationError", "InvalidArgument", "LimitExceeded",
    "Busy", "Unauthorized", "BlockedByAutomations",
}  # fmt: skip


def test_public_api_is_pinned():
    assert set(runtime.__all__) == EXPECTED
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None


def test_kernel_does_not_import_the_domain_packages():
    import sys

    for module in list(sys.modules):
        if module.startswith("runtime"):
            source = getattr(sys.modules[module], "__file__", None) or ""
            if source.endswith(".py"):
                text = open(source, encoding="utf-8").read()
                assert "from actors" not in text and "from tools" not in text, module
                assert "import actors" not in text and "import tools" not in text, module
