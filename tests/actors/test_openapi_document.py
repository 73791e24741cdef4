"""The node's API document covers the node: every route a node with every default feature
mounts (GitHub's receiver and a declared hook included) is in ``/openapi.json`` and describes
itself (a route added without a summary or its answer fails here, strictly), and the document
is OpenAPI 3.1 by the specification's own schema and by Schemathesis's loader."""

from __future__ import annotations

import httpx
import jsonschema
import schemathesis
from schemathesis.specs.openapi.definitions import OPENAPI_31
from starlette.routing import Route

from turnstile.actors.config import Config
from turnstile.actors.node import open_node
from turnstile.actors.webhooks.settings import GitHubConfig, HookConfig, WebhooksConfig
from turnstile.runtime.gateway.openapi import openapi_document

TOKEN = "ada-token-0123456789abcdef"


def config(tmp_path) -> Config:
    webhooks = WebhooksConfig(
        github=GitHubConfig(secret="github-secret-0123456789"),
        hooks={
            "deploys": HookConfig(
                user="ada", secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", session="ci"
            )
        },
    )
    return Config(store=f"sqlite:///{tmp_path}/node.db", webhooks=webhooks)


async def test_every_mounted_route_is_in_the_document_and_describes_itself(tmp_path):
    async with open_node(config(tmp_path), tokens={TOKEN: "ada"}, serve=False) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            answer = await http.get("/openapi.json")
        mounted = {
            (method, route.path)
            for route in node.app.routes
            if isinstance(route, Route)
            for method in route.methods or ()
            if method != "HEAD"
        }
        routes = [
            route for feature in node.features.values() for route in feature.routes(node.context)
        ]
    assert answer.status_code == 200
    document = answer.json()
    documented = {
        (method.upper(), path) for path, ops in document["paths"].items() for method in ops
    }
    assert mounted == documented
    assert {("POST", "/webhooks/github"), ("POST", "/webhooks/{name}")} <= documented
    # strict: every feature route has a summary and describes its success answer
    openapi_document(routes, title="Turnstile", version="test", strict=True)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert not operation["summary"].startswith(method.upper()), (method, path)


async def test_the_document_is_valid_openapi_3_1(tmp_path):
    async with open_node(config(tmp_path), tokens={TOKEN: "ada"}, serve=False) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            document = (await http.get("/openapi.json")).json()
    jsonschema.Draft202012Validator(OPENAPI_31).validate(document)
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    loaded = schemathesis.openapi.from_dict(document)
    loaded.validate()
    assert len(list(loaded.get_all_operations())) == sum(map(len, document["paths"].values()))
