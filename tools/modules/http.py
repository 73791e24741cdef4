"""The http module: ``http.get``, ``http.post`` and ``http.download``, through the netguard.

Every request goes through ``tools.netguard``: destinations are vetted after DNS resolution,
connections go to the vetted address, and redirects (at most ``max_redirects``) are followed
one vetted hop at a time. Only ``http`` and ``https`` URLs are accepted.

* **Limits** — ``timeout`` (default 30 s, at most 120 s) bounds the whole call: resolution,
  connection, every redirect and the body. ``max_bytes`` (default 1 MiB, at most 10 MiB)
  bounds the body kept: reading stops there and the result says ``truncated: true``. Requests
  ask for ``Accept-Encoding: identity`` unless the caller says otherwise, so a small
  compressed body cannot expand into a huge one.
* **Request headers** — at most 50, names must be HTTP tokens, values may not contain line
  breaks; ``Host``, ``Content-Length``, ``Transfer-Encoding``, ``Connection`` and the other
  hop-by-hop headers are refused (the transport sets them). ``Authorization`` and ``Cookie``
  are dropped when a redirect changes origin.
* **Idempotency** — a request that changes something (``http.post``) made by a turn carries
  the call's ``Idempotency-Key`` (``ToolCall.idempotency_key``: the same when the same input's
  turn runs again after a crash), so a receiver that honours the header does the work once. A
  key the caller sets in ``headers`` itself is sent instead. GETs carry none.
* **Response** — ``status_code``, ``url`` (after redirects), ``redirects`` (the URLs
  redirected from), ``headers`` (a selection: content type and length, caching, location…),
  ``body`` and ``encoding``, ``bytes``, ``truncated``, ``elapsed_ms``. The body is parsed JSON
  (``encoding: "json"``) when the response says it is JSON and arrived whole — so a watcher
  can test ``result.body.items.0.price`` — text (``"text"``) when it is textual, and base64
  (``"base64"``) otherwise. A 4xx/5xx status is a result, not an error.
* ``http.download`` streams the body into a file under the filesystem module's root
  (``destination``, resolved like any filesystem path): a temporary file renamed into place
  when complete, so a failed or oversized download leaves nothing behind. It refuses non-2xx
  answers and bodies over ``max_bytes`` (default and ceiling: ``max_download_bytes``). Like
  the execution-primitives reference's module background actions, it runs **in the
  background** when the node gives it a way to (``start_background``): the call checks its
  arguments, is approved, then answers at once with a ``task_id`` and the session is notified
  (``[BACKGROUND TASK COMPLETED]``) when the file is in place. Inside a background task
  (``background_run``, or the task it started itself) it downloads inline.
* **Logs** — httpx logs every request at INFO with its full URL; this module's requests, which
  go to the netguard's transport without an httpx client, log the same line on the ``httpx``
  logger at DEBUG (a watcher's every check would otherwise be a line at INFO). Query strings
  and userinfo often carry secrets (API keys, signed links, ``user:password@``), so importing
  this module installs ``RedactUrls`` on the ``httpx`` logger: those records show
  ``scheme://host/path`` only. It covers every httpx client in the process (this module,
  webhooks, the agent).
* **Connections** — one ``GuardedTransport`` serves every call: a connection is kept alive
  per origin for ``keepalive_seconds`` (as many per origin as ``max_concurrency``) and reused
  by the next call to that origin; each was vetted when it was opened. No cookie jar: nothing
  one call's response sets reaches another call (nor a later hop of the same call).

It is over 400 lines because the three tools share one exchange through the netguard (limits, header
rules, the body's rendering) and one config, and their argument checks run before approval.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import httpcore
import httpx
import msgspec
import trio

from turnstile.runtime.errors import InvalidArgument, LimitExceeded, TurnstileError
from turnstile.tools.modules.filesystem import PendingFile, Sandbox
from turnstile.tools.modules.http_messages import (
    RedactUrls,
    _check_headers,
    _read_capped,
    _render_body,
    _selected_headers,
    redact_url,
)
from turnstile.tools.netguard import (
    GuardedTransport,
    NetPolicy,
    Resolver,
    check_url,
    open_response,
)
from turnstile.tools.policy import Policy
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = [
    "POLICIES",
    "HttpConfig",
    "HttpModule",
    "RequestFailed",
    "RequestTimeout",
    "RedactUrls",
    "redact_url",
    "register_http_module",
]

MiB = 1024 * 1024

#: Default policy per action: reading a URL runs on its own; sending data or writing files
#: needs a person's approval.
POLICIES: dict[str, str] = {
    "http.get": "AUTO",
    "http.post": "APPROVE",
    "http.download": "APPROVE",
}


#: The header a request that changes something carries its call's idempotency key in
#: (lowercase, as the module keeps every header name).
IDEMPOTENCY_HEADER = "idempotency-key"


class RequestFailed(TurnstileError):
    """The request could not be completed (connection refused, protocol error, bad status
    for a download)."""

    code = "request_failed"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RequestTimeout(TurnstileError):
    """The call took longer than its ``timeout``."""

    code = "timeout"

    def __init__(self, message: str, field: str | None = "timeout") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class HttpConfig:
    """Settings of the http module.

    Attributes:
        allowed_hosts: host names (or ``*.suffix``, or IP literals) opened despite resolving
            to non-public addresses.
        allowed_networks: CIDR blocks opened likewise.
        default_timeout / max_timeout: seconds per call, when unsaid / at most.
        default_max_bytes / max_bytes: response body kept, when unsaid / at most.
        max_download_bytes: largest ``http.download`` (its default and ceiling).
        max_request_bytes: largest ``http.post`` body.
        max_redirects: redirects followed per call.
        max_concurrency: calls of this module running at once (and idle connections kept
            per origin).
        keepalive_seconds: how long an idle connection is kept for the next call to its
            origin (0: a connection per call). Each was vetted when it was opened.
        user_agent: the ``User-Agent`` sent unless the call sets one.
    """

    allowed_hosts: tuple[str, ...] = ()
    allowed_networks: tuple[str, ...] = ()
    default_timeout: float = 30.0
    max_timeout: float = 120.0
    default_max_bytes: int = 1 * MiB
    max_bytes: int = 10 * MiB
    max_download_bytes: int = 100 * MiB
    max_request_bytes: int = 1 * MiB
    max_redirects: int = 5
    max_concurrency: int = 16
    keepalive_seconds: float = 30.0
    user_agent: str = "turnstile-http/0.1"

    def __post_init__(self) -> None:
        if not 0 < self.default_timeout <= self.max_timeout:
            raise ValueError("default_timeout must be positive and at most max_timeout")
        if not 0 < self.default_max_bytes <= self.max_bytes:
            raise ValueError("default_max_bytes must be positive and at most max_bytes")
        if self.max_redirects < 0 or self.max_concurrency < 1:
            raise ValueError("max_redirects must be >= 0 and max_concurrency >= 1")
        if not 0 <= self.keepalive_seconds <= 3600:
            raise ValueError("keepalive_seconds must be from 0 to 3600")
        NetPolicy(tuple(self.allowed_hosts), tuple(self.allowed_networks))  # valid CIDR


Url = Annotated[str, msgspec.Meta(min_length=1, max_length=4096, description="http(s) URL")]
Headers = Annotated[
    dict[
        Annotated[str, msgspec.Meta(min_length=1, max_length=256)],
        Annotated[str, msgspec.Meta(max_length=8192)],
    ],
    msgspec.Meta(max_length=50),
]
Timeout = Annotated[float, msgspec.Meta(gt=0, le=120, description="seconds for the whole call")]
MaxBytes = Annotated[int, msgspec.Meta(ge=1, le=10 * MiB, description="response bytes kept")]


class GetParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``http.get``."""

    url: Url
    headers: Headers = msgspec.field(default_factory=dict)
    timeout: Timeout | None = None
    max_bytes: MaxBytes | None = None


