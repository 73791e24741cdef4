"""The console feature's config section: ``[console]``, the web console at ``/console``.

Example::

    [console]
    enabled = true   # false: /console answers 404 like any unknown route

The console is served by the node's own gateway, so it listens where the node listens
(loopback unless ``host`` says otherwise) and its WebSocket is checked against
``allowed_origins`` like any browser's: served on another address, add that origin there.
"""

from __future__ import annotations

import msgspec

__all__ = ["ConsoleConfig"]


class ConsoleConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[console]``.

    Attributes:
        enabled: serve the console's page and scripts at ``/console``.
    """

    enabled: bool = True
