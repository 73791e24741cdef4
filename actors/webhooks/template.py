"""Routing templates: which session a Standard Webhooks delivery goes to, read off its payload.

A hook's ``session`` setting is literal text with placeholders naming a value of the JSON
payload by its path: ``{payload.session}``, ``deploy-{payload.service.name}``,
``{payload.items.0.id}``. That is the whole language: no expressions, no calls, no filters,
no attribute access on Python objects (only keys of JSON objects and indexes of JSON arrays),
so a template can be checked once when the config is read and evaluated by a dictionary walk,
never by ``eval`` or ``str.format`` (whose ``{0.__class__}`` reaches into objects).

A placeholder's value must be a string or an integer; the rendered name must be a valid
session name (``1-128`` of ``A-Z a-z 0-9 _ . : -``, the gateway's id rule). Anything else is
:class:`RoutingFieldError`, naming the payload field at fault (``$.service.name``), which the
route answers ``400``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from turnstile.runtime.errors import DecodeError

__all__ = ["RouteTemplate", "RoutingFieldError", "TemplateError"]

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_LITERAL = re.compile(r"[A-Za-z0-9_.:-]*\Z")
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z")
MAX_DEPTH = 8
MAX_PLACEHOLDERS = 4


class TemplateError(ValueError):
    """A template that is not of the allowed form (raised when the config is read)."""


class RoutingFieldError(DecodeError):
    """A payload that the hook's template cannot route: the field is missing, of the wrong type,
    or renders a name that is not a session name. ``field`` is its JSON path."""


@dataclass(frozen=True, slots=True)
class RouteTemplate:
    """A parsed template: literal parts and payload paths, alternating (literal first)."""

    literals: tuple[str, ...]
    paths: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, text: str) -> RouteTemplate:
        """Check and parse ``text``.

        Raises:
            TemplateError: a stray brace, a placeholder that is not ``payload.<key>…``, a
                literal character a session name cannot hold, or too many placeholders.
        """
        literals: list[str] = []
        paths: list[tuple[str, ...]] = []
        position = 0
        for match in _PLACEHOLDER.finditer(text):
            literals.append(text[position : match.start()])
            parts = match[1].split(".")
            if parts[0] != "payload" or len(parts) < 2:
                raise TemplateError(f"placeholder {{{match[1]}}} must be {{payload.<key>…}}")
            if len(parts) - 1 > MAX_DEPTH:
                raise TemplateError(f"placeholder {{{match[1]}}} is deeper than {MAX_DEPTH} keys")
            for part in parts[1:]:
                if not _SEGMENT.match(part):
                    raise TemplateError(
                        f"placeholder {{{match[1]}}}: keys are 1-64 of A-Z a-z 0-9 _ -"
                    )
            paths.append(tuple(parts[1:]))
            position = match.end()
        literals.append(text[position:])
        for literal in literals:
            if not _LITERAL.match(literal):
                raise TemplateError(
                    "outside placeholders a template holds only A-Z a-z 0-9 _ . : - "
                    "(no stray braces)"
                )
        if not paths and not _NAME.match(text):
            raise TemplateError("a template without placeholders must be a session name")
        if len(paths) > MAX_PLACEHOLDERS:
            raise TemplateError(f"at most {MAX_PLACEHOLDERS} placeholders")
        return cls(tuple(literals), tuple(paths))

    def render(self, payload: Any) -> str:
        """The session name for ``payload``.

        Raises:
            RoutingFieldError: a field is missing or not a string or integer, or the result is
                not a session name.
        """
        out = [self.literals[0]]
        for path, literal in zip(self.paths, self.literals[1:], strict=True):
            out.append(_lookup(payload, path))
            out.append(literal)
        name = "".join(out)
        if not _NAME.match(name):
            where = "$." + ".".join(self.paths[0]) if self.paths else "$"
            raise RoutingFieldError(
                f"the routed session name must be 1-128 of A-Z a-z 0-9 _ . : - (at {where})",
                field=where,
            )
        return name


def _lookup(payload: Any, path: tuple[str, ...]) -> str:
    value = payload
    for depth, key in enumerate(path):
        where = "$." + ".".join(path[: depth + 1])
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise RoutingFieldError(f"missing routing field at {where}", field=where)
    where = "$." + ".".join(path)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RoutingFieldError(
            f"routing field at {where} must be a string or an integer", field=where
        )
    return str(value)