class PostParams(GetParams, kw_only=True):
    """Arguments of ``http.post``: ``body`` (text) or ``json`` (any value), not both."""

    body: Annotated[str, msgspec.Meta(max_length=10 * MiB)] | None = None
    json: Any | msgspec.UnsetType = msgspec.UNSET
    content_type: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class DownloadParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``http.download``."""

    url: Url
    destination: Annotated[
        str, msgspec.Meta(min_length=1, max_length=4096, description="path under the root")
    ]
    headers: Headers = msgspec.field(default_factory=dict)
    timeout: Timeout | None = None
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None
    overwrite: bool = False
    create_parents: bool = False


#: ``async (call, tool name, params) -> task view``: run an approved call as a background task
#: whose completion notifies the session (the node binds it to the background actor).
StartBackground = Callable[[ToolCall, str, dict[str, Any]], Awaitable[dict[str, Any]]]


class HttpModule:
    """The handlers of the http module (see ``register_http_module``)."""

    def __init__(
        self,
        config: HttpConfig,
        *,
        sandbox: Sandbox | None = None,
        resolver: Resolver | None = None,
        backend: httpcore.AsyncNetworkBackend | None = None,
        start_background: StartBackground | None = None,
    ) -> None:
        self.config = config
        self.sandbox = sandbox
        self.start_background = start_background
        self.policy = NetPolicy(tuple(config.allowed_hosts), tuple(config.allowed_networks))
        self.resolver = resolver
        self.backend = backend
        self.limiter = trio.CapacityLimiter(config.max_concurrency)
        #: One transport for every call: its connections stay open per origin for the next
        #: call (a watcher checking a URL every few seconds reuses its connection). Each call
        #: still gets a client of its own, so cookies never pass from one call to another.
        self.transport = GuardedTransport(
            self.policy,
            resolver=resolver,
            backend=backend,
            keepalive_expiry=config.keepalive_seconds,
            max_idle_per_origin=config.max_concurrency,
        )

    async def aclose(self) -> None:
        """Close the idle connections (those in use close with their calls)."""
        await self.transport.aclose()

    def _timeout(self, timeout: float | None) -> float:
        value = timeout or self.config.default_timeout
        if value > self.config.max_timeout:
            raise InvalidArgument(
                f"timeout may be at most {self.config.max_timeout:g} seconds", field="timeout"
            )
        return value

    def _headers(self, headers: dict[str, str]) -> dict[str, str]:
        merged = {
            "user-agent": self.config.user_agent,
            "accept": "*/*",
            "accept-encoding": "identity",
        }
        for name, value in _check_headers(headers).items():
            merged[name.lower()] = value
        return merged

    async def _exchange(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        timeout: float,  # noqa: ASYNC109 (the tool's own deadline, applied below)
        content: bytes | None,
        consume: Callable[[httpx.Response], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Send the request and hand the streamed response to ``consume``, within
        ``timeout`` and the module's concurrency limit; maps failures to Turnstile errors."""
        parsed = check_url(url)
        started = trio.current_time()
        async with self.limiter:
            with trio.move_on_after(timeout) as deadline:
                try:
                    # Straight to the shared transport, without a client per call: no cookie
                    # jar (so none passes from one call to the next), and the cancel scope
                    # above bounds the whole call.
                    async with open_response(
                        self.transport,
                        method,
                        parsed,
                        headers=headers,
                        content=content,
                        max_redirects=self.config.max_redirects,
                    ) as (response, hops):
                        result = await consume(response)
                        result.setdefault("status_code", response.status_code)
                        result["url"] = str(response.url)
                        result["redirects"] = hops
                except httpx.TimeoutException:
                    raise RequestTimeout(f"{method} {url} timed out after {timeout:g} s") from None
                except httpx.HTTPError as exc:
                    detail = str(exc) or type(exc).__name__
                    raise RequestFailed(f"{method} {url} failed: {detail}", field="url") from None
        if deadline.cancelled_caught:
            raise RequestTimeout(f"{method} {url} timed out after {timeout:g} s")
        result["elapsed_ms"] = round((trio.current_time() - started) * 1000)
        return result

    def _max_bytes(self, value: int | None) -> int:
        limit = value or self.config.default_max_bytes
        if limit > self.config.max_bytes:
            raise InvalidArgument(
                f"max_bytes may be at most {self.config.max_bytes}", field="max_bytes"
            )
        return limit

    async def _fetch(
        self, method: str, params: GetParams, content: bytes | None, headers: dict[str, str]
    ) -> dict[str, Any]:
        limit = self._max_bytes(params.max_bytes)

        async def consume(response: httpx.Response) -> dict[str, Any]:
            data, truncated = await _read_capped(response, limit)
            return {
                "status_code": response.status_code,
                "headers": _selected_headers(response),
                **_render_body(response, data, truncated),
                "bytes": len(data),
                "truncated": truncated,
            }

        return await self._exchange(
            method, params.url, headers, self._timeout(params.timeout), content, consume
        )

    async def get(self, call: ToolCall, params: GetParams) -> dict[str, Any]:
        return await self._fetch("GET", params, None, self._headers(params.headers))

    async def post(self, call: ToolCall, params: PostParams) -> dict[str, Any]:
        headers = self._headers(params.headers)
        if params.body is not None and params.json is not msgspec.UNSET:
            raise InvalidArgument("give body or json, not both", field="json")
        if params.json is not msgspec.UNSET:
            content = msgspec.json.encode(params.json)
            headers.setdefault("content-type", "application/json")
        else:
            content = (params.body or "").encode("utf-8")
            headers.setdefault("content-type", "text/plain; charset=utf-8")
        if params.content_type is not None:
            headers["content-type"] = _check_headers({"content-type": params.content_type})[
                "content-type"
            ]
        if call.idempotency_key is not None:  # the caller's own key, if it set one, wins
            headers.setdefault(IDEMPOTENCY_HEADER, call.idempotency_key)
        if len(content) > self.config.max_request_bytes:
            raise LimitExceeded(
                f"the request body is {len(content)} bytes; "
                f"the limit is {self.config.max_request_bytes}",
                field="json" if params.json is not msgspec.UNSET else "body",
            )
        return await self._fetch("POST", params, content, headers)

    async def check_post(self, call: ToolCall, params: PostParams) -> None:
        """``http.post``'s precheck (before approval is asked): the URL, headers and bounds.

        Raises:
            InvalidArgument: as ``post`` would.
        """
        check_url(params.url)
        self._headers(params.headers)
        self._timeout(params.timeout)
        self._max_bytes(params.max_bytes)
        if params.body is not None and params.json is not msgspec.UNSET:
            raise InvalidArgument("give body or json, not both", field="json")

    def _download_limit(self, params: DownloadParams) -> int:
        limit = params.max_bytes or self.config.max_download_bytes
        if limit > self.config.max_download_bytes:
            raise InvalidArgument(
                f"max_bytes may be at most {self.config.max_download_bytes}", field="max_bytes"
            )
        return limit

    async def check_download(self, call: ToolCall, params: DownloadParams) -> None:
        """``http.download``'s precheck (before approval is asked): the URL, headers, bounds
        and ``destination`` (which must stay under the workspace root).

        Raises:
            InvalidArgument, PathOutsideRoot: as ``download`` would.
        """
        assert self.sandbox is not None, "http.download is registered only with a sandbox"
        check_url(params.url)
        self._headers(params.headers)
        self._timeout(params.timeout)
        self._download_limit(params)
        await trio.to_thread.run_sync(self.sandbox.resolve, params.destination, "destination")

    async def download(self, call: ToolCall, params: DownloadParams) -> dict[str, Any]:
        if self.start_background is not None and not call.background:
            return await self.start_background(call, "http.download", msgspec.to_builtins(params))
        sandbox = self.sandbox
        assert sandbox is not None, "http.download is registered only with a sandbox"
        limit = self._download_limit(params)
        check_url(params.url)
        target = await trio.to_thread.run_sync(sandbox.resolve, params.destination, "destination")

        async def consume(response: httpx.Response) -> dict[str, Any]:
            if not 200 <= response.status_code < 300:
                raise RequestFailed(
                    f"the server answered {response.status_code} {response.reason_phrase}; "
                    "nothing was written",
                    field="url",
                )
            pending: PendingFile = await trio.to_thread.run_sync(
                lambda: sandbox.begin_write(
                    target,
                    overwrite=params.overwrite,
                    create_parents=params.create_parents,
                    field="destination",
                )
            )
            try:
                async for chunk in response.aiter_bytes():
                    if pending.size + len(chunk) > limit:
                        raise LimitExceeded(
                            f"the download is larger than {limit} bytes; nothing was written",
                            field="max_bytes",
                        )
                    await trio.to_thread.run_sync(pending.write, chunk)
                await trio.to_thread.run_sync(pending.commit)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(pending.discard)
                raise
            return {
                "status_code": response.status_code,
                "path": target.rel,
                "bytes": pending.size,
                "content_type": response.headers.get("content-type"),
            }

        return await self._exchange(
            "GET",
            params.url,
            self._headers(params.headers),
            self._timeout(params.timeout),
            None,
            consume,
        )


