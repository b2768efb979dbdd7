"""CORS on the public routes, through HTTP as a browser sends it (DESIGN.md "the browser
(CORS)"): the project's origins (``cors_origins`` and ``webauthn.origins``) and their validation,
preflights allowed and refused, actual answers (errors too), another project's origin, the
project named by the request's host, management routes that never answer CORS, a session of
another project, and a change followed at once by the process that served it and within the
cache's bound by another."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientSession

from common.settings import Settings
from control_plane.tenancy.cors import CACHE_SECONDS
from tests.fixtures.identity import email, sign_in
from tests.fixtures.service import Api, Project, Response, combined_app, serving
from tests.passkeys.helpers import configure

APP = "https://app.example.com"
LOCAL = "http://localhost:5173"
LOGIN_OPTIONS = "/v1/auth/passkey/login/options"


def aca(response: Response) -> dict[str, str]:
    """The ``Access-Control-Allow-*`` headers of an answer (lower-case names)."""
    return {k.lower(): v for k, v in response.headers.items()
            if k.lower().startswith("access-control-allow-")}


async def cors_origins(project: Project, origins: list[Any]) -> Response:
    return await project.api.request("PATCH", "/v1/projects/me", json={"cors_origins": origins})


async def preflight(service: Api, path: str, origin: str, *, method: str = "POST",
                    headers: str | None = "content-type", host: str | None = None) -> Response:
    sent = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        sent["Access-Control-Request-Headers"] = headers
    if host is not None:
        sent["Host"] = host
    return await service.request("OPTIONS", path, headers=sent, key=None)


def assert_preflight_allowed(r: Response, origin: str) -> None:
    assert r.status == 204, (r.status, r.body)
    assert r.headers["Access-Control-Allow-Origin"] == origin
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    assert "POST" in [m.strip() for m in r.headers["Access-Control-Allow-Methods"].split(",")]
    assert int(r.headers["Access-Control-Max-Age"]) >= 600
    assert "Origin" in [v.strip() for v in r.headers["Vary"].split(",")]


async def test_origins_are_set_normalized_and_shown(project: Project) -> None:
    r = await cors_origins(project, [LOCAL, "https://App.Example.com/", "https://b.example:443",
                                     "http://127.0.0.1:8080", "http://[::1]:3000", APP])
    assert r.status == 200, r.body
    expected = ["http://127.0.0.1:8080", "http://[::1]:3000", LOCAL, APP, "https://b.example"]
    assert r.body["cors_origins"] == sorted(expected)
    shown = await project.api.get("/v1/projects/me")
    assert shown.body["cors_origins"] == sorted(expected)
    events = await project.api.get("/v1/audit/events?type=project.updated")
    assert events.status == 200, events.body
    changes = events.body["data"][0]["metadata"]["changes"]["cors_origins"]
    assert changes == {"added": sorted(expected), "removed": []}
    assert (await cors_origins(project, [])).body["cors_origins"] == []


@pytest.mark.parametrize("origin", [
    "https://*.example.com",        # a wildcard
    "*",
    "https://app.example.com/app",  # a path
    "https://app.example.com?x=1",  # a query
    "http://app.example.com",       # http on a host that is not loopback
    "app.example.com",              # no scheme
    "ftp://app.example.com",
    "https://user@app.example.com",
    "https://app.example.com:0",
    "https://app.example.com:65536",
    "null",
    "",
    17,
])
async def test_a_wildcard_a_path_or_a_bad_origin_is_invalid_request(project: Project,
                                                                    origin: Any) -> None:
    r = await cors_origins(project, [origin])
    assert r.status == 400, r.body
    assert r.body["error"]["code"] == "invalid_request", r.body
    assert (await project.api.get("/v1/projects/me")).body["cors_origins"] == []


async def test_more_than_fifty_origins_are_refused(project: Project) -> None:
    r = await cors_origins(project, [f"https://a{i}.example.com" for i in range(51)])
    assert r.status == 400 and r.body["error"]["code"] == "invalid_request", r.body


async def test_preflight_of_an_allowed_origin(service: Api, project: Project) -> None:
    await cors_origins(project, [APP])
    r = await preflight(service, f"{LOGIN_OPTIONS}?project_id={project.id}", APP,
                        headers="content-type,authorization, x-request-id,x-other")
    assert_preflight_allowed(r, APP)
    assert r.raw == b""
    granted = [h.strip() for h in r.headers["Access-Control-Allow-Headers"].split(",")]
    assert granted == ["content-type", "authorization", "x-request-id"]  # never x-other
    r = await preflight(service, f"/v1/sessions/me?project_id={project.id}", APP, method="GET",
                        headers="authorization,service-project")
    assert r.status == 204
    assert "GET" in r.headers["Access-Control-Allow-Methods"]
    assert r.headers["Access-Control-Allow-Headers"] == "authorization, service-project"


async def test_webauthn_origins_are_allowed_too(service: Api, project: Project) -> None:
    await configure(project, origins=[LOCAL])
    r = await preflight(service, f"{LOGIN_OPTIONS}?project_id={project.id}", LOCAL)
    assert_preflight_allowed(r, LOCAL)
    # ... and stop being allowed with passkeys off, at once in this process.
    r = await project.api.request("PATCH", "/v1/projects/me", json={"webauthn": None})
    assert r.status == 200, r.body
    r = await preflight(service, f"{LOGIN_OPTIONS}?project_id={project.id}", LOCAL)
    assert r.status == 403 and aca(r) == {}


@pytest.mark.parametrize("origin", [
    "https://evil.example.com",
    "https://app.example.com.evil.test",
    "http://app.example.com",   # the allowed host, another scheme
    "https://app.example.com:8443",  # another port
    "null",
])
async def test_preflight_of_another_origin_gets_no_cors_header(service: Api, project: Project,
                                                               origin: str) -> None:
    await cors_origins(project, [APP])
    r = await preflight(service, f"{LOGIN_OPTIONS}?project_id={project.id}", origin)
    assert r.status == 403, r.body
    assert aca(r) == {}
    assert r.body["error"]["code"] == "forbidden"
    assert r.body["error"]["details"]["reason"] == "origin_not_allowed"


async def test_another_projects_origin_is_refused(
        service: Api, project: Project, new_project: Callable[[str], Awaitable[Project]]) -> None:
    other = await new_project("other")
    await cors_origins(other, [APP])
    r = await preflight(service, f"{LOGIN_OPTIONS}?project_id={project.id}", APP)
    assert r.status == 403 and aca(r) == {}
    r = await service.post(f"{LOGIN_OPTIONS}?project_id={project.id}", {}, key=None,
                           headers={"Origin": APP})
    assert aca(r) == {} and "Access-Control-Expose-Headers" not in r.headers
    r = await preflight(service, f"{LOGIN_OPTIONS}?project_id={other.id}", APP)
    assert_preflight_allowed(r, APP)


async def test_a_preflight_naming_no_project_or_an_unknown_one_is_refused(
        service: Api, project: Project) -> None:
    await cors_origins(project, [APP])
    for path in (LOGIN_OPTIONS, f"{LOGIN_OPTIONS}?project_id=proj_01J00000000000000000000000",
                 f"{LOGIN_OPTIONS}?project_id=nonsense"):
        r = await preflight(service, path, APP)
        assert r.status == 403 and aca(r) == {}, path


async def test_the_host_names_the_project(service: Api, project: Project) -> None:
    domain = f"auth-{secrets.token_hex(4)}.example.test"
    r = await project.api.request("PATCH", "/v1/projects/me",
                                  json={"domains": [domain], "cors_origins": [APP]})
    assert r.status == 200, r.body
    r = await preflight(service, LOGIN_OPTIONS, APP, host=domain)
    assert_preflight_allowed(r, APP)
    r = await preflight(service, LOGIN_OPTIONS, APP, host=f"other-{domain}")
    assert r.status == 403 and aca(r) == {}
    # The domain given up: the host names no project any more, at once in this process.
    await project.api.request("PATCH", "/v1/projects/me", json={"domains": []})
    r = await preflight(service, LOGIN_OPTIONS, APP, host=domain)
    assert r.status == 403 and aca(r) == {}


async def test_answers_to_an_allowed_origin_carry_cors(service: Api, project: Project) -> None:
    await cors_origins(project, [APP])
    sent = await service.post(f"/v1/auth/magic-link/send?project_id={project.id}",
                              {"destination": email()}, key=None, headers={"Origin": APP})
    assert sent.status == 200, sent.body
    for r in (sent,
              # an error answer: the browser's code reads it too
              await service.get(f"/v1/sessions/me?project_id={project.id}", key=None,
                                headers={"Origin": APP}),
              await service.post(f"/v1/sessions/refresh?project_id={project.id}",
                                 {"refresh_token": "rt_nothing"}, key=None,
                                 headers={"Origin": APP})):
        assert r.headers["Access-Control-Allow-Origin"] == APP, r.status
        assert r.headers["Access-Control-Allow-Credentials"] == "true"
        exposed = [h.strip().lower() for h in r.headers["Access-Control-Expose-Headers"].split(",")]
        assert "x-request-id" in exposed
        assert "Origin" in r.headers["Vary"]
        assert r.headers["X-Request-Id"] == r.body["request_id"]
    assert [r.status for r in (sent,)] == [200]


async def test_answers_to_another_origin_carry_none(service: Api, project: Project) -> None:
    await cors_origins(project, [APP])
    r = await service.post(f"/v1/auth/magic-link/send?project_id={project.id}",
                           {"destination": email()}, key=None,
                           headers={"Origin": "https://evil.example.com"})
    assert r.status == 200  # CORS is the browser's to enforce: the call itself is not refused
    assert aca(r) == {} and "Access-Control-Expose-Headers" not in r.headers
    assert r.headers["Vary"] == "Origin"
    r = await service.get(f"/v1/sessions/me?project_id={project.id}", key=None)
    assert aca(r) == {}  # no Origin (a server): nothing added


async def test_management_routes_never_answer_cors(service: Api, project: Project) -> None:
    await cors_origins(project, [APP])
    await configure(project, origins=[LOCAL])
    for path in (f"/v1/users?project_id={project.id}", f"/v1/projects/me?project_id={project.id}",
                 f"/v1/stores?project_id={project.id}"):
        r = await preflight(service, path, APP, method="GET", headers="authorization")
        assert r.status == 405, (path, r.status)
        assert aca(r) == {}, path
    r = await project.api.get(f"/v1/projects/me?project_id={project.id}", headers={"Origin": APP})
    assert r.status == 200 and aca(r) == {}
    assert "Access-Control-Expose-Headers" not in r.headers
    r = await project.api.get(f"/v1/users?project_id={project.id}", headers={"Origin": LOCAL})
    assert r.status == 200 and aca(r) == {}


async def test_a_plain_options_says_what_the_path_answers(service: Api) -> None:
    r = await service.request("OPTIONS", "/v1/sessions/me", key=None)
    assert r.status == 204
    assert set(r.headers["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}
    assert aca(r) == {}


async def test_the_browser_module_is_served_to_any_page(service: Api) -> None:
    r = await service.get("/v1/browser/authio.js", headers={"Origin": "https://anywhere.test"})
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/javascript")
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in r.headers
    assert b'import "./simplewebauthn-browser.umd.min.js"' in r.raw
    r = await service.get("/v1/browser/simplewebauthn-browser.umd.min.js")
    assert r.status == 200 and r.raw.startswith(b"/* [@simplewebauthn/browser@13.2.2] */")


async def test_a_session_of_another_project_is_not_read_by_this_projects_origins(
        service: Api, project: Project, new_project: Callable[[str], Awaitable[Project]]) -> None:
    """A page allowed by ``project`` names it, but the call carries a session of ``other`` (its
    cookie, sent along by a browser on the same site): the answer carries no CORS header, so
    that page cannot read the other project's session."""
    other = await new_project("other")
    await cors_origins(project, [APP])
    theirs = await sign_in(other, email())
    ours = await sign_in(project, email())
    for token, allowed in ((theirs.access_token, False), (ours.access_token, True)):
        for headers in ({"Cookie": f"service_session={token}"},
                        {"Authorization": f"Bearer {token}"}):
            r = await service.get(f"/v1/sessions/me?project_id={project.id}", key=None,
                                  headers={"Origin": APP, **headers})
            assert r.status == 200, r.body  # the call is answered; only the page may not read it
            assert ("Access-Control-Allow-Origin" in r.headers) is allowed, (allowed, headers)


