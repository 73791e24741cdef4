"""The binding tools: ``bind_source``, ``unbind_source``, ``list_sources``.

A session binds *itself* (the calling session, never another: no argument names a session) to
a source key, so that the CI events of that pull request or branch wake it:
``github:owner/repo#<PR number>`` or ``github:owner/repo:branch:<branch>``. Opening a pull
request through ``http.post`` binds the session implicitly (``service.Ingress.observe_tool``),
so an agent that pushes and opens a PR need not call these at all.

Policies: all AUTO. Binding changes nothing outside the node and nothing of anyone else's:
events from a source the node already receives are routed to a session the caller owns, which
its owner sees (``source_binding`` events, ``GET /sessions/{id}/bindings``) and can undo.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from turnstile.actors.webhooks.bindings import Binding
from turnstile.actors.webhooks.service import Ingress, iso
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = ["BindParams", "ListParams", "binding_view", "register_binding_tools"]

Source = Annotated[str, msgspec.Meta(min_length=8, max_length=420)]


class BindParams(msgspec.Struct, forbid_unknown_fields=True):
    """``bind_source`` and ``unbind_source``."""

    #: github:owner/repo#<PR number> or github:owner/repo:branch:<branch>
    source: Source


class ListParams(msgspec.Struct, forbid_unknown_fields=True):
    """``list_sources``: no arguments."""


def binding_view(binding: Binding) -> dict[str, Any]:
    """A binding as a tool or route shows it (no session key: the caller knows its session)."""
    return {"source": binding.source, "via": binding.via, "created_at": iso(binding.created_at)}


def register_binding_tools(tools: ToolRegistry, ingress: Ingress) -> None:
    """Register the three tools over ``ingress``."""

    async def bind_source(call: ToolCall, params: BindParams) -> dict[str, Any]:
        binding, created = await ingress.bind(call.owner, call.session_id, params.source, "tool")
        return {**binding_view(binding), "created": created}

    async def unbind_source(call: ToolCall, params: BindParams) -> dict[str, Any]:
        removed = await ingress.unbind(call.session_id, params.source, "tool")
        return {"source": params.source, "removed": removed}

    async def list_sources(call: ToolCall, params: ListParams) -> dict[str, Any]:
        return {"bindings": [binding_view(b) for b in await ingress.bindings(call.session_id)]}

    tools.register(
        "bind_source",
        BindParams,
        bind_source,
        "Wake this session with the CI failures of a pull request or branch: source is "
        "github:owner/repo#<PR number> or github:owner/repo:branch:<branch>. Opening a PR with "
        "http.post binds it already.",
    )
    tools.register(
        "unbind_source",
        BindParams,
        unbind_source,
        "Stop waking this session with a source's CI events (as bind_source names it).",
    )
    tools.register(
        "list_sources",
        ListParams,
        list_sources,
        "The sources (pull requests, branches) whose CI events wake this session.",
    )
