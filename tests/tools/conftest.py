"""Fixtures of the tool tests: ``server``, the http module's test site on loopback."""

from __future__ import annotations

import pytest
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from tests.support.http import APP


@pytest.fixture
async def server(nursery) -> str:
    """The test server's base URL (``http://127.0.0.1:<port>``)."""
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    (bind,) = await nursery.start(hypercorn_serve, APP, config)
    return bind
