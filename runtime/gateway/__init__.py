"""The gateway: HTTP and WebSocket access to sessions, with auth and limits."""

from turnstile.runtime.gateway.app import build_app
from turnstile.runtime.gateway.auth import Auth
from turnstile.runtime.gateway.backend import Attached, SessionBackend, Submitted, Subscriber
from turnstile.runtime.gateway.connection import Connection, ConnectionLimits
from turnstile.runtime.gateway.frames import PROTOCOL_VERSION
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute
from turnstile.runtime.gateway.topics import TopicEvent, TopicHead, TopicLog, UserTopics

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
    "ApiRequest",
    "HttpRoute",
    "TopicEvent",
    "TopicHead",
    "TopicLog",
    "UserTopics",
]
