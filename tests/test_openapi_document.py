"""The service's OpenAPI document: generated from the route tables, current in docs/, served at
``GET /openapi.json``, valid OpenAPI 3.1, and covering every route the service answers."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import orjson
from aiohttp import ClientSession
from openapi_spec_validator import validate

from common.settings import Settings
from control_plane.app import openapi_document
from tests.fixtures.service import Api, combined_app, serving

DOCUMENT = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"
_PARAM_RE = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")


def test_docs_openapi_json_is_current() -> None:
    assert DOCUMENT.read_bytes() == openapi_document(dev_mailbox=True), (
        "docs/openapi.json is stale: run `make openapi` and commit it")


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = orjson.loads(openapi_document(dev_mailbox=True))
    validate(doc)
    assert doc["openapi"] == "3.1.0"


def test_schemas_use_json_schema_keywords_only() -> None:
    """Pydantic writes a constraint it cannot place (``Field(ge=1)`` after a validator in an
    ``Annotated``) under its own name: a JSON Schema validator ignores ``ge``, so the document
    would call ``-30`` valid where the service refuses it."""
    found: list[str] = []

    def walk(node: object, at: str) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number", "string", "array"):
                found.extend(f"{at}.{k}" for k in ("ge", "gt", "le", "lt", "min_length",
                                                   "max_length", "multiple_of") if k in node)
            for key, value in node.items():
                walk(value, f"{at}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{at}[{i}]")
    walk(orjson.loads(openapi_document(dev_mailbox=True)), "$")
    assert found == []


async def test_served_document_covers_every_route(service: Api,
                                                  settings_factory: Callable[..., Settings],
                                                  http: ClientSession) -> None:
    r = await service.get("/openapi.json")
    assert r.status == 200 and r.headers["Content-Type"].startswith("application/json")
    assert r.raw == openapi_document(dev_mailbox=True)  # the test service is a local run
    documented = {(method.upper(), path) for path, item in r.body["paths"].items()
                  for method in item}
    app = combined_app(settings_factory())
    served = {(route.method, _PARAM_RE.sub(r"{\1}", route.resource.canonical))
              for route in app.router.routes()
              if route.method != "HEAD" and route.resource is not None}
    # Forward auth answers any method (engine.edge.mount); its common methods are documented.
    any_method = {path for method, path in served if method == "*"}
    assert any_method == {"/v1/edge/auth", "/v1/edge/auth/{tail}"}
    # CORS preflights (control_plane.tenancy.cors) answer OPTIONS on the public paths only; they
    # are no operation (the document's description says which origins they answer).
    preflights = {path for method, path in served if method == "OPTIONS"}
    assert preflights and all(p.startswith(("/v1/auth/", "/v1/sessions/")) for p in preflights)
    assert (served - {("*", path) for path in any_method}
            - {("OPTIONS", path) for path in preflights}) == documented
    assert {("POST", "/v1/stores/{store_id}/check"), ("GET", "/v1/dev/mailbox"),
            ("GET", "/openapi.json"), ("GET", "/healthz")} <= served


async def test_a_deployment_documents_what_it_serves(settings_factory: Callable[..., Settings],
                                                     http: ClientSession) -> None:
    """Without the development mailbox, neither the routes nor the document have it."""
    settings = settings_factory(base_url="https://auth.example.test")
    assert not settings.serves_dev_mailbox
    async with serving(http, combined_app(settings)) as api:
        r = await api.get("/openapi.json")
        assert r.status == 200
        assert "/v1/dev/mailbox" not in r.body["paths"]
        assert "/v1/users" in r.body["paths"]
        assert (await api.get("/v1/dev/mailbox")).status == 404
