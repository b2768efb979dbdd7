"""The HTTP envelope every endpoint shares (SPEC.md 1 "Observability" 2, 7; DESIGN.md
"Conventions"): ``X-Request-Id`` equal to the body's ``request_id`` on every response, success
and error alike, and the error body ``{"error": {code, message, details}, "request_id"}``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.service import BOOTSTRAP_TOKEN, Api, Project, Response, assert_error, combined_app, start_app

REQ_ID = re.compile(r"^req_[0-9a-hjkmnp-tv-z]{26}$")
BOOT = {"x-service-bootstrap-token": BOOTSTRAP_TOKEN}


def assert_ids(r: Response) -> str:
    """The header and the body carry the same, well-formed request id."""
    assert "X-Request-Id" in r.headers, r.headers
    assert isinstance(r.body, dict), r.raw
    assert r.headers["X-Request-Id"] == r.body["request_id"], (r.headers, r.body)
    assert r.headers["Content-Type"].startswith("application/json"), r.headers
    return str(r.body["request_id"])


# --- success ----------------------------------------------------------------------------------


async def test_healthz_and_readyz_answer_200_with_the_envelope(service: Api) -> None:
    for path in ("/healthz", "/readyz"):
        r = await service.get(path)
        assert r.status == 200, (path, r.body)
        assert REQ_ID.match(assert_ids(r)), r.body


async def test_success_carries_request_id_at_top_level(project: Project) -> None:
    r = await project.api.get("/v1/projects/me")
    assert r.status == 200
    assert REQ_ID.match(assert_ids(r))
    assert r.body["id"] == project.id  # resource fields at top level beside request_id


async def test_created_response_carries_request_id(project: Project) -> None:
    r = await project.api.post("/v1/stores", {"name": "envelope"})
    assert r.status == 201, r.body
    assert REQ_ID.match(assert_ids(r))


async def test_each_request_gets_its_own_id(service: Api) -> None:
    ids = {assert_ids(await service.get("/healthz")) for _ in range(5)}
    assert len(ids) == 5


# --- errors from routing ----------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/no-such-thing"),
    ("POST", "/v1/no-such-thing"),
    ("GET", "/"),
    ("DELETE", "/v2/projects/me"),
])
async def test_unknown_route_is_not_found_envelope(service: Api, method: str, path: str) -> None:
    r = await service.request(method, path)
    assert_error(r, 404, "not_found")
    assert REQ_ID.match(assert_ids(r))


async def test_unknown_route_with_a_key_is_still_not_found(project: Project) -> None:
    r = await project.api.get("/v1/projects/you")
    assert_error(r, 404, "not_found")


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/v1/bootstrap", "POST"),
    ("PUT", "/v1/projects/me", "GET"),
    ("DELETE", "/v1/stores", "POST"),
    ("POST", "/healthz", "GET"),
])
async def test_wrong_method_is_method_not_allowed_envelope(
    service: Api, method: str, path: str, allowed: str
) -> None:
    r = await service.request(method, path)
    assert_error(r, 405, "method_not_allowed")
    assert allowed in r.headers.get("Allow", ""), r.headers
    assert REQ_ID.match(assert_ids(r))


# --- errors from bodies -----------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"{not json", b'{"name": "x",}', b"\xff\xfe", b'{"name": "x"'])
async def test_malformed_json_is_invalid_request(project: Project, raw: bytes) -> None:
    r = await project.api.post("/v1/stores", data=raw)
    assert_error(r, 400, "invalid_request")
    assert_ids(r)


async def test_malformed_json_on_bootstrap_is_invalid_request(service: Api) -> None:
    r = await service.post("/v1/bootstrap", data=b'{"tenant_name": ', headers=BOOT)
    assert_error(r, 400, "invalid_request")


@pytest.mark.parametrize("value", [[], [1, 2], "name", 42, None, True])
async def test_non_object_json_is_invalid_request(project: Project, value: Any) -> None:
    r = await project.api.post("/v1/stores", data=orjson.dumps(value))
    assert_error(r, 400, "invalid_request")


async def test_empty_body_is_invalid_request(project: Project) -> None:
    r = await project.api.post("/v1/stores", data=b"")
    assert_error(r, 400, "invalid_request")


def _fields(r: Response) -> list[str]:
    return [f["field"] for f in r.body["error"]["details"].get("fields", [])]


async def test_unknown_body_field_is_rejected_naming_it(project: Project) -> None:
    r = await project.api.post("/v1/stores", {"name": "s", "colour": "blue"})
    assert_error(r, 400, "invalid_request")
    assert "colour" in _fields(r), r.body
    # Nothing was created by the rejected call.
    listing = await project.api.get("/v1/stores")
    assert listing.status == 200 and listing.body["data"] == []


async def test_unknown_field_on_api_key_create_and_bootstrap(project: Project, service: Api) -> None:
    r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "n", "scopes": [],
                                                "expires": "never"})
    assert_error(r, 400, "invalid_request")
    assert "expires" in _fields(r), r.body
    r = await service.post("/v1/bootstrap", {"tenant_name": "t", "project_name": "p",
                                             "environment": "e", "plan": "pro"}, headers=BOOT)
    assert_error(r, 400, "invalid_request")
    assert "plan" in _fields(r), r.body


async def test_missing_and_mistyped_fields_are_named(project: Project) -> None:
    r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": 7, "scopes": []})
    assert_error(r, 400, "invalid_request")
    assert "name" in _fields(r), r.body
    r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "scopes": []})
    assert_error(r, 400, "invalid_request")
    assert "name" in _fields(r), r.body


# --- payload size -----------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def small_service(settings_factory: Callable[..., Settings],
                        http: ClientSession) -> AsyncIterator[Api]:
    running = await start_app(combined_app(settings_factory(max_body_bytes=2048)))
    try:
        yield Api(http, running.base_url)
    finally:
        await running.stop()


async def test_oversized_body_is_payload_too_large(small_service: Api, project: Project) -> None:
    api = small_service.with_key(project.key)
    big = orjson.dumps({"name": "x" * 4096})
    r = await api.post("/v1/stores", data=big)
    assert_error(r, 413, "payload_too_large")
    assert REQ_ID.match(assert_ids(r))
    # Under the limit the same endpoint works on the same server.
    r = await api.post("/v1/stores", {"name": "small"})
    assert r.status == 201, r.body


async def test_oversized_bootstrap_is_payload_too_large(small_service: Api) -> None:
    body = {"tenant_name": "t" * 3000, "project_name": "p", "environment": "e"}
    r = await small_service.post("/v1/bootstrap", body, headers=BOOT)
    assert_error(r, 413, "payload_too_large")


async def test_oversized_write_is_payload_too_large(small_service: Api, project: Project) -> None:
    api = small_service.with_key(project.key)
    store = await api.post("/v1/stores", {"name": "big-writes"})
    assert store.status == 201, store.body
    writes = [{"object": f"document:{i}", "relation": "viewer", "user": "user:anne"}
              for i in range(100)]
    r = await api.post(f"/v1/stores/{store.body['id']}/write", {"writes": writes})
    assert_error(r, 413, "payload_too_large")


# --- incoming request ids ---------------------------------------------------------------------


@pytest.mark.parametrize("incoming", ["trace-abc-12345678", "0af7651916cd43dd8448eb211c80319c",
                                      "req_01hzzzzzzzzzzzzzzzzzzzzzzz"])
async def test_valid_incoming_request_id_is_reused(service: Api, project: Project,
                                                   incoming: str) -> None:
    r = await service.get("/healthz", headers={"X-Request-Id": incoming})
    assert r.status == 200
    assert assert_ids(r) == incoming
    # On errors too.
    r = await service.get("/v1/nowhere", headers={"X-Request-Id": incoming})
    assert_error(r, 404, "not_found")
    assert r.body["request_id"] == incoming
    r = await project.api.post("/v1/stores", data=b"[", headers={"X-Request-Id": incoming})
    assert_error(r, 400, "invalid_request")
    assert r.body["request_id"] == incoming


@pytest.mark.parametrize("incoming", ["short", "has spaces in it", "x" * 300, "<script>alert</script>",
                                      "line\tbreak-1234"])
async def test_invalid_incoming_request_id_is_replaced(service: Api, incoming: str) -> None:
    r = await service.get("/healthz", headers={"X-Request-Id": incoming})
    assert r.status == 200
    rid = assert_ids(r)
    assert rid != incoming and REQ_ID.match(rid), rid


# --- auth errors carry the envelope too -------------------------------------------------------


async def test_auth_errors_carry_the_envelope(service: Api) -> None:
    r = await service.get("/v1/projects/me")
    assert_error(r, 401, "missing_api_key")
    assert REQ_ID.match(assert_ids(r))
    r = await service.get("/v1/projects/me", key="sk_live_" + "0" * 43)
    assert_error(r, 401, "invalid_api_key")
    r = await service.post("/v1/bootstrap", {"tenant_name": "t", "project_name": "p",
                                             "environment": "e"})
    assert_error(r, 401, "missing_bootstrap_token")


# --- where the envelope runs ------------------------------------------------------------------


async def test_without_tracing_the_envelope_runs_around_an_app_without_middleware(
    settings_factory: Callable[..., Settings], service: Api,
) -> None:
    """Issue 12 (the check path): aiohttp adds a coroutine layer and a chain lookup per request
    to any app with a middleware, so without tracing ``base_app`` has none and
    ``EnvelopeRunner`` runs the envelope around the app; the service above is such an app, and
    its 404s, 405s and successes keep the envelope and the request id."""
    from engine.app import create_engine_app

    assert list(create_engine_app(settings_factory()).middlewares) == []
    for method, path, status in (("GET", "/v1/no-such-thing", 404), ("POST", "/healthz", 405)):
        r = await service.request(method, path)
        assert r.status == status and REQ_ID.match(assert_ids(r))
    assert REQ_ID.match(assert_ids(await service.get("/healthz")))
