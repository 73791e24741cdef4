"""The gateway: HTTP and WebSocket access to sessions, with auth and limits."""

from runtime.gateway.app import build_app
from runtime.gateway.auth import Auth
from runtime.gateway.backend import Attached, SessionBackend, Submitted, Subscriber
from runtime.gateway.connection import Connection, ConnectionLimits
from runtime.gateway.frames import PROTOCOL_VERSION

__all__ = [
    "build_app",
    "Auth",
    "Attached",
    "SessionBackend",
    "Submitted",
    "Subscriber",
    "Connection",
    "ConnectionLimits",
    "PROTOCOL_VERSION",
]
