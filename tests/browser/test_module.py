"""The browser module from a page on another origin, in headless Chromium (tests/fixtures/
browser.py) with a virtual authenticator (Chrome DevTools ``WebAuthn.addVirtualAuthenticator``).

The service runs on ``http://127.0.0.1:<port>``; the application's page on
``http://localhost:<other port>``, another origin and even another site (so the
``service_session`` cookie, SameSite=Lax, is never sent: the module's Bearer token carries the
session). The page imports ``/v1/browser/authio.js`` from the service, signs up by magic link,
adds a passkey, signs out, signs in with the passkey usernameless, reads ``/v1/sessions/me`` and
refreshes. A page on an origin the project does not allow loads the module as well, but every
call it makes is blocked by the browser's CORS check."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.support.ui import WebDriverWait

from tests.fixtures.browser import add_authenticator, kept_on_failure, remove_authenticator
from tests.fixtures.identity import email, latest_link, token_of
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import Api, Project, loopback_app
from tests.passkeys.helpers import configure

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>An application</title></head>
<body><p id="status">loading</p>
<script type="module">
import {{ createClient, AuthioError }} from "{service}/v1/browser/authio.js";
window.AuthioError = AuthioError;
window.authio = createClient({{ projectId: "{project_id}", baseUrl: "{service}" }});
document.getElementById("status").textContent = "ready";
</script></body></html>
"""

# Runs ``steps`` (an async function of the client, as source) in the page; answers
# {ok, value} or {ok: false, name, message, status, code}.
_RUN = """
const [source, done] = [arguments[0], arguments[arguments.length - 1]];
const steps = eval(source);
steps(window.authio).then(
  (value) => done({ok: true, value}),
  (e) => done({ok: false, name: e.name, message: String(e.message),
               authio: e instanceof window.AuthioError, status: e.status || null,
               code: e.code || null}));
"""


@contextlib.asynccontextmanager
async def page_server(html: str) -> AsyncIterator[str]:
    """A second HTTP server serving ``html`` at every path: its origin,
    ``http://localhost:<port>``."""
    app = web.Application()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html")

    app.router.add_get("/{path:.*}", page)
    async with loopback_app(app) as port:
        yield f"http://localhost:{port}"


def _open(driver: webdriver.Chrome, url: str) -> None:
    """Open the page and wait until its module has made the client."""
    driver.get(url)
    try:
        WebDriverWait(driver, 10).until(
            lambda d: d.execute_script("return window.authio !== undefined"))
    except TimeoutException:
        raise AssertionError(f"the module did not load on {url}: {_console(driver)}") from None


