"""Turnstile's kernel: actors, supervision, virtual actors, time, messages and stores.

This module is the public surface of ``runtime``; everything else in the package is an
implementation detail that may move. The kernel knows nothing about agents, cron or watchers.
"""

from runtime.actor import Actor, ActorRef
from runtime.clock import Clock, MockWallClock, SystemClock, utc
from runtime.codec import ClientMessage, Codec, Message
from runtime.errors import (
    ActorCrashed,
    ActorError,
    ActorStopped,
    AlreadyExists,
    BlockedByAutomations,
    Busy,
    ConflictError,
    DecodeError,
    InvalidArgument,
    LimitExceeded,
    MailboxFull,
    MigrationError,
    NotFound,
    StoreError,
    SupervisorEscalation,
    TimerError,
    TurnstileError,
    Unauthorized,
)
from runtime.registry import Registry, RegistryStatistics, VirtualRef
from runtime.store import Store, open_store
from runtime.supervisor import CrashReport, Strategy, Supervisor, open_supervisor
from runtime.timerwheel import TimerHandle, TimerWheel

__all__ = [
    # actors
    "Actor",
    "ActorRef",
    "Supervisor",
    "Strategy",
    "CrashReport",
    "open_supervisor",
    "Registry",
    "RegistryStatistics",
    "VirtualRef",
    # time
    "Clock",
    "SystemClock",
    "MockWallClock",
    "utc",
    "TimerWheel",
    "TimerHandle",
    # messages
    "Message",
    "ClientMessage",
    "Codec",
    # stores
    "Store",
    "open_store",
    # errors
    "TurnstileError",
    "ActorError",
    "MailboxFull",
    "ActorStopped",
    "ActorCrashed",
    "SupervisorEscalation",
    "DecodeError",
    "InvalidArgument",
    "LimitExceeded",
    "Busy",
    "Unauthorized",
    "TimerError",
    "StoreError",
    "NotFound",
    "AlreadyExists",
    "BlockedByAutomations",
    "ConflictError",
    "MigrationError",
]
