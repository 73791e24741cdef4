"""What the tests share: fixtures' helpers, fakes and stand-ins, by theme.

Test modules import from here, never from one another; conftest.py files keep the pytest
fixtures and import their helpers from here.

- ``agents``: ``GatedAgent``, ``SeeingAgent``, ``FakeTurn``, the openai agent's ``ENV_VARS``.
- ``fake_openai``: a strict OpenAI chat-completions stand-in server.
- ``http``: ``read_request_head`` for tiny servers; the http module's test site and tools.
- ``events``: ``frame(event)``, the bytes a client gets for a session event.
- ``mock_node``: ``node()``, sessions and a scheduler wired by hand on trio's MockClock.
- ``node``: ``running_node()``, a real node on loopback, and its WebSocket ``Client``.
- ``notifier``: ``make_notifier``, ``events``, ``NoSockets``.
- ``readme``: README.md's embedding example (``readme_example``, ``EXPECTED_OUTPUT``).
- ``sessions``: ``NoTools`` and ``Recorder``, what a session actor talks to.
- ``watchers``: ``Probe`` and ``watching()``.
"""
