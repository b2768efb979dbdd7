"""The OpenAPI document built from route tables (common/openapi.py; issue 9, DESIGN.md "The
OpenAPI 3.1 document of every route is generated from the route tables and the schemas").

A small route table of its own, served by an in-process aiohttp app with the real envelope
middleware (no database, no Redis): the document must be valid OpenAPI 3.1, every ``$ref`` must
resolve, the real bodies of every reply and error must validate against the schemas it declares,
and schemathesis (which issue 10 runs over every route of the service) must load it and find its
responses conforming.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

import hypothesis
import jsonschema
import orjson
import pytest
import schemathesis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from pydantic import ConfigDict, Field
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from schemathesis import APIOperation
from schemathesis import checks as st_checks
from schemathesis.core.errors import InvalidSchema
from schemathesis.core.result import Err, Ok

from common import errors, openapi
from common.http import OMIT_IF_NONE, envelope_middleware, json_response, request_id
from common.openapi import build_document, document_json
from common.routing import Operation, Reply, RouteTable, operations
from common.schemas import DisplayName, RequestModel, parse_body

T = TypeVar("T")
NOW = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)


# --- the models -------------------------------------------------------------------------------


class CreateWidget(RequestModel):
    name: DisplayName
    color: Literal["red", "blue"] = "red"


class UserQuery(RequestModel):
    from_: str | None = Field(default=None, alias="from", description="Only users created at or after this id.")
    limit: int = Field(default=50, ge=1, le=1000, description="At most this many users.")
    cursor: str | None = None


class SignupBody(RequestModel):
    email: str = Field(max_length=320)


@dataclass(frozen=True, slots=True)
class Widget:
    id: str
    name: str
    color: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Address:
    city: str
    country: str


@dataclass(frozen=True, slots=True)
class User:
    id: str
    address: Address
    nickname: str | None = field(default=None, metadata={OMIT_IF_NONE: True})
    email: str | None = None


@dataclass(frozen=True, slots=True)
class Organization:
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    data: list[T]
    next_cursor: str | None
    has_more: bool


@dataclass(frozen=True, slots=True)
class PublicConfig:
    project_id: str
    sign_in_methods: list[str]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    user: User


USERS = [User("user_1", Address("Lyon", "FR"), nickname="one"), User("user_2", Address("Oslo", "NO"))]


# --- the routes -------------------------------------------------------------------------------

table = RouteTable("widgets", "Widgets, users and friends.")


@table.route("POST", "/v1/widgets", replies=[Reply(201, "The new widget.", Widget)],
             security=("api_key",), scopes=("widgets:write",), body=CreateWidget,
             errors=(errors.RateLimited,), headers={"Idempotency-Key": "Replays the first answer."})
async def create_widget(request: web.Request) -> web.StreamResponse:
    """Create a widget.

    The widget belongs to the key's project."""
    body = await parse_body(request, CreateWidget)
    return json_response(request, Widget("wid_1", body.name, body.color, NOW), status=201)


@table.route("GET", "/v1/users", replies=[Reply(200, "A page of users.", Page[User])],
             security=("api_key",), scopes=("users:read", "users:write"), query=UserQuery)
async def list_users(request: web.Request) -> web.StreamResponse:
    """List users."""
    # Query strings are text: validated without strict mode (see the report on strict queries).
    try:
        query = UserQuery.model_validate(dict(request.query), strict=False)
    except Exception:
        raise errors.InvalidRequest("bad query") from None
    return json_response(request, Page(USERS[: query.limit], None, False))


@table.route("GET", "/v1/organizations", replies=[Reply(200, "A page of organizations.", Page[Organization])],
             security=("api_key",))
async def list_organizations(request: web.Request) -> web.StreamResponse:
    """List organizations."""
    return json_response(request, Page([Organization("org_1", "Acme")], "cur_2", True))


@table.route("GET", "/v1/users/export",
             replies=[Reply(200, "Every user, one CSV row each.", None, "text/csv",
                            {"Content-Disposition": "`attachment; filename=users.csv`."})],
             security=("api_key",), scopes=("users:read",), allow_head=False)
