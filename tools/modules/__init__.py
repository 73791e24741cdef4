"""Modules: groups of tools that act on the world (``http``, ``filesystem``, ``shell``).

Each module has a ``register_*_module(registry, config, ...)`` function, its own config
dataclass, a ``trio.CapacityLimiter`` taken around every action (``max_concurrency``), and a
default policy per action as data (``POLICIES``): reads ``AUTO``, writes ``APPROVE``, running
programs ``BLOCK``. The policy layer (``tools.policy``) applies config overrides on top.

The filesystem module's ``Sandbox`` (the workspace root) is shared: ``http.download`` writes
into it and ``shell.run`` takes its working directory from it.
"""

from __future__ import annotations

from turnstile.tools.modules import filesystem, http, shell

__all__ = ["DEFAULT_POLICIES"]

#: Every module action's default policy, ``"module.action" -> "AUTO" | "APPROVE" | "BLOCK"``.
DEFAULT_POLICIES: dict[str, str] = {**http.POLICIES, **filesystem.POLICIES, **shell.POLICIES}
