"""Cross-site request forgery with the session cookie (issue 10, item 7).

SameSite=Lax keeps the cookie off a cross-site POST, but not off one from a sibling origin of
the same site: another port or subdomain of the service's host. A page there could sign the user
out, switch their organization or register a passkey with their cookie. Cookie-authenticated
unsafe requests are checked against the browser's ``Sec-Fetch-Site`` and ``Origin`` headers
(``control_plane.web.auth.check_same_origin``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from selenium import webdriver

from common.settings import Settings
from tests.fixtures.identity import SignedIn, email, session_call, sign_in
from tests.fixtures.service import Api, Project, assert_error, start_app

_POST_REVOKE = """
const [url, mode] = [arguments[0], arguments[1]];
const done = arguments[arguments.length - 1];
fetch(url, {method: "POST", credentials: "include", mode})
  .then((r) => done({status: r.status, type: r.type}))
  .catch((e) => done({status: 0, type: String(e)}));
"""


def _cookie(token: str) -> dict[str, Any]:
    return {"name": "service_session", "value": token, "path": "/", "httpOnly": True,
            "sameSite": "Lax"}


@contextlib.asynccontextmanager
async def _other_origin() -> AsyncIterator[str]:
    """A page on another port of the service's host: another origin, but the same site."""
    app = web.Application()

    async def page(_: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>elsewhere</title>",
                            content_type="text/html")

    app.router.add_get("/", page)
    running = await start_app(app)
    try:
        yield running.base_url
    finally:
        await running.stop()


def _post_from(driver: webdriver.Chrome, page: str, target: str, token: str, *,
               cookie_on: str, mode: str) -> dict[str, Any]:
    """Give the browser the session cookie on ``cookie_on``, open ``page``, and let it POST to
    ``target`` with its credentials."""
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.get(f"{cookie_on}/healthz")
    driver.add_cookie(_cookie(token))
    driver.get(page)
    result: dict[str, Any] = driver.execute_async_script(_POST_REVOKE, target, mode)
    return result


async def _signed_in(service: Api, project: Project) -> SignedIn:
    return await sign_in(project, email(), api=service)


async def test_a_sibling_origin_cannot_sign_the_user_out(
        service: Api, project: Project, browser: webdriver.Chrome) -> None:
    """Before the check, this no-cors POST carried the cookie (same site) and ended the session."""
    s = await _signed_in(service, project)
    async with _other_origin() as elsewhere:
        await asyncio.to_thread(_post_from, browser, f"{elsewhere}/",
                                f"{service.base_url}/v1/sessions/revoke", s.access_token,
                                cookie_on=service.base_url, mode="no-cors")
    r = await session_call(service, "GET", "/v1/sessions/me", s.access_token)
    assert r.status == 200, r.body  # still signed in


async def test_the_services_own_pages_still_post_with_the_cookie(
        service: Api, project: Project, browser: webdriver.Chrome) -> None:
    s = await _signed_in(service, project)
    result = await asyncio.to_thread(_post_from, browser, f"{service.base_url}/healthz",
                                     "/v1/sessions/revoke", s.access_token,
                                     cookie_on=service.base_url, mode="same-origin")
    assert result["status"] == 200, result
    gone = await session_call(service, "GET", "/v1/sessions/me", s.access_token)
    assert_error(gone, 401, "no_session")


async def test_headers_of_a_cross_origin_cookie_request_are_refused(
        service: Api, project: Project) -> None:
    s = await _signed_in(service, project)
    cookie = {"Cookie": f"service_session={s.access_token}"}
    for headers in ({"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},
                    {"Sec-Fetch-Site": "cross-site"},
                    {"Origin": "http://evil.example"},
                    {"Origin": "null"}):
        r = await service.request("POST", "/v1/sessions/revoke",
                                  headers={**cookie, **headers})
        assert_error(r, 403, "forbidden")
        assert r.body["error"]["details"]["reason"] == "cross_origin"
    assert (await session_call(service, "GET", "/v1/sessions/me", s.access_token)).status == 200
    # Reading is not forgery: a cross-origin GET with the cookie is answered (CORS keeps the
    # answer from the other page).
    r = await service.request("GET", "/v1/sessions/me",
                              headers={**cookie, "Sec-Fetch-Site": "cross-site"})
    assert r.status == 200, r.body


async def test_bearer_tokens_and_clients_without_a_browser_are_not_affected(
        service: Api, project: Project) -> None:
    """A Bearer token is no ambient credential: another origin may send it. A client sending
    neither Origin nor Sec-Fetch-Site is no browser, so nothing could forge its cookie."""
    a, b = await _signed_in(service, project), await _signed_in(service, project)
    r = await service.request("POST", "/v1/sessions/revoke", headers={
        "Authorization": f"Bearer {a.access_token}", "Origin": "http://app.example",
        "Sec-Fetch-Site": "cross-site"})
    assert r.status == 200, r.body
    r = await service.request("POST", "/v1/sessions/revoke",
                              headers={"Cookie": f"service_session={b.access_token}"})
    assert r.status == 200, r.body


async def test_the_public_base_url_and_the_host_are_this_origin(
        service: Api, project: Project, settings_factory: Callable[..., Settings]) -> None:
    """A browser that sends no ``Sec-Fetch-Site`` is judged by ``Origin``: behind a proxy it is
    the public base URL, not the Host we see; without one it is the Host. Either passes the
    origin check (to be told the user is no member); a sibling port does not."""
    public = urlsplit(settings_factory().public_base_url)
    s = await _signed_in(service, project)
    port = int(urlsplit(service.base_url).port or 80)
    for origin, allowed in ((service.base_url, True), (f"{public.scheme}://{public.netloc}", True),
                            (f"http://127.0.0.1:{port + 1}", False)):
        r = await service.post("/v1/sessions/select-org", {"organization_id": "org_x"}, headers={
            "Cookie": f"service_session={s.access_token}", "Origin": origin})
        if allowed:
            assert_error(r, 403, "not_a_member")
        else:
            assert_error(r, 403, "forbidden")
            assert r.body["error"]["details"] == {"reason": "cross_origin", "origin": origin}