async def test_another_process_follows_a_change_within_the_cache_bound(
        service: Api, project: Project, settings_factory: Callable[..., Settings],
        http: ClientSession) -> None:
    """Two processes of one deployment: the one that served the ``PATCH`` follows at once, the
    other keeps what it read for at most ``CACHE_SECONDS`` (10 s)."""
    await cors_origins(project, [APP])
    path = f"{LOGIN_OPTIONS}?project_id={project.id}"
    async with serving(http, combined_app(settings_factory())) as second:
        assert_preflight_allowed(await preflight(second, path, APP), APP)  # read and kept
        await cors_origins(project, [])
        changed = time.monotonic()
        assert (await preflight(service, path, APP)).status == 403  # this process: at once
        assert (await preflight(second, path, APP)).status == 204  # the other: still kept
        while (await preflight(second, path, APP)).status != 403:
            assert time.monotonic() - changed < CACHE_SECONDS + 2, "not followed in time"
            await asyncio.sleep(0.25)
        assert aca(await preflight(second, path, APP)) == {}


async def test_an_allowed_origin_may_post_with_the_session_cookie(
        service: Api, project: Project, new_project: Callable[[str], Awaitable[Project]]) -> None:
    """``app.example.com`` calling authio on ``auth.example.com`` (the same site: the browser
    sends the SameSite=Lax cookie): an unsafe call authenticated by the cookie alone passes the
    CSRF check from an origin the project allows, and only from one. A sibling origin the
    project does not allow, and an allowed origin presenting another project's cookie, are
    still refused (403 ``forbidden``, ``cross_origin``) and change nothing."""
    other = await new_project("other")
    await cors_origins(project, [APP])
    await cors_origins(other, ["https://other.example.com"])
    ours, theirs = await sign_in(project, email()), await sign_in(other, email())
    same_site = {"Sec-Fetch-Site": "same-site"}
    refusals = ((ours, {"Origin": "https://evil.example.com", **same_site}),  # not allowed
                (theirs, {"Origin": APP, **same_site}))  # another project's cookie
    for signed_in, headers in refusals:
        r = await service.post(f"/v1/sessions/revoke?project_id={project.id}", {}, key=None,
                               headers={"Cookie": f"service_session={signed_in.access_token}",
                                        **headers})
        assert r.status == 403, (headers, r.body)
        assert r.body["error"]["details"]["reason"] == "cross_origin", r.body
        assert aca(r) == {}
    for signed_in, p in ((ours, project), (theirs, other)):
        alive = await service.get(f"/v1/sessions/me?project_id={p.id}", key=None,
                                  headers={"Authorization": f"Bearer {signed_in.access_token}"})
        assert alive.status == 200, alive.body
    r = await service.post(f"/v1/sessions/revoke?project_id={project.id}", {}, key=None,
                           headers={"Cookie": f"service_session={ours.access_token}",
                                    "Origin": APP, **same_site})
    assert r.status == 200, r.body
    assert r.headers["Access-Control-Allow-Origin"] == APP
    gone = await service.get(f"/v1/sessions/me?project_id={project.id}", key=None,
                             headers={"Authorization": f"Bearer {ours.access_token}"})
    assert gone.status == 401, gone.body
