"""``Ingress``: record a verified delivery once, put it in its sessions' inboxes, keep bindings.

**Record, then deliver.** A delivery that passed its signature is recorded first
(``queries.RECORD``: the delivery and one ``accepted`` target per session, in one transaction,
under the delivery's unique id), and only then submitted to each session through the sessions
feature's own submission path (a ``Submit`` with ``source="webhook"``, which stores the inbox
row and queues the turn like any user message), after which the target is marked
``delivered`` with the inbox row's id. So:

* a redelivery — GitHub's "Redeliver", a sender's retry, or a hundred copies at once — finds
  the id recorded and does nothing (the sender still gets a 2xx);
* the same GitHub event under a new delivery id (a captured delivery resent: GitHub's
  signature does not cover ``X-GitHub-Delivery``) finds its event identity recorded
  (``github:owner/repo#check_run:<id>:<attempt>:<conclusion>``, unique like the id) and does
  nothing either; a re-run is a new attempt (or a new check run), so a new event;
* a crash after recording and before the inbox row leaves the target ``accepted``: the sweep
  (:meth:`Ingress.run`, at start-up and every ``redeliver_seconds``) delivers it;
* a crash after the inbox row and before ``delivered``: every submit carries the delivery's id
  as the inbox row's idempotency key (``github:<X-GitHub-Delivery>``,
  ``hook:<name>:<webhook-id>``, unique per session in the store), so the sweep's next attempt
  is answered the row the first one stored (``replayed``), and the event runs once;
* a session that cannot take it now (a full queue) keeps it ``accepted`` for the next sweep; a
  session deleted meanwhile drops it.

One deliverer at a time holds a target (``queries.CLAIM``'s lease), so the request and the
sweep (or two nodes on one PostgreSQL) never submit the same target together.

**Routing.** A GitHub event goes to every session bound to one of its keys (the pull request's,
then the branch's) whose owner the repository lets bind (its ``user`` and ``users``, read from
the config as the event is recorded, so a binding made under an older rule wakes nothing); with
none, to the repository's configured default session; with none of that either, it is recorded
``unrouted`` — listed to the repository's configured user (and to admins), never dropped. A
Standard Webhooks delivery goes to the session its hook's template names in the hook's user's
namespace, or is recorded unrouted for that user.

**Bindings** belong to a session and so to its owner: they are made on a session the caller
owns (the tools act on the calling session, the routes resolve names with ``owned_key``), and
end with the session. A repository lets its configured ``user`` bind, and whoever its
``users`` lists (``"*"``: everyone); nobody for a repository without settings. A source bound
by a session of one user is refused to every other user (``bindings.BIND`` checks and takes it
in one transaction).

It is over 400 lines because recording, delivering, the sweep and the bindings share a delivery's
lifecycle and its target leases (``accepted``, then ``delivered``); the crash cases above are read
against one class.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import trio

from turnstile.actors.sessions.ids import public_id, session_key
from turnstile.actors.sessions.messages import Publish, Submit
from turnstile.actors.webhooks.bindings import BIND, BINDINGS, END_SESSION, UNBIND, Binding
from turnstile.actors.webhooks.events import SourceBinding
from turnstile.actors.webhooks.github import branch_key, parse_source_key, pr_key
from turnstile.actors.webhooks.inputs import WEBHOOK_SOURCE, WebhookEvent, webhook_payload
from turnstile.actors.webhooks.queries import (
    CLAIM,
    DELIVERIES,
    PENDING,
    PRUNE,
    RECORD,
    RELEASE,
    SETTLE,
    UNROUTED,
    Claimed,
    Recorded,
    Unrouted,
)
from turnstile.actors.webhooks.settings import WebhooksConfig
from turnstile.runtime import tracing
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import (
    Forbidden,
    LimitExceeded,
    NotFound,
    TurnstileError,
)
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.store import Store
from turnstile.tools.registry import ToolCall

__all__ = ["Delivery", "Ingress", "RateLimited", "TokenBucket", "inbox_payload"]

#: One ``name="value"`` of a sample's labels, as ``Metrics.snapshot`` writes them.
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

log = logging.getLogger("turnstile.webhooks")

#: How long one attempt holds a target (a submit takes milliseconds; a dead holder's lease
#: runs out and the sweep takes over).
CLAIM_SECONDS = 30.0
#: How long a request waits for one session to take a delivery before leaving it to the sweep.
DELIVER_SECONDS = 5.0
#: Targets one sweep tries at most.
SWEEP_BATCH = 500

#: ``http.post`` to this URL answered 201 means the session opened a pull request.
_PULLS = re.compile(
    r"https://api\.github\.com/repos/(?P<owner>[A-Za-z0-9-]{1,39})/(?P<repo>[A-Za-z0-9._-]{1,100})"
    r"/pulls/?(?:\?.*)?\Z"
)


class RateLimited(LimitExceeded):
    """A hook took more deliveries than its rate allows; answered 429 with ``Retry-After``.

    Attributes:
        retry_after: seconds until one more is allowed.
    """

    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TokenBucket:
    """``rate_per_minute`` deliveries a minute, in bursts of as many, on trio's clock.

    Args:
        rate_per_minute: the refill rate, and the bucket's size.
    """

    def __init__(self, rate_per_minute: int) -> None:
        self.capacity = float(rate_per_minute)
        self.per_second = rate_per_minute / 60.0
        self.tokens = self.capacity
        self.updated = trio.current_time()

    def take(self) -> float:
        """Take one token: 0 when there was one, else the seconds until there is."""
        now = trio.current_time()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.per_second)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.per_second


@dataclass
class Delivery:
    """A verified delivery, ready to record.

    Attributes:
        id: unique per sender (``github:<X-GitHub-Delivery>``, ``hook:<name>:<webhook-id>``).
        hook: ``github`` or the hook's name.
        event: ``check_run``, ``workflow_run``, or the sender's event type.
        source_ref: what it is about (``owner/repo#check_run:<id>``).
        source_keys: binding keys it is routed by (empty: the fallback decides).
        content: the turn's text.
        payload: the turn input's other keys.
        owners: the users whose bound sessions it may go to (None: any user's).
        fallback: ``[(session key, owner)]`` when no binding matches.
        owner: whose the delivery is if it stays unrouted (None: admins only).
        event_key: what the event is, whatever delivery carries it (``CiFailure.identity``):
            recorded once, like ``id``. None when the id is the event's already (a Standard
            Webhooks id is signed: a sender cannot resend under a new one).
    """

    id: str
    hook: str
    event: str
    source_ref: str
    content: str
    payload: dict[str, Any]
    source_keys: list[str] = field(default_factory=list)
    owners: list[str] | None = None
    fallback: list[tuple[str, str]] = field(default_factory=list)
    owner: str | None = None
    event_key: str | None = None


class Ingress:
    """The feature's service: see the module docstring.

    Args:
        store: the node's store.
        clock: the node's clock.
        metrics: where deliveries are counted.
        config: ``[webhooks]``.
        ask_session: ``NodeContext.ask_session``.
        tell_session: ``NodeContext.tell_session``.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        metrics: Metrics,
        config: WebhooksConfig,
        ask_session: Callable[..., Any],
        tell_session: Callable[..., Any],
    ) -> None:
        self.store = store
        self.clock = clock
        self.metrics = metrics
        metrics.counter(
            "turnstile_webhook_deliveries_total",
            "Webhook requests that got through, by hook and outcome.",
            ("hook", "outcome"),
        )
        metrics.counter(
            "turnstile_webhook_targets_total",
            "Attempts at putting a recorded delivery in a session's inbox, by outcome.",
            ("outcome",),
        )
        metrics.counter(
            "turnstile_webhook_refusals_total",
            "Webhook requests refused, by hook (a configured name, or empty) and reason.",
            ("hook", "reason"),
        )
        self.config = config
        self.ask_session = ask_session
        self.tell_session = tell_session
        self.buckets: dict[str, TokenBucket] = {}
        #: sweeps finished so far (``wait_sweeps``).
        self.sweeps = 0
        self._swept = trio.Event()

    # ---- admission ----

    def admit(self, hook: str, rate_per_minute: int | None = None) -> None:
        """Take one delivery from ``hook``'s rate.

        Raises:
            RateLimited: the hook is over its rate.
        """
        bucket = self.buckets.get(hook)
        if bucket is None:
            bucket = self.buckets[hook] = TokenBucket(
                rate_per_minute or self.config.rate_per_minute
            )
        wait = bucket.take()
        if wait:
            raise RateLimited(f"webhook {hook!r} is over its rate; retry later", wait)

    async def session_exists(self, key: str) -> bool:
        try:
            await self.store.get_session(key)
        except NotFound:
            return False
        return True

    # ---- record and deliver ----

    async def ingest(self, delivery: Delivery) -> dict[str, Any]:
        """Record ``delivery`` (once per id, and once per event key) and deliver it to its
        sessions.

        Returns:
            what the sender is answered: ``{"duplicate": true}`` for a redelivery (the id or
            the event key recorded already), else
            ``{"accepted": true, "sessions": n, "unrouted": bool}``.
        """
        now = self.clock.now()
        record = {
            "id": delivery.id,
            "hook": delivery.hook,
            "event": delivery.event,
            "source_ref": delivery.source_ref,
            "source_keys": delivery.source_keys,
            "owner": delivery.owner,
            "content": delivery.content,
            "payload": delivery.payload,
            "event_key": delivery.event_key,
        }
        targets = await self.store.run(
            RECORD,
            delivery=record,
            lookup=delivery.source_keys,
            owners=delivery.owners,
            fallback=delivery.fallback,
            now=self.store.db_time(now),
        )
        if targets is None:
            self.count_delivery("duplicate", delivery.hook)
            return {"duplicate": True}
        if not targets:
            self.count_delivery("unrouted", delivery.hook)
            log.info(
                "webhook %s (%s) has no session: recorded unrouted", delivery.id, delivery.event
            )
            return {"accepted": True, "sessions": 0, "unrouted": True}
        self.count_delivery("accepted", delivery.hook)
        for key, _ in targets:
            # The sender waits for this answer (GitHub gives up after 10 s): a session slow to
            # take it is left to the sweep, which the record and the key make safe.
            with trio.move_on_after(DELIVER_SECONDS):
                await self.deliver(delivery.id, key)
        return {"accepted": True, "sessions": len(targets), "unrouted": False}

    def count_delivery(self, outcome: str, hook: str) -> None:
        """Count one request's outcome (``turnstile_webhook_deliveries_total``)."""
        self.metrics.inc("turnstile_webhook_deliveries_total", hook=hook, outcome=outcome)

    async def deliver(self, delivery_id: str, key: str) -> str:
        """One attempt at putting a recorded delivery in session ``key``'s inbox.

        When the node traces, a span ``webhook deliver`` (under the request's span when the
        delivery is being received, of its own when the sweep tries again), stored with the
        input: the turn it starts is its child.

        Returns:
            ``delivered``, ``dropped`` (the session is gone), ``retry`` (it could not take it
            now; the sweep tries again) or ``held`` (settled already, or another deliverer
            holds it).
        """
        if not tracing.active():
            return await self._deliver(delivery_id, key)
        attributes = {
            "turnstile.webhook.delivery_id": delivery_id,
            "turnstile.session.id": public_id(key),
        }
        with tracing.span("webhook deliver", kind="producer", attributes=attributes) as span:
            outcome = await self._deliver(delivery_id, key)
            span.set("turnstile.webhook.outcome", outcome)
            return outcome

    async def _deliver(self, delivery_id: str, key: str) -> str:
        now = self.clock.now()
        claimed: Claimed | None = await self.store.run(
            CLAIM,
            delivery_id=delivery_id,
            session_key=key,
            now=self.store.db_time(now),
            until=self.store.db_time(now + timedelta(seconds=CLAIM_SECONDS)),
        )
        if claimed is None:
            return "held"
        try:
            # Keyed by the delivery: if an earlier attempt stored the row and died before
            # marking it delivered, this one is answered that row (replayed), not a second.
            submitted = await self.ask_session(
                key,
                Submit(
                    source=WEBHOOK_SOURCE,
                    content=claimed.content,
                    payload=inbox_payload(claimed),
                    idempotency_key=delivery_id,
                ),
            )
            input_id = submitted.input_id
        except NotFound:
            await self._settle(claimed, "dropped", None, "the session no longer exists")
            self.metrics.inc("turnstile_webhook_targets_total", outcome="dropped")
            return "dropped"
        except TurnstileError as exc:  # a full queue, a busy mailbox: the sweep tries again
            retry_at = self.clock.now() + timedelta(seconds=self.config.redeliver_seconds)
            await self.store.run(
                RELEASE,
                delivery_id=delivery_id,
                session_key=key,
                error=f"{exc.code}: {exc}"[:500],
                now=self.store.db_time(self.clock.now()),
                retry_at=self.store.db_time(retry_at),
            )
            self.metrics.inc("turnstile_webhook_targets_total", outcome="retry")
            log.info(
                "webhook %s not delivered to %s yet (%s); will retry", delivery_id, key, exc.code
            )
            return "retry"
        await self._settle(claimed, "delivered", input_id, None)
        self.metrics.inc("turnstile_webhook_targets_total", outcome="delivered")
        return "delivered"

    async def _settle(
        self, claimed: Claimed, state: str, input_id: int | None, error: str | None
    ) -> None:
        await self.store.run(
            SETTLE,
            delivery_id=claimed.delivery_id,
            session_key=claimed.session_key,
            state=state,
            input_id=input_id,
            error=error,
            now=self.store.db_time(self.clock.now()),
        )

    async def sweep(self) -> int:
        """Prune deliveries past the retention window, then try every undelivered target.

        Returns:
            how many targets were delivered.
        """
        now = self.clock.now()
        before = now - timedelta(days=self.config.retention_days)
        pruned = await self.store.run(PRUNE, before=self.store.db_time(before))
        if pruned:
            log.info(
                "webhooks: pruned %d deliveries older than %g days",
                pruned,
                self.config.retention_days,
            )
        pending = await self.store.run(PENDING, now=self.store.db_time(now), limit=SWEEP_BATCH)
        delivered = 0
        for delivery_id, key in pending:
            if await self.deliver(delivery_id, key) == "delivered":
                delivered += 1
        if delivered:
            log.info("webhooks: delivered %d pending deliveries", delivered)
        return delivered

    async def run(self) -> None:
        """Sweep now, then every ``redeliver_seconds`` (the webhooks feature starts it in its
        ``open``: the sessions can take inputs). A failed sweep is logged and tried again next
        time."""
        while True:
            try:
                await self.sweep()
            except TurnstileError:
                log.exception("webhooks: the sweep failed; trying again later")
            self.sweeps += 1
            self._swept.set()
            self._swept = trio.Event()
            await trio.sleep(self.config.redeliver_seconds)

    async def wait_sweeps(self, count: int) -> None:
        """Return once ``count`` sweeps have finished since the node opened."""
        while self.sweeps < count:
            await self._swept.wait()

    # ---- bindings ----

    def check_bindable(self, user: str, source: str) -> str:
        """The normalised key ``user`` may bind a session to.

        Raises:
            InvalidArgument: not a source key.
            Forbidden: the repository does not let ``user`` bind (``RepoConfig``: its ``user``
                and its ``users`` may; nobody, for a repository without settings).
        """
        parsed = parse_source_key(source)
        binders = self.config.github.binders(parsed.owner, parsed.repo)
        if binders is not None and user not in binders:
            raise Forbidden(
                f"{parsed.owner}/{parsed.repo} does not let this user bind to it"
                " (its configured user and users only)",
                field="source",
            )
        return str(parsed)

    async def bind(self, owner: str, key: str, source: str, via: str) -> tuple[Binding, bool]:
        """Bind session ``key`` (of ``owner``) to ``source``; answers the binding and whether
        it is new (a new one is announced in the session).

        Raises:
            InvalidArgument: see :meth:`check_bindable`.
            Forbidden: see :meth:`check_bindable`.
            ConflictError: a session of another user is bound to ``source`` (field
                ``source``).
            LimitExceeded: the session has ``max_bindings_per_session`` already.
        """
        source = self.check_bindable(owner, source)
        binding, created = await self.store.run(
            BIND,
            owner=owner,
            session_key=key,
            source=source,
            via=via,
            now=self.store.db_time(self.clock.now()),
            limit=self.config.max_bindings_per_session,
        )
        if created:
            await self._announce(key, "bound", source, via)
        return binding, created

    async def unbind(self, key: str, source: str, via: str) -> bool:
        """Unbind session ``key`` from ``source``; False when it was not bound.

        Raises:
            InvalidArgument: not a source key.
        """
        source = str(parse_source_key(source))
        removed = await self.store.run(UNBIND, session_key=key, source=source)
        if removed:
            await self._announce(key, "unbound", source, via)
        return bool(removed)

    async def bindings(self, key: str) -> list[Binding]:
        return await self.store.run(BINDINGS, session_key=key)

    async def _announce(self, key: str, action: str, source: str, via: str) -> None:
        event = SourceBinding(action=action, source=source, via=via)
        try:  # asked, not told: whoever bound it reads the notice in the log once this returns
            await self.ask_session(key, Publish(event=event))
        except TurnstileError as exc:  # the binding stands; only the notice is lost
            log.info("could not announce %s of %s in %s: %s", action, source, key, exc)

    async def end_session(self, key: str) -> None:
        """``SessionHooks.on_session_end``: the session's bindings go with it."""
        await self.store.run(END_SESSION, session_key=key, now=self.store.db_time(self.clock.now()))

    async def unrouted(self, owner: str | None, limit: int) -> list[Unrouted]:
        return await self.store.run(UNROUTED, owner=owner, limit=limit)

    async def deliveries(self, owner: str | None, limit: int) -> list[Recorded]:
        """The latest recorded deliveries, newest first, with where each went: ``owner``'s
        (sent on their behalf or to one of their sessions, and only their sessions of it), or
        everyone's for None."""
        return await self.store.run(DELIVERIES, owner=owner, limit=limit)

    def counts(self) -> dict[str, dict[str, Any]]:
        """Every webhook request this node answered since it started, by hook: each outcome
        of ``turnstile_webhook_deliveries_total`` (``accepted``, ``unrouted``, ``duplicate``,
        ``ignored``, ``pong``) and ``refused`` by reason (``turnstile_webhook_refusals_total``).
        Duplicates and refusals are not recorded as deliveries, so these counters are the only
        place they show; read from the metrics, so the two never disagree."""
        out: dict[str, dict[str, Any]] = {}
        for sample, value in self.metrics.snapshot().items():
            family, _, rest = sample.partition("{")
            labels = dict(_LABEL.findall(rest))
            if family == "turnstile_webhook_deliveries_total":
                entry = out.setdefault(labels.get("hook", ""), {"refused": {}})
                entry[labels.get("outcome", "")] = int(value)
            elif family == "turnstile_webhook_refusals_total":
                entry = out.setdefault(labels.get("hook", ""), {"refused": {}})
                entry["refused"][labels.get("reason", "")] = int(value)
        return out

    # ---- a pull request opened through the http tool ----

    async def observe_tool(self, call: ToolCall, name: str, arguments: dict, data: Any) -> None:
        """``ToolRegistry.observers``: an ``http.post`` to GitHub's ``/repos/o/r/pulls`` that
        answered ``201`` with a number opened a pull request: bind the calling session to it
        (and to its head branch), as the reference keys sessions "from the PR"."""
        if name != "http.post" or not isinstance(data, dict) or data.get("status_code") != 201:
            return
        match = _PULLS.match(str(arguments.get("url", "")))
        body = data.get("body")
        if match is None or not isinstance(body, dict):
            return
        number = body.get("number")
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            return
        owner, repo = match["owner"], match["repo"]
        sources = [pr_key(owner, repo, number)]
        head = body.get("head")
        if isinstance(head, dict) and isinstance(head.get("ref"), str):
            sources.append(branch_key(owner, repo, head["ref"]))
        for source in sources:
            try:
                await self.bind(call.owner, call.session_id, source, "pull_request")
            except TurnstileError as exc:  # not bindable here; the tool's result stands
                log.info("session %s not bound to %s: %s", call.session_id, source, exc)


def inbox_payload(claimed: Claimed) -> dict[str, Any]:
    """The inbox payload: the sender's fields and where they came from, built as the
    ``WebhookEvent`` the sessions decode (the same on every attempt, as the idempotency key
    requires)."""
    event = WebhookEvent(
        hook=claimed.hook,
        event=claimed.event,
        delivery_id=claimed.delivery_id,
        source_ref=claimed.source_ref,
    )
    return webhook_payload(claimed.payload, event)


def routed_key(user: str, name: str) -> str:
    """``user``'s session ``name`` as a key (``session_key``, which refuses bad names)."""
    return session_key(user, name)


def iso(when: datetime) -> str:
    """An aware datetime as the routes show it."""
    return when.isoformat().replace("+00:00", "Z")
