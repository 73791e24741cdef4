"""Turnstile's kernel: actors, supervision, virtual actors, time, messages and stores.

This module is the public surface of ``runtime``; everything else in the package is an
implementation detail that may move. The kernel knows nothing about agents, cron or watchers.
"""

from turnstile.runtime.actor import Actor, ActorRef
from turnstile.runtime.clock import Clock, MockWallClock, SystemClock, utc
from turnstile.runtime.codec import ClientMessage, Codec, Message
from turnstile.runtime.errors import (
    ActorCrashed,
    ActorError,
    ActorStopped,
    AlreadyExists,
    BlockedByAutomations,
    Busy,
    ConflictError,
    DecodeError,
    Fenced,
    InvalidArgument,
    LeaseLost,
    LimitExceeded,
    MailboxFull,
    MigrationError,
    NotFound,
    PlacedElsewhere,
    StoreError,
    StoreUnavailable,
    SupervisorEscalation,
    TimerError,
    TurnstileError,
    Unauthorized,
)
from turnstile.runtime.registry import Placement, Registry, RegistryStatistics, VirtualRef
from turnstile.runtime.store import Store, open_store
from turnstile.runtime.supervisor import CrashReport, Strategy, Supervisor, open_supervisor
from turnstile.runtime.timerwheel import TimerHandle, TimerWheel

__all__ = [
    # actors
    "Actor",
    "ActorRef",
    "Supervisor",
    "Strategy",
    "CrashReport",
    "open_supervisor",
    "Registry",
    "Placement",
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
    "StoreUnavailable",
    "NotFound",
    "PlacedElsewhere",
    "AlreadyExists",
    "BlockedByAutomations",
    "ConflictError",
    "LeaseLost",
    "Fenced",
    "MigrationError",
]