async def export_users(request: web.Request) -> web.StreamResponse:
    """Export users as CSV."""
    # a streamed reply is prepared here, before the envelope middleware sees it: it sets its own id
    response = web.StreamResponse(headers={"Content-Type": "text/csv", "X-Request-Id": request_id(request),
                                           "Content-Disposition": "attachment; filename=users.csv"})
    await response.prepare(request)
    await response.write(b"id,city\r\n")
    for user in USERS:
        await response.write(f"{user.id},{user.address.city}\r\n".encode())
    await response.write_eof()
    return response


@table.route("GET", "/v1/users/{user_id}", replies=[Reply(200, "The user.", User)],
             security=("api_key", "session"), errors=(errors.UserNotFound,))
async def get_user(request: web.Request) -> web.StreamResponse:
    """Get a user."""
    for user in USERS:
        if user.id == request.match_info["user_id"]:
            return json_response(request, user)
    raise errors.UserNotFound()


@table.route("DELETE", "/v1/users/{user_id}", replies=[Reply(204, "Deleted.", None, None)],
             security=("api_key",), scopes=("users:write",), errors=(errors.UserNotFound,))
async def delete_user(request: web.Request) -> web.StreamResponse:
    """Delete a user."""
    if request.match_info["user_id"] not in {u.id for u in USERS}:
        raise errors.UserNotFound()
    return web.Response(status=204)


@table.route("GET", "/v1/public/config", replies=[Reply(200, "The project's public settings.", PublicConfig)],
             project=True)
async def public_config(request: web.Request) -> web.StreamResponse:
    """A project's public settings."""
    project = request.query.get("project_id") or request.headers.get("Service-Project")
    if project is None or project != "proj_1":
        raise errors.ProjectNotFound()
    return json_response(request, PublicConfig(project, ["magic_link"]))


@table.route("POST", "/v1/public/signup", replies=[Reply(202, "Accepted: a link is on its way.")],
             project=True, body=SignupBody)
async def signup(request: web.Request) -> web.StreamResponse:
    """Ask for a sign-up link."""
    await parse_body(request, SignupBody)
    return json_response(request, {}, status=202)


@table.route("GET", "/v1/sessions/me", replies=[Reply(200, "The caller's session.", SessionInfo)],
             security=("session",), errors=(errors.NoSession,))
async def get_session(request: web.Request) -> web.StreamResponse:
    """The caller's session."""
    return json_response(request, SessionInfo("sess_1", USERS[0]))


@table.route("GET", "/v1/events/{tail:.*}",
             replies=[Reply(200, "Events as they happen, one JSON object a line.", None, "application/x-ndjson")],
             security=("bootstrap_token",))
async def stream_events(request: web.Request) -> web.StreamResponse:
    """Follow events."""
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson",
                                           "X-Request-Id": request_id(request)})
    await response.prepare(request)
    await response.write(orjson.dumps({"tail": request.match_info["tail"]}) + b"\n")
    await response.write_eof()
    return response


@table.route("GET", "/v1/pages", replies=[Reply(200, "A landing page.", None, "text/html")])
async def landing(request: web.Request) -> web.StreamResponse:
    """The landing page."""
    return web.Response(text="<!doctype html><title>authio</title>", content_type="text/html")


OPS = operations([table])
TAGS = [("widgets", table.description)]


def build(ops: list[Operation] = OPS) -> dict[str, Any]:
    return build_document(ops, title="authio", version="0.1.0", description="Test API.", tags=TAGS)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return build()


def app() -> web.Application:
    application = web.Application(middlewares=[envelope_middleware])
    table.mount(application.router)
    return application


# --- helpers ----------------------------------------------------------------------------------

DOC_URI = "urn:authio:openapi"