def register_http_module(
    registry: ToolRegistry,
    config: HttpConfig,
    *,
    sandbox: Sandbox | None = None,
    resolver: Resolver | None = None,
    backend: httpcore.AsyncNetworkBackend | None = None,
    start_background: StartBackground | None = None,
) -> HttpModule:
    """Register ``http.get``, ``http.post`` and — given the filesystem module's ``sandbox`` —
    ``http.download``.

    Args:
        resolver, backend: replace DNS resolution and the socket layer (tests).
        start_background: makes ``http.download`` a background action (see the module
            docstring); without it the download runs inline.
    """
    module = HttpModule(
        config,
        sandbox=sandbox,
        resolver=resolver,
        backend=backend,
        start_background=start_background,
    )
    registry.register(
        "http.get",
        GetParams,
        module.get,
        "GET an http(s) URL (public addresses only, redirects followed); returns status, "
        "selected headers and the body (JSON parsed, text, or base64), truncated at max_bytes.",
        policy=Policy(POLICIES["http.get"]),
    )
    registry.register(
        "http.post",
        PostParams,
        module.post,
        "POST text (body) or JSON (json) to an http(s) URL; returns like http.get.",
        policy=Policy(POLICIES["http.post"]),
        precheck=module.check_post,
    )
    if sandbox is not None:
        registry.register(
            "http.download",
            DownloadParams,
            module.download,
            "Download an http(s) URL into a file under the workspace root (destination), in "
            "the background: answers at once with a task_id, and you are notified when the "
            "file is in place (it appears only when complete).",
            policy=Policy(POLICIES["http.download"]),
            precheck=module.check_download,
        )
    return module
