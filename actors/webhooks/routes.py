"""The webhooks feature's HTTP endpoints.

==========================================  ===================================================
``POST /webhooks/github``                   GitHub (``X-Hub-Signature-256``); mounted when
                                            there is a secret
``POST /webhooks/{name}``                   a hook declared in ``[webhooks.hooks.<name>]``
                                            (Standard Webhooks)
``GET /webhooks/unrouted``                  the caller's unrouted events; ``all_users=true``
                                            for ``[webhooks] admins`` (else 403); ``limit``
``GET /webhooks/deliveries``                the caller's recorded deliveries with where each
                                            went; ``all_users=true`` (admins) adds every
                                            user's and the node's counts by hook and outcome,
                                            duplicates and refusals included; ``limit``
``GET /sessions/{id}/bindings``             the session's bindings
``POST /sessions/{id}/bindings``            ``{"source": "github:o/r#3"}``: 201 new, 200 if
                                            it was bound already
``DELETE /sessions/{id}/bindings?source=``  204, or 404 when it was not bound
==========================================  ===================================================

The two ``POST /webhooks/…`` routes are the node's only routes without a bearer token
(``HttpRoute(auth="signature")``): a sender cannot hold a user's token, so it signs the raw
body, and the handler checks that signature before it parses a byte. In order: the body is
read, bounded (``413``); the signature is checked (``401``, and nothing else happens); the
hook's rate is taken (``429`` with ``Retry-After``; counted after the signature, so forged
requests cannot use up a sender's rate); the JSON is read (``400`` naming the field). Every
refusal is counted in ``/metrics`` as ``turnstile_webhook_refusals_total{hook,reason}``, the
label being a configured hook's name (or empty for an unknown one: a sender cannot mint label
values). Answers to the sender never name sessions.

The bindings routes take the source as a query parameter on ``DELETE``: keys hold ``/`` and
``#``, which a path segment cannot carry.

Each route describes itself for the API document (``/openapi.json``): the answer Structs below
describe the dicts the handlers build (checked against live answers by the schemathesis run,
``tests/e2e/test_api_contract.py``); the receivers list their signature headers, as they need
no token.

It is over 400 lines because both receivers (GitHub and Standard Webhooks) and the bindings,
deliveries and unrouted listings share one set of response Structs and one way of counting,
refusing and answering a delivery; the receivers' order of checks (size, signature, parse, record)
is read in one place.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import msgspec
import trio
from starlette.responses import Response

from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.ids import public_id, session_key
from turnstile.actors.webhooks.github import EVENTS, parse_event
from turnstile.actors.webhooks.service import Delivery, Ingress, RateLimited, iso
from turnstile.actors.webhooks.settings import HookConfig, WebhooksConfig
from turnstile.actors.webhooks.signatures import SignatureRefused, verify_github, verify_standard
from turnstile.actors.webhooks.spool import Spool, Spooled, SpoolFull
from turnstile.actors.webhooks.template import RouteTemplate
from turnstile.actors.webhooks.tools import binding_view
from turnstile.actors.webhooks.views import (
    Accepted,
    Answered,
    BindBody,
    BindingList,
    BindingMade,
    DeliveriesQuery,
    DeliveryList,
    UnboundQuery,
    UnroutedList,
    UnroutedQuery,
)
from turnstile.runtime.codec import MAX_JSON_DEPTH, Codec
from turnstile.runtime.errors import (
    DecodeError,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    StoreUnavailable,
    TurnstileError,
)
from turnstile.runtime.gateway.routes import (
    ApiRequest,
    ErrorAnswer,
    HttpRoute,
    Param,
    Reply,
    RouteHandler,
    decode_query,
)

__all__ = ["Receivers", "SignedHook", "webhook_routes"]

log = logging.getLogger("turnstile.webhooks")

#: GitHub's delivery ids are GUIDs; anything printable and short is taken.
_DELIVERY = re.compile(r"[A-Za-z0-9._:-]{1,100}\Z")
_EVENT = re.compile(r"[a-z_]{1,64}\Z")
#: The most of a Standard Webhooks body quoted in the turn's text (the payload has it whole).
MAX_QUOTED_CHARS = 8000
_OBJECT = Codec(dict[str, Any], max_depth=MAX_JSON_DEPTH)
_encoder = msgspec.json.Encoder()


class UnknownHook(NotFound):
    """``POST /webhooks/{name}`` for a name no hook is declared under (or has no secret)."""


class SignedHook(msgspec.Struct, frozen=True):
    """A declared hook ready to serve: its settings, key and parsed template."""

    config: HookConfig
    key: bytes
    template: RouteTemplate


_BIND = Codec(BindBody, max_depth=4)


def _json(value: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(_encoder.encode(value), status, headers, media_type="application/json")


def _query(request: ApiRequest, type_: type[msgspec.Struct]) -> Any:
    """The query string as ``type_`` (the gateway's ``decode_query``)."""
    return decode_query(request.query, type_)


def _reason(exc: TurnstileError) -> str | None:
    """What a refusal is counted as; None for what is not the sender's doing."""
    if isinstance(exc, SignatureRefused):
        return exc.reason
    if isinstance(exc, PayloadTooLarge):
        return "too_large"
    if isinstance(exc, RequestTimeout):
        return "timeout"
    if isinstance(exc, RateLimited):
        return "rate_limited"
    if isinstance(exc, UnknownHook):
        return "unknown_hook"
    if isinstance(exc, DecodeError):
        return "malformed"
    return None


def _counted(node: NodeContext, handler: RouteHandler, label: Any) -> RouteHandler:
    """``handler`` with every refusal counted under ``label(request)``; a rate refusal is
    answered here, with ``Retry-After``."""

    async def counted(request: ApiRequest) -> Any:
        try:
            return await handler(request)
        except TurnstileError as exc:
            reason = _reason(exc)
            if reason is None:
                raise
            node.metrics.inc("turnstile_webhook_refusals_total", hook=label(request), reason=reason)
            if isinstance(exc, RateLimited):
                error = {"code": exc.code, "message": str(exc)}
                retry = str(max(1, round(exc.retry_after)))
                return _json({"error": error}, 429, {"retry-after": retry})
            raise

    return counted


class Receivers:
    """The receivers' second half: a delivery whose signature was checked, ingested
    (``deliver``), or spooled when the store is unavailable (``accept``).

    What needs no store is read here again from the raw body (GitHub's event, a hook's JSON
    and its session template), so a spooled delivery is ingested as it would have been. The
    signature is not checked here: the route checked it before, and a replayed file was
    written only after it (a Standard Webhooks timestamp would be stale by then).

    Args:
        config: ``[webhooks]``.
        ingress: the service.
        hooks: the declared hooks with a secret, by name.
        spool: where deliveries wait out an outage (None: they are answered 503).
        spooled: called after a file is written (the replayer's nudge).
    """

    def __init__(
        self,
        config: WebhooksConfig,
        ingress: Ingress,
        hooks: dict[str, SignedHook],
        spool: Spool | None = None,
        spooled: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.ingress = ingress
        self.hooks = hooks
        self.spool = spool
        self.spooled = spooled

    async def accept(self, entry: Spooled) -> Any:
        """The route's answer for a verified delivery: ingested (202, or 200 for a duplicate),
        or written to the spool when the store is unavailable (``202 {"spooled": true}``)."""
        try:
            answer = await self.deliver(entry)
        except StoreUnavailable:
            if self.spool is None:
                raise
            try:
                await trio.to_thread.run_sync(self.spool.write, entry)
            except SpoolFull:
                raise StoreUnavailable("the store is unavailable and the spool full") from None
            self.ingress.count_delivery("spooled", entry.hook)
            log.warning(
                "webhooks: %s delivery %s met an unavailable store: spooled",
                entry.hook,
                entry.delivery,
            )
            if self.spooled is not None:
                self.spooled()
            return _json({"accepted": True, "spooled": True}, 202)
        if answer.get("duplicate") or answer.get("ignored"):
            return answer
        return _json(answer, 202)

    async def deliver(self, entry: Spooled) -> dict[str, Any]:
        """Ingest a verified delivery (``Ingress.ingest``'s answer, or an ``ignored`` one).

        Raises:
            StoreUnavailable: the store cannot take it now.
            DecodeError: the body (or a header kept with it) does not parse.
            UnknownHook: a spooled delivery's hook is no longer declared.
        """
        if entry.hook == "github":
            return await self._github(entry.event, entry.delivery, entry.body)
        hook = self.hooks.get(entry.hook)
        if hook is None:
            raise UnknownHook(f"no webhook named {entry.hook!r}")
        return await self._standard(entry.hook, hook, entry.delivery, entry.body)

    async def _github(self, event: str, delivery: str, body: bytes) -> dict[str, Any]:
        ingress, config = self.ingress, self.config
        if not _EVENT.match(event) or event not in EVENTS or not _DELIVERY.match(delivery):
            raise DecodeError(f"not a GitHub event this node takes: {event!r}", "event")
        failure = parse_event(event, body, workflow_cancelled=config.github.workflow_cancelled)
        if failure == "ignored":
            ingress.count_delivery("ignored", "github")
            return {"ignored": True, "reason": "not a completed failure"}
        repo = config.github.repo(failure.owner, failure.repo)
        # only sessions of users the repository lets bind, however old their binding
        binders = config.github.binders(failure.owner, failure.repo)
        owner, fallback = None, []
        if repo is not None and repo.user:
            owner = repo.user
            if repo.session:
                key = session_key(repo.user, repo.session)
                if await ingress.session_exists(key):
                    fallback = [(key, repo.user)]
        return await ingress.ingest(
            Delivery(
                id=f"github:{delivery}",
                hook="github",
                event=event,
                source_ref=failure.source_ref,
                content=failure.content,
                payload=failure.payload,
                source_keys=failure.source_keys,
                owners=None if binders is None else sorted(binders),
                fallback=fallback,
                owner=owner,
                event_key=failure.identity,
            )
        )

    async def _standard(
        self, name: str, hook: SignedHook, webhook_id: str, body: bytes
    ) -> dict[str, Any]:
        ingress = self.ingress
        try:
            payload = _OBJECT.decode_json(body)
        except DecodeError as exc:
            raise DecodeError(
                f"the body must be a JSON object: {exc}", exc.field or "body"
            ) from None
        session = hook.template.render(payload)
        user = hook.config.user
        key = session_key(user, session)
        fallback = [(key, user)] if await ingress.session_exists(key) else []
        kind = payload.get("type")
        event = kind if isinstance(kind, str) and _EVENT.match(kind.replace(".", "_")) else "event"
        quoted = body.decode("utf-8", "replace")
        if len(quoted) > MAX_QUOTED_CHARS:
            quoted = quoted[:MAX_QUOTED_CHARS] + "…"
        return await ingress.ingest(
            Delivery(
                id=f"hook:{name}:{webhook_id}",
                hook=name,
                event=event,
                source_ref=f"{name}:{webhook_id}",
                content=f"[WEBHOOK {name}] {event}\n{quoted}",
                payload={"data": payload, "session": session},
                fallback=fallback,
                owner=user,
            )
        )


def webhook_routes(
    node: NodeContext,
    receivers: Receivers,
    github_secret: bytes | None,
) -> list[HttpRoute]:
    """The routes: GitHub's when it has a secret, the declared hooks', unrouted, bindings."""
    config = node.section("webhooks", WebhooksConfig)
    ingress, hooks = receivers.ingress, receivers.hooks
    routes: list[HttpRoute] = []

    def github_receiver(secret: bytes) -> RouteHandler:
        """GitHub's endpoint, checking signatures against ``secret`` (served only with one)."""

        async def github(request: ApiRequest) -> Any:
            body = await request.raw_body(config.max_body_bytes)
            verify_github(secret, body, request.headers)
            ingress.admit("github")
            event = request.headers.get("x-github-event", "")
            delivery = request.headers.get("x-github-delivery", "")
            if not _EVENT.match(event):
                raise DecodeError("X-GitHub-Event must name an event", field="X-GitHub-Event")
            if not _DELIVERY.match(delivery):
                raise DecodeError(
                    "X-GitHub-Delivery must be 1-100 of A-Z a-z 0-9 . _ : -",
                    field="X-GitHub-Delivery",
                )
            if event == "ping":
                ingress.count_delivery("pong", "github")
                return {"ok": True, "event": "ping"}
            if event not in EVENTS:
                ingress.count_delivery("ignored", "github")
                return {"ignored": True, "reason": f"{event} events wake nobody"}
            return await receivers.accept(Spooled("github", delivery, event, body))

        return github

    async def standard(request: ApiRequest) -> Any:
        name = request.path["name"]
        hook = hooks.get(name)
        if hook is None:
            raise UnknownHook(f"no webhook named {name!r}")
        limit = hook.config.max_body_bytes or config.max_body_bytes
        body = await request.raw_body(limit)
        webhook_id = verify_standard(
            hook.key, body, request.headers, node.clock.now(), hook.config.tolerance_seconds
        )
        ingress.admit(name, hook.config.rate_per_minute)
        return await receivers.accept(Spooled(name, webhook_id, "", body))

    async def unrouted(request: ApiRequest) -> Any:
        query = _query(request, UnroutedQuery)
        if query.all_users and request.user not in config.admins:
            raise Forbidden("all_users is for [webhooks] admins", "all_users")
        found = await ingress.unrouted(None if query.all_users else request.user, query.limit)
        return {
            "unrouted": [
                {
                    "delivery_id": u.delivery_id,
                    "hook": u.hook,
                    "event": u.event,
                    "source_ref": u.source_ref,
                    "source_keys": u.source_keys,
                    **({"owner": u.owner} if query.all_users else {}),
                    "received_at": iso(u.received_at),
                    "content": u.content,
                    "payload": u.payload,
                }
                for u in found
            ]
        }

    async def deliveries(request: ApiRequest) -> Any:
        query = _query(request, DeliveriesQuery)
        if query.all_users and request.user not in config.admins:
            raise Forbidden("all_users is for [webhooks] admins", "all_users")
        found = await ingress.deliveries(None if query.all_users else request.user, query.limit)
        answer: dict[str, Any] = {
            "deliveries": [
                {
                    "delivery_id": d.delivery_id,
                    "hook": d.hook,
                    "event": d.event,
                    "source_ref": d.source_ref,
                    "state": d.state,
                    **({"owner": d.owner} if query.all_users else {}),
                    "received_at": iso(d.received_at),
                    "targets": [
                        {
                            "session": public_id(t.session_key),
                            **({"owner": t.owner} if query.all_users else {}),
                            "state": t.state,
                            "input_id": t.input_id,
                            "attempts": t.attempts,
                            "error": t.error,
                        }
                        for t in d.targets
                    ],
                }
                for d in found
            ]
        }
        if query.all_users:  # node-wide: no user's alone
            answer["counts"] = ingress.counts()
        return answer

    async def list_bindings(request: ApiRequest) -> Any:
        key = await node.directory.owned_key(request.user, request.path["id"])
        return {"bindings": [binding_view(b) for b in await ingress.bindings(key)]}

    async def bind(request: ApiRequest) -> Any:
        key = await node.directory.owned_key(request.user, request.path["id"], fresh=True)
        body = await request.body(_BIND)
        binding, created = await ingress.bind(request.user, key, body.source, "http")
        return _json({**binding_view(binding), "created": created}, 201 if created else 200)

    async def unbind(request: ApiRequest) -> Any:
        key = await node.directory.owned_key(request.user, request.path["id"])
        query = _query(request, UnboundQuery)
        if not await ingress.unbind(key, query.source, "http"):
            raise NotFound(f"the session is not bound to {query.source!r}")
        return Response(status_code=204)

    def hook_label(request: ApiRequest) -> str:
        name = request.path.get("name", "")
        return name if name in hooks else ""

    admins_only = "403 `forbidden` for `all_users=true` without `[webhooks] admins`."
    receiver = {
        202: Reply(Accepted, "Recorded and queued (or recorded unrouted), or spooled"),
        200: Reply(Answered, "Nothing new to do: a duplicate, a ping, or an ignored event"),
        429: Reply(
            ErrorAnswer,
            "The hook is over its rate_per_minute",
            headers=(Param("Retry-After", int, True, "seconds to wait"),),
        ),
    }
    signed = "Authenticated by its signature over the raw body (`docs/github.md`): "
    routes += [
        HttpRoute(
            "GET",
            "/webhooks/unrouted",
            unrouted,
            summary="Deliveries no session was bound to (yours; an admin's: everyone's)",
            query=UnroutedQuery,
            response=UnroutedList,
            errors=(403,),
            description=admins_only,
        ),
        HttpRoute(
            "GET",
            "/webhooks/deliveries",
            deliveries,
            summary="Recorded deliveries that concern you, and where each went",
            query=DeliveriesQuery,
            response=DeliveryList,
            errors=(403,),
            description=admins_only,
        ),
    ]
    if github_secret is not None:
        routes.append(
            HttpRoute(
                "POST",
                "/webhooks/github",
                _counted(node, github_receiver(github_secret), lambda _: "github"),
                auth="signature",
                summary="A GitHub webhook delivery (check_run, workflow_run, ping)",
                body=dict[str, Any],
                headers=(
                    Param("X-Hub-Signature-256", required=True, description="sha256=<HMAC>"),
                    Param("X-GitHub-Event", required=True, description="the event's name"),
                    Param("X-GitHub-Delivery", required=True, description="the delivery's id"),
                ),
                responses=receiver,
                errors=(400, 401, 413),
                description=signed + "401 without a valid signature, 400 for a malformed "
                "event or delivery header or body, 413 over `max_body_bytes`.",
            )
        )
    routes += [
        HttpRoute(
            "POST",
            "/webhooks/{name}",
            _counted(node, standard, hook_label),
            auth="signature",
            summary="A Standard Webhooks delivery to a hook declared in the config",
            body=dict[str, Any],
            headers=(
                Param("webhook-id", required=True, description="the message's id"),
                Param("webhook-timestamp", required=True, description="Unix seconds"),
                Param("webhook-signature", required=True, description="v1,<base64 HMAC>"),
            ),
            responses=receiver,
            errors=(400, 401, 404, 413),
            description=signed + "401 without a valid signature or with a timestamp outside "
            "the hook's tolerance, 404 for a name no hook with a secret is declared under.",
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/bindings",
            list_bindings,
            summary="The sources whose CI events wake a session",
            response=BindingList,
            errors=(404,),
        ),
        HttpRoute(
            "POST",
            "/sessions/{id}/bindings",
            bind,
            status=201,
            summary="Bind a source to a session",
            body=BindBody,
            responses={
                201: Reply(BindingMade, "Bound now"),
                200: Reply(BindingMade, "It was bound already"),
            },
            errors=(403, 404, 409, 429),
            description="400 (field `source`) for a malformed key; 403 (field `source`) when "
            "the repository does not let this user bind (its `user` and `users` only); 409 "
            "(field `source`) when a session of another user is bound to the source; 429 at "
            "`max_bindings_per_session`.",
        ),
        HttpRoute(
            "DELETE",
            "/sessions/{id}/bindings",
            unbind,
            status=204,
            summary="Unbind a source from a session",
            query=UnboundQuery,
            errors=(404,),
            description="404 when it was not bound.",
        ),
    ]
    return routes