def registry(doc: dict[str, Any]) -> Registry[Any]:
    resource: Resource[Any] = Resource.from_contents(doc, default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(DOC_URI, resource)
    return registry


def pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def response_validator(doc: dict[str, Any], path: str, method: str, status: int,
                       content_type: str = "application/json") -> Draft202012Validator:
    ref = DOC_URI + pointer("paths", path, method, "responses", str(status), "content", content_type, "schema")
    return Draft202012Validator({"$ref": ref}, registry=registry(doc),
                                format_checker=Draft202012Validator.FORMAT_CHECKER)


def walk(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, item
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


def op_of(doc: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    result: dict[str, Any] = doc["paths"][path][method]
    return result


def error_codes(doc: dict[str, Any], path: str, method: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for status, response in op_of(doc, path, method)["responses"].items():
        if int(status) >= 400:
            overlay = response["content"]["application/json"]["schema"]["allOf"][1]
            out[int(status)] = overlay["properties"]["error"]["properties"]["code"]["enum"]
    return out


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with TestClient(TestServer(app())) as c:
        yield c


# --- validity ---------------------------------------------------------------------------------


def test_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    validate(doc)  # openapi-spec-validator: the official 3.1 schema and its semantic checks
    assert doc["openapi"] == "3.1.0"
    assert doc["jsonSchemaDialect"] == "https://json-schema.org/draft/2020-12/schema"
    assert doc["info"] == {"title": "authio", "version": "0.1.0", "description": "Test API."}
    assert doc["tags"] == [{"name": "widgets", "description": "Widgets, users and friends."}]


def test_every_ref_resolves(doc: dict[str, Any]) -> None:
    resolver = registry(doc).resolver(base_uri=DOC_URI)
    refs = {value for key, value in walk(doc) if key == "$ref"}
    assert refs, "the document uses components"
    for ref in refs:
        assert ref.startswith("#/components/"), ref
        resolver.lookup(ref)  # raises when it does not resolve
    # and no component is left unused, nor nested $defs left behind
    schemas = doc["components"]["schemas"]
    assert {r.rsplit("/", 1)[1] for r in refs if r.startswith("#/components/schemas/")} == set(schemas)
    assert not [key for key, _ in walk(doc) if key == "$defs"]


def test_every_operation_is_documented(doc: dict[str, Any]) -> None:
    documented = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    assert documented == {(op.method, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", op.path)) for op in OPS}
    create = op_of(doc, "/v1/widgets", "post")
    assert create["operationId"] == "create_widget"
    assert create["tags"] == ["widgets"]
    assert create["summary"] == "Create a widget."
    assert create["description"].startswith("The widget belongs to the key's project.")
    assert "`widgets:write`" in create["description"]
    assert create["requestBody"] == {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/CreateWidget"}}}}
    assert doc["components"]["schemas"]["CreateWidget"]["additionalProperties"] is False
    assert {"name": "Idempotency-Key", "in": "header", "required": False,
            "description": "Replays the first answer.", "schema": {"type": "string"}} in create["parameters"]


def test_path_parameters_from_the_template_without_regex(doc: dict[str, Any]) -> None:
    assert "/v1/events/{tail}" in doc["paths"]
    (tail,) = op_of(doc, "/v1/events/{tail}", "get")["parameters"]
    assert tail == {"name": "tail", "in": "path", "required": True,
                    "schema": {"type": "string", "pattern": "^(?:.*)$"}}
    (user_id,) = op_of(doc, "/v1/users/{user_id}", "get")["parameters"]
    assert user_id["in"] == "path" and user_id["required"] is True
    assert user_id["schema"]["type"] == "string"


def test_query_parameters_from_the_model(doc: dict[str, Any]) -> None:
    params = {p["name"]: p for p in op_of(doc, "/v1/users", "get")["parameters"]}
    assert list(params) == ["from", "limit", "cursor"]  # the alias, not from_
    assert params["from"]["in"] == "query" and params["from"]["required"] is False
    assert params["from"]["description"] == "Only users created at or after this id."
    # absent, never null; and, as every request string without a pattern of its own, no NUL
    assert params["from"]["schema"] == {"type": "string", "title": "From",
                                        "pattern": "^[^\\u0000]*$"}
    assert params["cursor"]["schema"] == {"type": "string", "title": "Cursor",
                                          "pattern": "^[^\\u0000]*$"}
    limit = params["limit"]
    assert limit["required"] is False
    assert limit["description"] == "At most this many users."
    assert limit["schema"] == {"type": "integer", "default": 50, "minimum": 1, "maximum": 1000, "title": "Limit"}
    # the query model's fields became parameters; the model itself is no component
    assert "UserQuery" not in doc["components"]["schemas"]


def test_project_routes_take_project_id_and_service_project(doc: dict[str, Any]) -> None:
    for path, method in (("/v1/public/config", "get"), ("/v1/public/signup", "post")):
        operation = op_of(doc, path, method)
        params = {(p["in"], p["name"]): p for p in operation["parameters"]}
        assert params["query", "project_id"]["required"] is False
        assert params["header", "Service-Project"]["required"] is False
        assert "security" not in operation  # public
        assert "Service-Project" in operation["description"]
    # not added twice when the query model has project_id already
    class ProjectQuery(RequestModel):
        project_id: str

    op = Operation(method="GET", path="/v1/x", handler=landing, operation_id="x", tag="t", summary="x",
                   project=True, query=ProjectQuery, replies=(Reply(200, "ok"),))
    params = op_of(build([op]), "/v1/x", "get")["parameters"]
    assert [(p["in"], p["name"], p["required"]) for p in params] == [
        ("query", "project_id", True), ("header", "Service-Project", False)]


def test_security_alternatives_and_scopes(doc: dict[str, Any]) -> None:
    assert op_of(doc, "/v1/widgets", "post")["security"] == [{"apiKey": ["widgets:write"]}]
    # scopes: any one of them is enough, so each is its own alternative
    assert op_of(doc, "/v1/users", "get")["security"] == [{"apiKey": ["users:read"]}, {"apiKey": ["users:write"]}]
    assert op_of(doc, "/v1/organizations", "get")["security"] == [{"apiKey": []}]
    assert op_of(doc, "/v1/users/{user_id}", "get")["security"] == [
        {"apiKey": []}, {"session": []}, {"sessionCookie": []}]
    assert op_of(doc, "/v1/sessions/me", "get")["security"] == [{"session": []}, {"sessionCookie": []}]
    assert op_of(doc, "/v1/events/{tail}", "get")["security"] == [{"bootstrapToken": []}]
    schemes = doc["components"]["securitySchemes"]
    assert schemes["apiKey"]["type"] == "http" and schemes["apiKey"]["scheme"] == "bearer"
    assert "sk_live_" in schemes["apiKey"]["description"] and "sk_test_" in schemes["apiKey"]["description"]
    assert schemes["session"] == {**schemes["session"], "type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
    assert schemes["sessionCookie"] == {**schemes["sessionCookie"], "type": "apiKey", "in": "cookie",
                                        "name": "service_session"}
    assert schemes["bootstrapToken"] == {**schemes["bootstrapToken"], "type": "apiKey", "in": "header",
                                         "name": "x-service-bootstrap-token"}


def test_error_enums(doc: dict[str, Any]) -> None:
    assert error_codes(doc, "/v1/widgets", "post") == {
        400: ["invalid_request"], 401: ["invalid_api_key", "missing_api_key"], 403: ["insufficient_scope"],
        413: ["payload_too_large"], 429: ["rate_limited"], 500: ["internal_error"], 503: ["db_unavailable"]}
    # Every operation may be invalid_request (a header that is not UTF-8, malformed HTTP).
    assert error_codes(doc, "/v1/organizations", "get") == {
        400: ["invalid_request"], 401: ["invalid_api_key", "missing_api_key"],
        500: ["internal_error"], 503: ["db_unavailable"]}
    assert error_codes(doc, "/v1/users/{user_id}", "get") == {
        400: ["invalid_request"], 401: ["invalid_api_key", "missing_api_key", "no_session"],
        404: ["user_not_found"], 500: ["internal_error"], 503: ["db_unavailable"]}
    assert error_codes(doc, "/v1/public/signup", "post") == {
        400: ["invalid_request"], 404: ["project_not_found"], 413: ["payload_too_large"],
        500: ["internal_error"], 503: ["db_unavailable"]}
    assert error_codes(doc, "/v1/sessions/me", "get") == {
        400: ["invalid_request"], 401: ["no_session"], 500: ["internal_error"],
        503: ["db_unavailable"]}
    assert error_codes(doc, "/v1/events/{tail}", "get") == {
        400: ["invalid_request"], 401: ["missing_bootstrap_token"], 500: ["internal_error"],
        503: ["bootstrap_disabled", "db_unavailable"]}
    assert error_codes(doc, "/v1/pages", "get") == {
        400: ["invalid_request"], 500: ["internal_error"], 503: ["db_unavailable"]}
    response = op_of(doc, "/v1/widgets", "post")["responses"]["401"]
    assert "`missing_api_key`" in response["description"] and "`invalid_api_key`" in response["description"]
    assert response["content"]["application/json"]["schema"]["allOf"][0] == {"$ref": "#/components/schemas/Error"}


def test_error_codes_and_statuses_come_from_the_error_classes() -> None:
    class Teapot(errors.ServiceError):
        code, status, default_message = "teapot", 418, "I am a teapot."

    op = Operation(method="GET", path="/v1/t", handler=landing, operation_id="t", tag="t", summary="t",
                   errors=(Teapot, errors.NotFound), replies=(Reply(200, "ok"),))
    responses = op_of(build([op]), "/v1/t", "get")["responses"]
    assert set(responses) == {"200", "400", "404", "418", "500", "503"}
    assert "I am a teapot." in responses["418"]["description"]


def test_replies_document_bodies_and_headers(doc: dict[str, Any]) -> None:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                assert response["headers"]["X-Request-Id"] == {"$ref": "#/components/headers/X-Request-Id"}, (
                    path, method, status)
    created = op_of(doc, "/v1/widgets", "post")["responses"]["201"]
    assert created["description"] == "The new widget."
    assert created["content"]["application/json"]["schema"] == {
        "allOf": [{"$ref": "#/components/schemas/Widget"}, {"$ref": "#/components/schemas/RequestId"}]}
    request_id = doc["components"]["schemas"]["RequestId"]
    assert request_id["properties"]["request_id"]["type"] == "string"
    assert request_id["required"] == ["request_id"]
    export = op_of(doc, "/v1/users/export", "get")["responses"]["200"]
    assert export["content"] == {"text/csv": {"schema": {"type": "string"}}}
    assert "Content-Disposition" in export["headers"]
    assert set(op_of(doc, "/v1/events/{tail}", "get")["responses"]["200"]["content"]) == {"application/x-ndjson"}
    assert set(op_of(doc, "/v1/pages", "get")["responses"]["200"]["content"]) == {"text/html"}
    deleted = op_of(doc, "/v1/users/{user_id}", "delete")["responses"]["204"]
    assert "content" not in deleted
    accepted = op_of(doc, "/v1/public/signup", "post")["responses"]["202"]
    assert accepted["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RequestId"}


def test_dataclass_replies_nested_and_omitted_fields(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    user = schemas["User"]
    assert user["properties"]["address"] == {"$ref": "#/components/schemas/Address"}
    assert user["required"] == ["id", "address"]  # nickname is left out while None
    assert schemas["Widget"]["properties"]["created_at"]["format"] == "date-time"
    assert schemas["SessionInfo"]["properties"]["user"] == {"$ref": "#/components/schemas/User"}


def test_omit_if_none_key_is_the_envelopes() -> None:
    assert openapi.OMIT_IF_NONE == OMIT_IF_NONE


def test_generic_pages_get_distinct_names(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    users = op_of(doc, "/v1/users", "get")["responses"]["200"]["content"]["application/json"]["schema"]
    orgs = op_of(doc, "/v1/organizations", "get")["responses"]["200"]["content"]["application/json"]["schema"]
    user_page = users["allOf"][0]["$ref"].rsplit("/", 1)[1]
    org_page = orgs["allOf"][0]["$ref"].rsplit("/", 1)[1]
    assert user_page != org_page
    assert schemas[user_page]["properties"]["data"]["items"] == {"$ref": "#/components/schemas/User"}
    assert schemas[org_page]["properties"]["data"]["items"] == {"$ref": "#/components/schemas/Organization"}
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in schemas)


def test_two_types_of_one_name_from_two_places_stay_apart() -> None:
    def make() -> type:
        @dataclass
        class Organization:  # same name as the module's, other fields
            slug: str
        return Organization

    other = make()
    ops = [
        Operation(method="GET", path="/a", handler=landing, operation_id="a", tag="t", summary="a",
                  replies=(Reply(200, "a", Organization),)),
        Operation(method="GET", path="/b", handler=landing, operation_id="b", tag="t", summary="b",
                  replies=(Reply(200, "b", other),)),
    ]
    doc = build(ops)
    schemas = doc["components"]["schemas"]
    a = op_of(doc, "/a", "get")["responses"]["200"]["content"]["application/json"]["schema"]["allOf"][0]["$ref"]
    b = op_of(doc, "/b", "get")["responses"]["200"]["content"]["application/json"]["schema"]["allOf"][0]["$ref"]
    assert a != b
    assert set(schemas[a.rsplit("/", 1)[1]]["properties"]) == {"id", "name"}
    assert set(schemas[b.rsplit("/", 1)[1]]["properties"]) == {"slug"}


def test_a_clash_with_the_envelopes_schemas_raises() -> None:
    @dataclass
    class Error:  # not the envelope's Error
        reason: str

    op = Operation(method="GET", path="/e", handler=landing, operation_id="e", tag="t", summary="e",
                   replies=(Reply(200, "e", Error),))
    with pytest.raises(ValueError, match="'Error'"):
        build([op])


def test_undocumentable_tables_raise() -> None:
    def op(path: str, *replies: Reply, **kw: Any) -> Operation:
        return Operation(method="GET", path=path, handler=landing, operation_id=path, tag="t", summary="s",
                         replies=replies or (Reply(200, "ok"),), **kw)

    with pytest.raises(ValueError, match="other parameter names"):
        build([op("/v1/x/{a}"), op("/v1/x/{b:\\d+}")])
    with pytest.raises(ValueError, match="two 200 replies"):
        build([op("/v1/y", Reply(200, "a"), Reply(200, "b"))])
    with pytest.raises(ValueError, match="both a reply and an error"):
        build([op("/v1/z", Reply(404, "gone", content_type="text/html"), errors=(errors.NotFound,))])
    with pytest.raises(ValueError, match="must be an object"):
        build([op("/v1/w", Reply(200, "list", list[Widget]))])


def test_a_json_reply_at_an_errors_status_is_either_body() -> None:
    """A route's own body at an error's status (an OAuth error body beside the envelope, RFC
    6749 5.2): the document says it is one or the other, and keeps both descriptions."""
    op = Operation(method="POST", path="/t", handler=landing, operation_id="t", tag="t",
                   summary="t", replies=(Reply(200, "ok", Widget), Reply(400, "An OAuth error.", Widget)))
    response = op_of(build([op]), "/t", "post")["responses"]["400"]
    either = response["content"]["application/json"]["schema"]["anyOf"]
    assert len(either) == 2 and "Widget" in str(either[0]) and "Error" in str(either[1])
    assert response["description"].startswith("An OAuth error.") and "invalid_request" in response["description"]


def test_reply_that_forbids_other_fields_still_allows_request_id() -> None:
    class Strict(RequestModel):  # extra="forbid": allOf with RequestId could never match
        name: str

    op = Operation(method="GET", path="/s", handler=landing, operation_id="s", tag="t", summary="s",
                   replies=(Reply(200, "s", Strict),))
    doc = build([op])
    validate(doc)
    validator = response_validator(doc, "/s", "get", 200)
    validator.validate({"name": "x", "request_id": "req_1"})
    assert not validator.is_valid({"name": "x", "request_id": "req_1", "other": 1})
    assert not validator.is_valid({"name": "x"})


def test_deterministic() -> None:
    first = document_json(build())
    again = document_json(build_document(list(OPS), title="authio", version="0.1.0", description="Test API.",
                                         tags=TAGS))
    assert first == again
    assert first.endswith(b"}\n")
    assert first.startswith(b'{\n  "components": {')  # sorted keys, 2-space indent
    assert orjson.loads(first) == build()


# --- real bodies against the document ---------------------------------------------------------


async def test_real_bodies_validate_against_their_responses(
    doc: dict[str, Any], client: TestClient[web.Request, web.Application],
) -> None:
    cases: list[tuple[str, str, str, dict[str, Any], str, int]] = [
        # method, request path, document path, request kwargs, content type, expected status
        ("POST", "/v1/widgets", "/v1/widgets", {"json": {"name": "Blue one", "color": "blue"}},
         "application/json", 201),
        ("POST", "/v1/widgets", "/v1/widgets", {"json": {"name": "x", "size": 3}}, "application/json", 400),
        ("POST", "/v1/widgets", "/v1/widgets", {"data": b"[1]"}, "application/json", 400),
        ("GET", "/v1/users", "/v1/users", {"params": {"from": "user_0", "limit": "1"}}, "application/json", 200),
        ("GET", "/v1/organizations", "/v1/organizations", {}, "application/json", 200),
        ("GET", "/v1/users/user_1", "/v1/users/{user_id}", {}, "application/json", 200),
        ("GET", "/v1/users/user_2", "/v1/users/{user_id}", {}, "application/json", 200),
        ("GET", "/v1/users/user_9", "/v1/users/{user_id}", {}, "application/json", 404),
        ("DELETE", "/v1/users/user_1", "/v1/users/{user_id}", {}, "", 204),
        ("GET", "/v1/users/export", "/v1/users/export", {}, "text/csv", 200),
        ("GET", "/v1/public/config", "/v1/public/config", {"params": {"project_id": "proj_1"}},
         "application/json", 200),
        ("GET", "/v1/public/config", "/v1/public/config", {"headers": {"Service-Project": "proj_2"}},
         "application/json", 404),
        ("POST", "/v1/public/signup", "/v1/public/signup", {"json": {"email": "a@example.com"}},
         "application/json", 202),
        ("GET", "/v1/sessions/me", "/v1/sessions/me", {}, "application/json", 200),
        ("GET", "/v1/events/a/b", "/v1/events/{tail}", {}, "application/x-ndjson", 200),
        ("GET", "/v1/pages", "/v1/pages", {}, "text/html", 200),
    ]
    for method, path, doc_path, kwargs, content_type, status in cases:
        r = await client.request(method, path, **kwargs)
        raw = await r.read()
        assert r.status == status, (method, path, raw)
        response = op_of(doc, doc_path, method.lower())["responses"][str(status)]
        assert "X-Request-Id" in r.headers
        for header in response["headers"]:
            assert header in r.headers, (path, header)
        if not content_type:
            assert "content" not in response and raw == b""
            continue
        assert r.content_type == content_type
        assert set(response["content"]) == {content_type}
        if content_type != "application/json":
            assert raw
            continue
        body = orjson.loads(raw)
        response_validator(doc, doc_path, method.lower(), status).validate(body)
        assert body["request_id"] == r.headers["X-Request-Id"]


async def test_schemas_are_precise_enough_to_refuse_wrong_bodies(doc: dict[str, Any]) -> None:
    user = response_validator(doc, "/v1/users/{user_id}", "get", 200)
    good = {"id": "user_1", "address": {"city": "Lyon", "country": "FR"}, "email": None, "request_id": "req_1"}
    user.validate(good)
    for bad in ({k: v for k, v in good.items() if k != "request_id"},  # the envelope's field is required
                {**good, "address": {"city": "Lyon"}},
                {**good, "request_id": 3}):
        assert not user.is_valid(bad), bad
    not_found = response_validator(doc, "/v1/users/{user_id}", "get", 404)
    error: dict[str, Any] = {"error": {"code": "user_not_found", "message": "m", "details": {}}, "request_id": "req_1"}
    not_found.validate(error)
    assert not not_found.is_valid({**error, "error": {**error["error"], "code": "store_not_found"}})
    assert not not_found.is_valid({"error": error["error"]})
    with pytest.raises(jsonschema.ValidationError):
        response_validator(doc, "/v1/widgets", "post", 201).validate(
            {"id": "w", "name": "n", "color": "red", "created_at": "yesterday", "request_id": "req_1"})


# --- schemathesis -----------------------------------------------------------------------------


Loaded = APIOperation[Any, Any, Any, Any]


def ok(result: Ok[Loaded] | Err[InvalidSchema]) -> Loaded:
    """The operation schemathesis loaded, or the reason it could not."""
    assert isinstance(result, Ok), result.err()
    return result.ok()


def test_schemathesis_loads_the_document(doc: dict[str, Any]) -> None:
    schema = schemathesis.openapi.from_dict(doc)
    ops = [ok(result) for result in schema.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in ops} == {
        (method.upper(), path) for path, item in doc["paths"].items() for method in item}


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    """The test app served from a thread of its own (schemathesis calls it synchronously)."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.SockSite(runner, sock).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


CHECKS = [st_checks.not_a_server_error, st_checks.status_code_conformance, st_checks.content_type_conformance,
          st_checks.response_headers_conformance, st_checks.response_schema_conformance]


def test_schemathesis_finds_the_responses_conforming(doc: dict[str, Any], live_url: str) -> None:
    """A short, derandomized fuzz of the test app: every answer is documented, of the documented
    content type and headers, and its body matches the document's schema."""
    schema = schemathesis.openapi.from_dict(doc)
    for result in schema.get_all_operations():
        operation = ok(result)

        @hypothesis.settings(max_examples=15, deadline=None, derandomize=True, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(case=operation.as_strategy())
        def fuzz(case: Any) -> None:
            response = case.call(base_url=live_url)
            case.validate_response(response, checks=CHECKS)

        fuzz()


# --- what client generators read (issue 25) -----------------------------------------------------


def _named_op(method: str, path: str, name: str, *replies: Reply) -> Operation:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response()
    handler.__name__ = name
    return Operation(method=method, path=path, handler=handler, operation_id=name, tag="t",
                     summary=name, replies=replies or (Reply(200, "ok", Organization),))


@dataclass
class Listed:
    id: str


def test_operation_ids_are_method_names_derived_from_handlers() -> None:
    page = Reply(200, "A page.", Page[Listed])
    created = Reply(201, "Made.", Listed)
    ops = [_named_op("GET", "/things", "get_things", page),
           _named_op("POST", "/things", "post_things", created),
           _named_op("GET", "/things/{thing_id}", "get_thing"),
           _named_op("PATCH", "/things/{thing_id}", "patch_thing"),
           _named_op("PUT", "/things/{thing_id}/policy", "put_thing_policy"),
           _named_op("DELETE", "/things/{thing_id}", "delete_thing"),
           _named_op("POST", "/things/{thing_id}/revoke", "post_thing_revoke"),
           _named_op("POST", "/things/{thing_id}/rotate-secret", "post_thing_rotate_secret"),
           _named_op("POST", "/login/options", "post_login_options"),
           _named_op("POST", "/device/code", "post_device_code"),
           _named_op("POST", "/check", "batch_check")]
    doc = build(ops)
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert ids == ["list_things", "create_thing", "get_thing", "update_thing", "delete_thing",
                   "replace_thing_policy", "revoke_thing", "rotate_thing_secret", "start_login",
                   "post_device_code", "batch_check"]
    # A page's schema is named after what it lists, and titled by its name.
    assert doc["components"]["schemas"]["ListedPage"]["title"] == "ListedPage"


def test_two_operations_of_one_method_name_raise() -> None:
    with pytest.raises(ValueError, match="both the operation 'create_thing'"):
        build([_named_op("POST", "/things", "post_things", Reply(201, "Made.", Listed)),
               _named_op("POST", "/thing", "post_thing", Reply(201, "Made.", Listed))])


def test_alternatives_beside_properties_are_moved_into_all_of() -> None:
    """A rule "one of these properties at least" stays one class to a generator (which would
    make a class of each ``anyOf`` branch, holding only the properties the branch names)."""

    class Either(RequestModel):
        model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": ["a"]},
                                                               {"required": ["b"]}]})
        a: int | None = None
        b: int | None = None

    op = Operation(method="POST", path="/e", handler=landing, operation_id="e", tag="t",
                   summary="e", body=Either, replies=(Reply(204, "Done.", content_type=None),))
    either = build([op])["components"]["schemas"]["Either"]
    assert "anyOf" not in either and set(either["properties"]) == {"a", "b"}
    assert either["allOf"] == [{"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}]
