"""Real edge proxies in front of a separately running engine (issue 12): nginx ``auth_request``
and Caddy ``forward_auth`` (the Traefik-style ``X-Forwarded-*`` shape), each with the documented
configuration (``docs/edge/``, shown in ``docs/edge.md``), guarding a small application that
echoes what it received.

For both: a signed-in request (Bearer or the ``service_session`` cookie) passes with the
identity headers forwarded, and a client's own ``Service-*`` headers never reach the
application; no session is 401; a session revoked through the control plane is refused within
100 ms of the revoke call's answer; the configured permission (``/docs/``) passes for its viewer
and is 403 for another user, whatever the client adds to the query or headers; and whatever
malformed thing the client sends, the proxy answers 200, 401 or 403, never the 500 nginx makes
of any other answer of the auth service.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.edge.helpers import DOC, RELATION, Edge, edge
from tests.fixtures.identity import SignedIn, session_call
from tests.fixtures.proxies import EDGE_DOCS, Proxy, caddy, nginx
from tests.fixtures.service import ROOT, Api

REVOKE_WITHIN = 0.100  # seconds, from the revoke call's answer to the first refusal


@pytest_asyncio.fixture(scope="module")
async def setup(settings_factory: Callable[..., Settings], http: ClientSession,
                service: Api) -> AsyncIterator[Edge]:
    async with edge(http, settings_factory(), service) as found:
        yield found


@pytest.fixture(scope="module", params=["nginx", "caddy"])
def proxy(request: pytest.FixtureRequest, setup: Edge) -> Iterator[Proxy]:
    """nginx or Caddy in front of the upstream, asking the engine; stopped at the end."""
    start = {"nginx": nginx, "caddy": caddy}[request.param]
    binary = request.getfixturevalue(f"{request.param}_binary")  # installed when missing
    with start(binary, setup.engine.base_url, setup.app.port,
               store_id=setup.store_id) as running:
        yield running


async def call(http: ClientSession, proxy: Proxy, method: str, path: str, *,
               token: str | None = None, cookie: str | None = None,
               headers: dict[str, str] | None = None, data: bytes | None = None
               ) -> tuple[int, Any]:
    """``(status, the upstream's echo or None)`` of ``method path`` through the proxy."""
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    if cookie is not None:
        hdrs["Cookie"] = f"service_session={cookie}"
    async with http.request(method, proxy.base_url + path, headers=hdrs, data=data,
                            allow_redirects=False) as r:
        raw = await r.read()
        echo = await r.json() if r.status == 200 and raw and method != "HEAD" else None
        return r.status, echo


def received(echo: dict[str, Any]) -> dict[str, str]:
    """The headers the upstream received, by lower-case name."""
    return {k.lower(): v for k, v in echo["headers"].items()}


def assert_identity(echo: dict[str, Any], signed: SignedIn, project_id: str) -> None:
    got = received(echo)
    assert got.get("service-user-id") == signed.user_id, got
    assert got.get("service-session-id") == signed.session_id, got
    assert got.get("service-project-id") == project_id, got
    # No organization selected: the org headers are absent, even when the client sent some.
    assert "service-org-id" not in got and "service-org-role" not in got, got


SPOOFED = {"Service-User-Id": "user_spoofed", "Service-Session-Id": "sess_spoofed",
           "Service-Org-Id": "org_spoofed", "Service-Org-Role": "admin",
           "Service-Project-Id": "proj_spoofed"}


async def test_a_signed_in_request_passes_with_its_identity(http: ClientSession, setup: Edge,
                                                          proxy: Proxy) -> None:
    signed = setup.viewer
    status, echo = await call(http, proxy, "GET", "/app/page?x=1", token=signed.access_token)
    assert status == 200, proxy.logs()
    assert echo["path"] == "/app/page?x=1" and echo["method"] == "GET"
    assert_identity(echo, signed, setup.project.id)
    status, echo = await call(http, proxy, "GET", "/app/page", cookie=signed.access_token)
    assert status == 200
    assert_identity(echo, signed, setup.project.id)
    # A body goes to the application (never to the engine), and the client's own identity
    # headers are replaced by the engine's answer.
    status, echo = await call(http, proxy, "POST", "/app/things", token=signed.access_token,
                              headers={**SPOOFED, "Content-Type": "application/json"},
                              data=b'{"name": "x"}')
    assert status == 200 and echo["method"] == "POST"
    assert_identity(echo, signed, setup.project.id)
    for method in ("PUT", "PATCH", "DELETE"):
        status, echo = await call(http, proxy, method, "/app/things/1",
                                  cookie=signed.access_token)
        assert status == 200 and echo["method"] == method, (method, status)


async def test_no_or_a_bad_session_is_401(http: ClientSession, setup: Edge,
                                          proxy: Proxy) -> None:
    count = len(setup.app.seen)
    assert (await call(http, proxy, "GET", "/app/page"))[0] == 401
    assert (await call(http, proxy, "GET", "/app/page", headers=SPOOFED))[0] == 401
    assert (await call(http, proxy, "POST", "/app/things", data=b"x"))[0] == 401
    assert (await call(http, proxy, "GET", "/app/page", token="not.a.jwt"))[0] == 401
    head, payload, signature = setup.viewer.access_token.split(".")
    forged = f"{head}.{payload}.{signature[::-1]}"
    assert (await call(http, proxy, "GET", "/app/page", cookie=forged))[0] == 401
    assert len(setup.app.seen) == count, "a refused request reached the application"


async def test_a_revoked_session_is_refused_within_100_ms(http: ClientSession, setup: Edge,
                                                          proxy: Proxy) -> None:
    signed = await setup.sign_in()
    status, _ = await call(http, proxy, "GET", "/app/page", token=signed.access_token)
    assert status == 200  # verified, and now cached at the engine
    r = await session_call(setup.control, "POST", "/v1/sessions/revoke", signed.access_token)
    assert r.status == 200, r.body
    answered = time.monotonic()
    status = 200
    for _ in range(2000):  # a request every ~2 ms, at most a few seconds
        status = (await call(http, proxy, "GET", "/app/page", token=signed.access_token))[0]
        if status != 200:
            break
        await asyncio.sleep(0.002)
    lag = time.monotonic() - answered
    assert status == 401
    assert lag < REVOKE_WITHIN, f"refused {lag * 1000:.0f} ms after the revoke call answered"
    assert (await call(http, proxy, "GET", "/app/page", cookie=signed.access_token))[0] == 401
    assert (await call(http, proxy, "GET", "/app/page", token=setup.viewer.access_token))[0] \
        == 200


async def test_the_configured_permission(http: ClientSession, setup: Edge,
                                         proxy: Proxy) -> None:
    viewer, other = setup.viewer.access_token, setup.other.access_token
    status, echo = await call(http, proxy, "GET", "/docs/handbook", token=viewer)
    assert status == 200, proxy.logs()
    assert_identity(echo, setup.viewer, setup.project.id)
    assert (await call(http, proxy, "GET", "/docs/handbook", token=other))[0] == 403
    assert (await call(http, proxy, "GET", "/docs/handbook"))[0] == 401  # 401 before 403
    # Outside /docs/ the other user passes: only the session is checked there.
    assert (await call(http, proxy, "GET", "/app/page", token=other))[0] == 200
    # What the client adds cannot replace the configured check: a query naming a check it
    # would pass, or headers naming one (the proxy's own replace them).
    theirs = f"?store_id={setup.store_id}&object=doc:other&relation=viewer&project_id=proj_x"
    assert (await call(http, proxy, "GET", "/docs/handbook" + theirs, token=other))[0] == 403
    check = {"Service-Check-Store": setup.store_id, "Service-Check-Object": "doc:nothing",
             "Service-Check-Relation": "viewer"}
    assert (await call(http, proxy, "GET", "/docs/handbook", token=other,
                       headers=check))[0] == 403
    # And an application's own query that happens to use these names is not confused.
    status, echo = await call(http, proxy, "GET", "/app/search?store_id=42&object=shoe"
                                                  "&relation=size", token=other)
    assert status == 200 and echo["path"].endswith("relation=size")
    status, _ = await call(http, proxy, "GET", f"/docs/handbook?store_id=nope&object={DOC}"
                                               f"&relation={RELATION}", token=viewer)
    assert status == 200
    # A client's check headers where none is configured are dropped by the proxy.
    assert (await call(http, proxy, "GET", "/app/page", token=other, headers=check))[0] == 200


MALFORMED: list[dict[str, str]] = [
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer " + "a" * 6000},
    {"Authorization": "Bearer a.b"},
    {"Authorization": "Bearer ..."},
    {"Authorization": "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."},
    {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "bearer   "},
    {"Cookie": "service_session="},
    {"Cookie": "service_session=%ZZ%00; other=1"},
    {"Cookie": 'service_session="quoted.jwt.value"'},
    {"Cookie": "service_session=a; service_session=b"},
    {"Service-Project": "not-a-project"},
    {"Service-Check-Store": "store_x", "Service-Check-Object": "::",
     "Service-Check-Relation": "v"},
    {"X-Forwarded-Uri": "\\..\\..", "X-Forwarded-Method": "BREW", "X-Original-URI": "%%%"},
]


async def test_never_anything_but_200_401_403(http: ClientSession, setup: Edge,
                                              proxy: Proxy) -> None:
    """Whatever the client sends, the answer is one the proxy understands (nginx turns any
    other answer of the auth service into a 500), with or without a valid token beside it."""
    paths = ["/app/page", "/docs/handbook", "/app/%2e%2e/x?store_id=%00&object=&relation="]
    for headers in MALFORMED:
        for path in paths:
            status, _ = await call(http, proxy, "GET", path, headers=headers)
            assert status in (401, 403), (headers, path, status, proxy.logs()[-2000:])
    valid = {"Cookie": f"service_session={setup.viewer.access_token}"}
    for headers in MALFORMED:
        if "Cookie" in headers:
            continue
        status, _ = await call(http, proxy, "GET", "/docs/handbook", headers={**valid, **headers})
        assert status in (200, 401, 403), (headers, status)



def test_the_edge_page_shows_the_tested_configurations() -> None:
    """``docs/edge.md``'s snippets are ``docs/edge/``'s files, which these tests run: they cannot
    drift."""
    page = (ROOT / "docs" / "edge.md").read_text()
    for name, fence in (("nginx.conf", "nginx"), ("Caddyfile", "caddyfile"),
                        ("envoy.yaml", "yaml")):
        text = (EDGE_DOCS / name).read_text()
        assert f"```{fence}\n{text}```\n" in page, f"docs/edge.md's {name} differs from docs/edge"
