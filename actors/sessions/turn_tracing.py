"""The span of a turn: a session's turn traced under the trace its input was stored with.

``TurnRunner`` (``runner``) runs a turn the same way whether the node traces or not; when it
does, the run goes through :func:`traced_turn`, which opens the turn's span (``turn``, under the
``traceparent`` and ``tracestate`` the inbox carried from whoever stored the input, on whichever
node), records
the claim of its input as the span's first child, and sets how the turn ended and what its
model calls used. It is apart from the runner so that the runner reads as the turn's one
sequence, and what a trace says of a turn is in one place (``docs/tracing.md``, "Spans").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from turnstile.actors.sessions.ids import public_id
from turnstile.actors.sessions.kinds import TurnOutcome
from turnstile.actors.sessions.services import SessionServices
from turnstile.actors.sessions.turn import Turn
from turnstile.runtime import tracing

__all__ = ["traced_turn"]

#: The store's backends as OpenTelemetry's ``db.system.name`` says them.
_DB_SYSTEMS = {"sqlite": "sqlite", "postgres": "postgresql"}


async def traced_turn(
    turn: Turn,
    run: Callable[[Turn], Awaitable[TurnOutcome]],
    services: SessionServices,
    *,
    session_id: str,
    owner: str,
    claiming: int | None,
) -> None:
    """``run(turn)`` in a span of its own, under the trace its input was stored with (any
    node's: the inbox carries it), from the claim of its input to the closure's commit.

    Args:
        turn: the turn, its input claimed.
        run: runs the turn start to closure and says how it ended.
        services: the session's services: its agent (``gen_ai.agent.name``) and its store
            (whose clock says how long the input waited, and which names this node).
        session_id: the session's key.
        owner: the session's owner.
        claiming: when the claim of the input began (epoch ns), where the span begins; its
            commit is a span of the turn's, known only once the input is, so recorded after
            it. None: the span begins now, without the claim.
    """
    item = turn.item
    store = services.store
    waited = (store.clock.now() - item.created_at).total_seconds()
    attributes = {
        "turnstile.session.id": public_id(session_id),
        "turnstile.session.owner": owner,
        "turnstile.input.id": item.id,
        "turnstile.input.source": item.source,
        "turnstile.input.wait_seconds": max(0.0, waited),
        "turnstile.node.id": None if store.claimer is None else store.claimer.id,
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": services.agent.name,
    }
    # no traceparent stored (an input from before tracing, a row written by hand): a
    # trace of its own ({}), never the span current in this task
    with tracing.span(
        "turn",
        parent=tracing.stored_parent(item.payload),
        attributes=attributes,
        start_time=claiming,
    ) as span:
        if claiming is not None:
            system = _DB_SYSTEMS.get(store.backend, "other_sql")
            with tracing.db_span(system, "claim_next_input", start_time=claiming):
                pass
        outcome = await run(turn)
        span.set("turnstile.turn.status", outcome.status)
        usage = turn.usage
        if usage is not None:
            span.set("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set("gen_ai.usage.output_tokens", usage.completion_tokens)
        if outcome.status == "failed":
            span.fail("turn_failed", outcome.error)