def _console(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    get_log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # untyped in selenium
    return [e for e in get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def _run(driver: webdriver.Chrome, steps: str) -> dict[str, Any]:
    driver.set_script_timeout(30)
    result: dict[str, Any] = driver.execute_async_script(_RUN, steps)
    return result


async def test_a_page_on_another_origin_signs_up_and_in_with_a_passkey(
        service: Api, project: Project, browser: webdriver.Chrome, tmp_path: Path) -> None:
    address = email()
    html = _PAGE.format(service=service.base_url, project_id=project.id)
    async with page_server(html) as origin, kept_on_failure(browser, tmp_path / "failure"):
        assert not origin.startswith(service.base_url)
        await configure(project, rp_id="localhost", origins=[origin])
        await asyncio.to_thread(browser.delete_all_cookies)
        await asyncio.to_thread(_open, browser, origin + "/")
        await asyncio.to_thread(_console, browser)  # drop what came before
        authenticator = await asyncio.to_thread(add_authenticator, browser)
        try:
            sent = await asyncio.to_thread(
                _run, browser, f"(a) => a.magicLink.send({json.dumps(address)})")
            assert sent == {"ok": True, "value": {"sent": True, "channel": "email",
                                                  "expires_in": sent["value"]["expires_in"],
                                                  "request_id": sent["value"]["request_id"]}}, sent
            token = token_of(await latest_link(project, address))
            signed_up = await asyncio.to_thread(
                _run, browser, f"(a) => a.magicLink.verify({json.dumps(token)})")
            assert signed_up["ok"], signed_up
            user_id = signed_up["value"]["user"]["id"]
            added = await asyncio.to_thread(
                _run, browser, "(a) => a.passkey.register({name: 'Chromium'})")
            assert added["ok"] and added["value"]["name"] == "Chromium", added
            out = await asyncio.to_thread(
                _run, browser, "async (a) => { const r = await a.signOut(); "
                               "return {revoked: r.revoked, token: a.accessToken}; }")
            assert out == {"ok": True, "value": {"revoked": True, "token": None}}, out
            me_out = await asyncio.to_thread(_run, browser, "(a) => a.me()")
            # signed out: the 401 is read (its CORS headers let the page see it)
            assert me_out["ok"] is False and me_out["status"] == 401, me_out
            assert me_out["code"] == "no_session", me_out
            signed_in = await asyncio.to_thread(_run, browser, "(a) => a.passkey.signIn()")
            assert signed_in["ok"], signed_in
            assert signed_in["value"]["user"]["id"] == user_id
            me = await asyncio.to_thread(_run, browser, "(a) => a.me()")
            assert me["ok"], me
            assert me["value"]["user"]["id"] == user_id
            assert me["value"]["session"]["auth_method"] == "passkey"
            refreshed = await asyncio.to_thread(
                _run, browser, "async (a) => { const old = a.refreshToken; await a.refresh(); "
                               "return {changed: a.refreshToken !== old, "
                               "session: (await a.me()).session.id}; }")
            assert refreshed == {"ok": True, "value": {
                "changed": True, "session": me["value"]["session"]["id"]}}, refreshed
            console = await asyncio.to_thread(_console, browser)
            assert [e for e in console if "CORS" in e["message"]] == [], console
        finally:
            await asyncio.to_thread(remove_authenticator, browser, authenticator)
        # The service's own view: a passkey session of that user, live.
        listed = await project.api.get(f"/v1/users/{user_id}/passkeys")
        assert [p["name"] for p in listed.body["data"]] == ["Chromium"]


async def test_a_magic_link_lands_on_the_applications_page_and_signs_in_there(
        service: Api, project: Project, browser: webdriver.Chrome, tmp_path: Path) -> None:
    """``magicLink.send(address, {redirectUrl})`` from the application's page: the link in the
    message is that page with ``#token=``; following it opens the application (not authio's
    page), whose ``magicLink.verify()`` reads the token from the fragment, takes it out of the
    address bar, and signs in."""
    address = email()
    html = _PAGE.format(service=service.base_url, project_id=project.id)
    async with page_server(html) as origin, kept_on_failure(browser, tmp_path / "failure"):
        r = await project.api.request("PATCH", "/v1/projects/me", json={"cors_origins": [origin]})
        assert r.status == 200, r.body
        await asyncio.to_thread(browser.delete_all_cookies)
        await asyncio.to_thread(_open, browser, origin + "/")
        landing = f"{origin}/signed-in?next=docs"
        sent = await asyncio.to_thread(
            _run, browser,
            f"(a) => a.magicLink.send({json.dumps(address)}, "
            f"{{redirectUrl: {json.dumps(landing)}}})")
        assert sent["ok"], sent
        text = (await mailbox_messages(project.api, address))[0]["text"]
        link = next(w for w in text.split() if w.startswith(landing + "#token="))
        await asyncio.to_thread(_open, browser, link)
        signed_in = await asyncio.to_thread(
            _run, browser, "async (a) => { const g = await a.magicLink.verify(); "
                           "return {email: g.user.email, url: location.href, "
                           "token: a.accessToken !== null}; }")
        assert signed_in == {"ok": True, "value": {
            "email": address, "url": landing, "token": True}}, signed_in
        me = await asyncio.to_thread(_run, browser, "(a) => a.me()")
        assert me["ok"] and me["value"]["user"]["email"] == address, me


async def test_a_page_on_an_origin_the_project_does_not_allow_is_blocked(
        service: Api, project: Project, browser: webdriver.Chrome, tmp_path: Path) -> None:
    html = _PAGE.format(service=service.base_url, project_id=project.id)
    async with page_server(html) as allowed, page_server(html) as other, \
            kept_on_failure(browser, tmp_path / "failure"):
        await project.api.request("PATCH", "/v1/projects/me", json={"cors_origins": [allowed]})
        await configure(project, rp_id="localhost", origins=[allowed])
        await asyncio.to_thread(_open, browser, other + "/")  # the module itself loads anywhere
        await asyncio.to_thread(_console, browser)
        for steps in ("(a) => a.passkey.signIn()", "(a) => a.magicLink.send('x@example.com')",
                      "(a) => a.me()"):
            blocked = await asyncio.to_thread(_run, browser, steps)
            # fetch rejects with a TypeError, the answer unread: not an AuthioError with a status
            assert blocked["ok"] is False and blocked["name"] == "TypeError", blocked
            assert blocked["authio"] is False and blocked["status"] is None, blocked
        console = await asyncio.to_thread(_console, browser)
        assert any("blocked by CORS policy" in e["message"] for e in console), console
        # The same page on the allowed origin is answered.
        await asyncio.to_thread(_open, browser, allowed + "/")
        answered = await asyncio.to_thread(_run, browser, "(a) => a.me()")
        assert answered["ok"] is False and answered["status"] == 401, answered
        assert answered["code"] == "no_session", answered
