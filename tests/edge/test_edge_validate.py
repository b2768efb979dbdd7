"""Edge session validation at the engine (issue 12), through HTTP.

``/v1/edge/validate`` and the forward-auth form ``/v1/edge/auth[/{tail}]`` (DESIGN.md "edge
validation"): a signed-in session's access token validates, from Bearer or the
``service_session`` cookie (Bearer wins); the refusals and their reasons; the optional
permission check against the engine's in-memory graph; the forward-auth form answering only
200, 401 or 403.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import ClientSession

from common.settings import Settings
from control_plane.appkeys import TOKENS
from tests.fixtures.identity import email, session_call, sign_in
from tests.fixtures.service import (
    Api,
    Project,
    Response,
    assert_error,
    bootstrap_project,
    combined_app,
    eventually,
    serving,
)

IDENTITY_HEADERS = ("Service-User-Id", "Service-Session-Id", "Service-Project-Id")


def assert_reason(r: Response, code: str, reason: str) -> None:
    assert_error(r, 401, code)
    assert r.body["error"]["details"]["reason"] == reason, r.body


async def validate(api: Api, token: str | None, query: str = "",
                   headers: dict[str, str] | None = None) -> Response:
    hdrs = {"Authorization": f"Bearer {token}"} if token else {}
    return await api.get(f"/v1/edge/validate{query}", headers={**hdrs, **(headers or {})},
                         key=None)


async def test_a_signed_in_token_validates(project: Project, service: Api) -> None:
    signed = await sign_in(project, email())
    r = await validate(service, signed.access_token)
    assert r.status == 200, r.body
    assert {k: r.body[k] for k in ("user_id", "session_id", "org_id", "org_role", "project_id")} \
        == {"user_id": signed.user_id, "session_id": signed.session_id, "org_id": None,
            "org_role": None, "project_id": project.id}
    assert r.headers["Service-User-Id"] == signed.user_id
    assert r.headers["Service-Session-Id"] == signed.session_id
    assert r.headers["Service-Project-Id"] == project.id
    assert "Service-Org-Id" not in r.headers and "Service-Org-Role" not in r.headers
    again = await validate(service, signed.access_token)  # the cached verification
    assert again.status == 200 and again.body["session_id"] == signed.session_id
    posted = await session_call(service, "POST", "/v1/edge/validate", signed.access_token)
    assert posted.status == 200 and posted.body["user_id"] == signed.user_id


async def test_cookie_and_bearer(project: Project, service: Api) -> None:
    signed = await sign_in(project, email())
    cookie = {"Cookie": f"service_session={signed.access_token}"}
    r = await service.get("/v1/edge/validate", headers=cookie, key=None)
    assert r.status == 200 and r.body["session_id"] == signed.session_id
    # Bearer wins over the cookie, both ways.
    r = await service.get("/v1/edge/validate", key=None,
                          headers={**cookie, "Authorization": "Bearer not.a.jwt"})
    assert_reason(r, "invalid_session", "signature")
    r = await service.get("/v1/edge/validate", key=None,
                          headers={"Cookie": "service_session=garbage",
                                   "Authorization": f"Bearer {signed.access_token}"})
    assert r.status == 200 and r.body["session_id"] == signed.session_id


async def test_refusals(project: Project, service: Api) -> None:
    assert_error(await validate(service, None), 401, "no_session")
    assert_reason(await validate(service, "garbage"), "invalid_session", "signature")
    signed = await sign_in(project, email())
    head, payload, signature = signed.access_token.split(".")
    forged = f"{head}.{payload}.{signature[::-1]}"
    assert_reason(await validate(service, forged), "invalid_session", "signature")
    other = await bootstrap_project(service, "other")
    pinned = await validate(service, signed.access_token, f"?project_id={other.id}")
    assert_reason(pinned, "invalid_session", "project")
    pinned = await validate(service, signed.access_token,
                            headers={"Service-Project": other.id})
    assert_reason(pinned, "invalid_session", "project")
    own = await validate(service, signed.access_token, f"?project_id={project.id}")
    assert own.status == 200
    assert_error(await validate(service, signed.access_token, "?project_id=nope"), 400,
                 "invalid_request")


async def test_an_expired_token_is_refused(settings_factory: Callable[..., Settings],
                                           http: ClientSession, service: Api) -> None:
    """A token of the session issued an hour ago (by the service's own token issuer) is
    ``expired``: verified, then past ``exp`` and the leeway."""
    app = combined_app(settings_factory())
    async with serving(http, app) as api:
        project = await bootstrap_project(api)
        signed = await sign_in(project, email(), api=api, also=[service])
        old = await app[TOKENS].issue(project_id=project.id, user_id=signed.user_id,
                                      session_id=signed.session_id, org_id=None, role=None,
                                      iat=int(time.time()) - 3600)
        assert_reason(await validate(api, old), "invalid_session", "expired")
        assert (await validate(api, signed.access_token)).status == 200


async def write(project: Project, store: str, obj: str, relation: str, user: str) -> int:
    r = await project.api.post(f"/v1/stores/{store}/write",
                               {"writes": [{"object": obj, "relation": relation, "user": user}]})
    assert r.status == 200, r.body
    return int(r.body["revision"])


async def test_permission_in_the_same_call(project: Project, service: Api) -> None:
    signed = await sign_in(project, email())
    store = (await project.api.post("/v1/stores", {"name": "s"})).body["id"]
    await write(project, store, "doc:1", "viewer", f"user:{signed.user_id}")
    allowed = f"?store_id={store}&object=doc:1&relation=viewer"

    async def passes() -> bool:
        return (await validate(service, signed.access_token, allowed)).status == 200

    await eventually(passes, within=10, what="the engine to see the tuple")
    denied = await validate(service, signed.access_token,
                            f"?store_id={store}&object=doc:1&relation=editor")
    assert_error(denied, 403, "forbidden")
    # The session is judged first: a bad session is 401 even when the check would be denied.
    assert_error(await validate(service, None, f"?store_id={store}&object=doc:2&relation=viewer"),
                 401, "no_session")
    body = {"store_id": store, "object": "doc:1", "relation": "viewer"}
    posted = await session_call(service, "POST", "/v1/edge/validate", signed.access_token, body)
    assert posted.status == 200, posted.body
    posted = await session_call(service, "POST", "/v1/edge/validate", signed.access_token,
                                {**body, "relation": "editor"})
    assert_error(posted, 403, "forbidden")
    # Another project's store is denied; incomplete or malformed parameters are 400.
    other = await bootstrap_project(service, "other")
    theirs = (await other.api.post("/v1/stores", {"name": "t"})).body["id"]
    r = await validate(service, signed.access_token,
                       f"?store_id={theirs}&object=doc:1&relation=viewer")
    assert_error(r, 403, "forbidden")
    assert_error(await validate(service, signed.access_token, f"?store_id={store}"), 400,
                 "invalid_request")
    assert_error(await validate(service, signed.access_token,
                                "?store_id=x&object=doc:1&relation=viewer"), 400,
                 "invalid_request")


async def test_forward_auth_answers_only_200_401_403(project: Project, service: Api) -> None:
    signed = await sign_in(project, email())
    forwarded = {"X-Forwarded-Method": "DELETE", "X-Forwarded-Uri": "/app/things/1?x=1",
                 "X-Original-URI": "/app/things/1?x=1", "X-Forwarded-Host": "app.example.com",
                 "Authorization": f"Bearer {signed.access_token}"}
    for method, path in (("GET", "/v1/edge/auth"), ("GET", "/v1/edge/auth/app/things/1"),
                         ("POST", "/v1/edge/auth/x"), ("PUT", "/v1/edge/auth"),
                         ("DELETE", "/v1/edge/auth/a/b/c")):
        r = await service.request(method, path, headers=forwarded, key=None)
        assert r.status == 200, (method, path, r.body)
        for name in IDENTITY_HEADERS:
            assert r.headers[name], name
        assert r.headers["Service-User-Id"] == signed.user_id
    assert_error(await service.get("/v1/edge/auth/app", key=None), 401, "no_session")
    r = await service.get("/v1/edge/auth", key=None, headers={"Authorization": "Bearer x.y.z"})
    assert_reason(r, "invalid_session", "signature")
    # Bad permission parameters deny with 403 here, never 400, from the proxy's
    # Service-Check-* headers and from the query string (DESIGN.md) alike.
    bearer = {"Authorization": f"Bearer {signed.access_token}"}
    r = await service.get("/v1/edge/auth", key=None,
                          headers={**bearer, "Service-Check-Store": "nope"})
    assert_error(r, 403, "forbidden")
    r = await service.get("/v1/edge/auth", key=None, headers={
        **bearer, "Service-Check-Store": "nope", "Service-Check-Object": "doc:1",
        "Service-Check-Relation": "viewer"})
    assert_error(r, 403, "forbidden")
    store = (await project.api.post("/v1/stores", {"name": "s"})).body["id"]
    for query in ("?store_id=nope", f"?store_id={store}&object=doc:1",
                  "?store_id=x&object=doc:1&relation=viewer", "?project_id=proj_x"):
        assert_error(await service.get(f"/v1/edge/auth{query}", key=None, headers=bearer), 403,
                     "forbidden")
    check = {"Service-Check-Store": store, "Service-Check-Object": "doc:1",
             "Service-Check-Relation": "viewer"}
    in_query = f"?store_id={store}&object=doc:1&relation=viewer"
    r = await service.get("/v1/edge/auth/p", key=None, headers={**bearer, **check})
    assert_error(r, 403, "forbidden")
    assert_error(await service.get(f"/v1/edge/auth{in_query}", key=None, headers=bearer), 403,
                 "forbidden")
    await write(project, store, "doc:1", "viewer", f"user:{signed.user_id}")

    async def allowed() -> bool:
        r = await service.get("/v1/edge/auth/p", key=None, headers={**bearer, **check})
        return r.status == 200

    await eventually(allowed, within=10, what="the engine to see the tuple")
    for path in (f"/v1/edge/auth{in_query}", f"/v1/edge/auth/any/tail{in_query}"):
        r = await service.get(path, key=None, headers=bearer)
        assert r.status == 200 and r.headers["Service-User-Id"] == signed.user_id, r.body
    # Every check and pin given must hold: what a client adds to the query (Envoy and Caddy
    # pass the original one on) can refuse its own request, never replace the proxy's check.
    for query in ("?store_id=nope", f"?store_id={store}&object=doc:2&relation=viewer",
                  f"?project_id={(await bootstrap_project(service, 'q')).id}"):
        r = await service.get(f"/v1/edge/auth/p{query}", key=None, headers={**bearer, **check})
        assert r.status in (401, 403), (query, r.body)
    r = await service.get(f"/v1/edge/auth/p{in_query}", key=None, headers={
        **bearer, **check, "Service-Check-Object": "doc:2"})
    assert_error(r, 403, "forbidden")
    pinned = await service.get("/v1/edge/auth", key=None, headers={
        **bearer, "Service-Project": (await bootstrap_project(service, "pin")).id})
    assert_reason(pinned, "invalid_session", "project")
    # Any method, not only the documented ones (Envoy asks with the original one).
    async with service.session.request("OPTIONS", service.base_url + "/v1/edge/auth/x",
                                       headers=bearer) as raw:
        assert raw.status == 200 and raw.headers["Service-User-Id"] == signed.user_id


async def test_every_check_and_pin_given_holds(project: Project, service: Api) -> None:
    """Review findings: a repeated check or pin, a body and a query check, all hold together;
    forward auth judges the session before any parameter (401 before 403)."""
    signed = await sign_in(project, email())
    store = (await project.api.post("/v1/stores", {"name": "s"})).body["id"]
    await write(project, store, "doc:1", "viewer", f"user:{signed.user_id}")
    bearer = {"Authorization": f"Bearer {signed.access_token}"}
    allowed = f"?store_id={store}&object=doc:1&relation=viewer"

    async def passes() -> bool:
        return (await validate(service, signed.access_token, allowed)).status == 200

    await eventually(passes, within=10, what="the engine to see the tuple")
    # Without a session, forward auth is 401 whatever the parameters (they are judged after).
    for query in ("?store_id=bad", "?project_id=bad", f"{allowed}&object=doc:2"):
        assert_error(await service.get(f"/v1/edge/auth{query}", key=None), 401, "no_session")
    # A check header given twice with two values: which one was meant cannot be told.
    async with service.session.get(service.base_url + "/v1/edge/auth", headers=[
            *bearer.items(), ("Service-Check-Store", store), ("Service-Check-Object", "doc:1"),
            ("Service-Check-Relation", "viewer"), ("Service-Check-Object", "doc:2")]) as raw:
        assert raw.status == 403
    assert (await service.get(f"/v1/edge/auth{allowed}&object=doc:1", key=None,
                              headers=bearer)).status == 200  # the same value twice is one
    r = await service.get(f"/v1/edge/auth{allowed}&object=doc:2", key=None, headers=bearer)
    assert_error(r, 403, "forbidden")
    # Every pin must be the token's: one of another project among them refuses.
    other = (await bootstrap_project(service, "pins")).id
    for path in (f"/v1/edge/auth?project_id={project.id}&project_id={other}",
                 f"/v1/edge/validate?project_id={project.id}&project_id={other}"):
        assert_reason(await service.get(path, key=None, headers=bearer), "invalid_session",
                      "project")
    async with service.session.get(service.base_url + "/v1/edge/auth", headers=[
            *bearer.items(), ("Service-Project", project.id), ("Service-Project", other)]) as raw:
        assert raw.status == 401
    # validate: the body's check and the query's both hold; neither completes the other.
    body = {"store_id": store, "object": "doc:1", "relation": "viewer"}
    r = await session_call(service, "POST", "/v1/edge/validate?relation=editor",
                           signed.access_token, body)
    assert_error(r, 400, "invalid_request")
    r = await session_call(service, "POST",
                           f"/v1/edge/validate?store_id={store}&object=doc:1&relation=editor",
                           signed.access_token, body)
    assert_error(r, 403, "forbidden")
    r = await session_call(service, "POST", f"/v1/edge/validate{allowed}", signed.access_token,
                           body)
    assert r.status == 200, r.body


async def _raw_status(api: Api, request: bytes) -> int:
    host, port = api.base_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return int((await reader.readline()).split()[1])
    finally:
        writer.close()


async def test_forward_auth_refuses_bad_headers_with_403_only(service: Api) -> None:
    """Review finding: nginx passes the client's headers to the auth subrequest, and makes a 500
    of a 400; forward auth refuses what the envelope refuses (a header that is not UTF-8 text, a
    bad Expect) with 403, while validate keeps its 400."""
    for path, status in (("/v1/edge/auth/app", 403), ("/v1/edge/validate", 400)):
        for header in (b"X-Foo: \xff\xfe", b"Expect: bogus"):
            request = (b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + header
                       + b"\r\nConnection: close\r\n\r\n")
            assert await _raw_status(service, request) == status, (path, header)
