"""The console's routes: the page at ``GET /console`` and its files at ``GET /console/{name}``.

Both are ``HttpRoute(auth="public")``: a browser must load them before the person has typed a
token, and they are the same bytes for everyone (no user, no data; everything the console shows
comes from the token-protected API afterwards). Only the files shipped in ``static/`` are
served, looked up by name in a table built at start-up, so no path from a request ever reaches
the file system. Every answer carries a strict Content-Security-Policy (scripts, styles and
connections to this origin only, no inline script, no framing), ``nosniff``, no referrer, and
an ``ETag`` so a reload costs a ``304``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from starlette.responses import Response

from turnstile.runtime.errors import NotFound
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute, Param, Reply

__all__ = ["Asset", "Assets", "console_routes", "load_assets"]

#: The package folder the files are shipped in (pyproject's package-data).
STATIC = "static"
#: The page ``/console`` answers with.
INDEX = "index.html"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

#: Same origin only; ``connect-src 'self'`` covers the WebSocket to this host (CSP level 3).
CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    # revalidate every time: the files change with the package, and a 304 is cheap
    "cache-control": "no-cache",
}


@dataclass(frozen=True, slots=True)
class Asset:
    """One shipped file: its bytes, media type and entity tag."""

    body: bytes
    media_type: str
    etag: str


#: file name → file.
Assets = dict[str, Asset]


def load_assets() -> Assets:
    """Read every file shipped in the package's ``static/`` folder (flat: no sub-folders).

    Raises:
        FileNotFoundError: the package was installed without its files, or without the page.
    """
    folder = resources.files("turnstile.actors.console").joinpath(STATIC)
    assets: Assets = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in _TYPES:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        assets[entry.name] = Asset(body, _TYPES[suffix], etag)
    if INDEX not in assets:
        raise FileNotFoundError(f"the console's {INDEX} is missing from {folder}")
    return assets


def _answer(asset: Asset, request: ApiRequest) -> Response:
    headers = {**_HEADERS, "etag": asset.etag}
    if asset.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


def console_routes(assets: Assets) -> list[HttpRoute]:
    """``GET /console`` and ``GET /console/{name}`` over ``assets``."""

    async def page(request: ApiRequest) -> Response:
        return _answer(assets[INDEX], request)

    async def asset(request: ApiRequest) -> Response:
        name = request.path["name"]
        found = assets.get(name)
        if found is None:
            raise NotFound(f"no console file {name!r}")
        return _answer(found, request)

    # for the API document (/openapi.json): the files' media types, the revalidation
    etag = (Param("ETag", required=True, description="the file's entity tag"),)
    ask = (Param("If-None-Match", description="an ETag seen before: 304 if it still is"),)
    same = Reply(None, "Not Modified: the ETag sent is the file's", headers=etag)
    files = tuple(sorted({media.split(";")[0] for media in _TYPES.values()}))
    return [
        HttpRoute(
            "GET",
            "/console",
            page,
            auth="public",
            summary="The console's page (a browser client of this API)",
            headers=ask,
            responses={200: Reply(str, "The page", "text/html", etag), 304: same},
        ),
        HttpRoute(
            "GET",
            "/console/{name}",
            asset,
            auth="public",
            summary="One of the console's files (scripts, style sheet)",
            headers=ask,
            responses={200: Reply(str, "The file", files, etag), 304: same},
            errors=(404,),
        ),
    ]
