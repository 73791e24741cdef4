"""Turnstile: an actor-model runtime for AI-agent sessions, on trio.

The installed package holds three layers, importable on their own:

* ``turnstile.runtime`` — the kernel (actors, mailboxes, supervision, registry, timer wheel,
  clock, codec, errors), the store engine and the gateway core. It names no feature.
* ``turnstile.tools`` — the tool system every feature uses (registry, policies, SSRF guard, the
  http, filesystem and shell modules).
* ``turnstile.actors`` — one package per feature (sessions, scheduling, watchers,
  notifications, execution) and the composition root, :func:`open_node`.

The names below are the embedding API; they load lazily, so ``import turnstile.runtime`` does
not pull in every feature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Agent", "Config", "Node", "load_config", "open_node"]

_LAZY = {
    "open_node": "turnstile.actors.node",
    "Node": "turnstile.actors.node",
    "Config": "turnstile.actors.config",
    "load_config": "turnstile.actors.config",
    "Agent": "turnstile.actors.sessions.agents",
}

if TYPE_CHECKING:  # pragma: no cover
    from turnstile.actors.config import Config, load_config
    from turnstile.actors.node import Node, open_node
    from turnstile.actors.sessions.agents import Agent


def __getattr__(name: str) -> Any:
    """Import the embedding API on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'turnstile' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
