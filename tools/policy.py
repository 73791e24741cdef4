"""Tool policies: which tools run on their own, which need a person's approval, which never run.

Every tool has a default policy (reads ``AUTO``; writes and commands ``APPROVE`` or ``BLOCK``),
and the config file overrides it per action or per module::

    [policies]
    "shell.run" = "APPROVE"      # one action
    "http.*" = "AUTO"            # a whole module

Resolution: the exact name, then ``module.*``, then the tool's default. ``BLOCK`` refuses the
call with ``blocked``; ``APPROVE`` asks the session's clients (an ``approval_required`` event,
answered by an ``approve`` / ``deny`` frame or over HTTP) and runs the tool only if a person
approves before the timeout — silence is a denial. Every path that runs a tool — an agent's
call, a client's ``call`` frame, a scheduled ``tool_call``, ``run_parallel``, background tasks —
goes through the registry, so no primitive bypasses the policy.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from turnstile.runtime.errors import InvalidArgument

__all__ = ["Policy", "PolicyTable"]


class Policy(enum.Enum):
    """What happens when a tool is called."""

    AUTO = "AUTO"
    APPROVE = "APPROVE"
    BLOCK = "BLOCK"


class PolicyTable:
    """Resolves a tool name to its policy.

    Args:
        overrides: ``{"module.action" | "module.*": "AUTO" | "APPROVE" | "BLOCK"}`` from config.

    Raises:
        InvalidArgument: an override names an unknown policy.
    """

    def __init__(self, overrides: Mapping[str, str] | None = None) -> None:
        self._overrides: dict[str, Policy] = {}
        for pattern, value in (overrides or {}).items():
            try:
                self._overrides[pattern] = Policy(str(value).upper())
            except ValueError:
                raise InvalidArgument(
                    f"policy for {pattern!r} must be AUTO, APPROVE or BLOCK, got {value!r}",
                    field=f"policies.{pattern}",
                ) from None

    def decide(self, name: str, default: Policy) -> Policy:
        """The policy for tool ``name`` whose own default is ``default``."""
        exact = self._overrides.get(name)
        if exact is not None:
            return exact
        module, dot, _ = name.rpartition(".")
        if dot:
            wildcard = self._overrides.get(f"{module}.*")
            if wildcard is not None:
                return wildcard
        return default
