"""A Python client of a Turnstile node (``docs/client.md``): async, for trio and asyncio.

    async with open_client("http://127.0.0.1:8765", token) as client:
        session = await client.create_session()
        async with client.attach(session.id) as stream:
            await stream.send("hello")
            async for event in stream:
                if isinstance(event.data, StreamEnd):
                    print(event.data.text)
                    break

It speaks the protocol with its own Structs (``turnstile.protocol``, the features' session and
topic events) and loads no part of the server (an import contract checks it). The
``turnstile`` command's client commands are built on it (``turnstile.client.commands``).
"""

from turnstile.actors.execution.events import ApprovalRequired, ApprovalResolved
from turnstile.actors.memory.events import (
    FactForgotten,
    FactSaved,
    MemoryChange,
    MemoryDeleted,
    SummaryChanged,
)
from turnstile.actors.notifications.events import Notification
from turnstile.actors.scheduling.events import JobUpdate, RecallUpdate
from turnstile.actors.sessions.event_types import (
    SessionEvent,
    SessionSync,
    StreamDelta,
    StreamEnd,
    StreamStart,
    ThinkingDelta,
    ToolCalled,
    ToolStarted,
    TurnQueued,
)
from turnstile.actors.watchers.events import WatcherUpdate
from turnstile.client import _errors
from turnstile.client._client import Client, open_client
from turnstile.client._errors import *  # noqa: F403 (its __all__: the errors)
from turnstile.client._events import Event, UnknownEvent, decode_event
from turnstile.client._session import SessionStream
from turnstile.client._stream import StreamStatistics
from turnstile.client._topic import TopicEvent, TopicReset, TopicStream, decode_topic_event
from turnstile.client._wire import new_client_msg_id
from turnstile.protocol import Ack, ApprovalDecided

__all__ = [
    "open_client",
    "Client",
    "SessionStream",
    "StreamStatistics",
    "TopicStream",
    "TopicEvent",
    "TopicReset",
    "new_client_msg_id",
    # what comes back
    "Event",
    "UnknownEvent",
    "decode_event",
    "decode_topic_event",
    "Ack",
    "ApprovalDecided",
    # the session events most clients read
    "SessionEvent",
    "TurnQueued",
    "StreamStart",
    "ThinkingDelta",
    "StreamDelta",
    "ToolStarted",
    "ToolCalled",
    "StreamEnd",
    "SessionSync",
    "ApprovalRequired",
    "ApprovalResolved",
    "JobUpdate",
    "RecallUpdate",
    "WatcherUpdate",
    "Notification",
    # the memory topic's events (TopicEvent.data)
    "MemoryChange",
    "FactSaved",
    "FactForgotten",
    "SummaryChanged",
    "MemoryDeleted",
]
# the errors, with the hierarchy in _errors' docstring
__all__ += _errors.__all__
