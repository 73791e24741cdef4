"""The Turnstile protocol's shared types (``docs/protocol.md``): what the node and its clients
both need, and nothing of either. It imports only msgspec (an import contract), so
``turnstile.client`` can use it without loading the server.
"""

from turnstile.protocol import frames
from turnstile.protocol.frames import *  # noqa: F403 (its __all__: the frames and their types)

# The package's names are the frames module's, listed once there; the sessions' HTTP answers
# are imported from ``turnstile.protocol.sessions``.
__all__ = frames.__all__
