"""How a search's stages run and combine: at once, and merged in order without duplicates
(``Memory.search``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import trio

from turnstile.actors.memory.queries import Fact

__all__ = ["both", "merge"]


async def both(first: Callable[[], Awaitable[None]], second: Callable[[], Awaitable[None]]) -> None:
    """Run ``first()`` and ``second()`` at once; when one fails, the other is cancelled and the
    failure is raised as itself (not wrapped in the nursery's exception group), so callers see
    the store's typed errors (when both fail, the first, from the group). Cancellation from
    outside passes through untouched."""
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(second)
    except BaseExceptionGroup as group:
        failures = [e for e in _leaves(group) if not isinstance(e, trio.Cancelled)]
        if failures:
            raise failures[0] from (group if len(failures) > 1 else None)
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def merge(stages: Iterable[list[Fact]], limit: int) -> list[Fact]:
    """Results of the search stages in order (earlier stages first), each fact once, at most
    ``limit``: the vector stage, then the lexical one."""
    seen: set[tuple[str, str, str]] = set()
    merged: list[Fact] = []
    for stage in stages:
        for fact in stage:
            ident = (fact.owner, fact.category, fact.key)
            if ident not in seen:
                seen.add(ident)
                merged.append(fact)
                if len(merged) == limit:
                    return merged
    return merged
