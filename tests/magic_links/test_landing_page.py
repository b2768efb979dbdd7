"""The magic-link landing page in a real browser (headless Chromium, tests/fixtures/browser.py).

``GET /v1/auth/magic-link/verify`` must never redeem the link (mail scanners follow links); its
button POSTs the token from an inline script allowed by the page's CSP nonce, and a successful
sign-in leaves the ``service_session`` cookie that then works as the session.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import asyncpg
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from common.auth import token_digest
from tests.fixtures.identity import latest_link, send_link, token_of
from tests.fixtures.service import Api, Project

PROMPT = "Press the button to finish signing in."
WORKING = "Signing in…"
CONSUMED = "This link was already used."
INVALID = "This link is not valid or has expired."

_FETCH_ME = """
const done = arguments[arguments.length - 1];
fetch("/v1/sessions/me", {credentials: "same-origin"})
  .then(async (r) => done({status: r.status, body: await r.json()}))
  .catch((e) => done({status: 0, body: String(e)}));
"""


@dataclass
class Page:
    title: str
    status: str
    button_shown: bool
    button_label: str
    console: list[dict[str, Any]]


def _console(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """The console entries since the last call (errors, CSP violations, warnings)."""
    get_log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # untyped in selenium
    return [e for e in get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def _state(driver: webdriver.Chrome) -> Page:
    button = driver.find_element(By.ID, "signin")
    return Page(driver.title, driver.find_element(By.ID, "status").text, button.is_displayed(),
                button.text, _console(driver))


def _open(driver: webdriver.Chrome, url: str) -> Page:
    """Load ``url`` afresh, as a click in a mail client does, with an empty cookie jar (the
    driver is shared by the session's tests). From the same page, a URL differing only in its
    fragment would be a same-document navigation and not load the page again."""
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    _console(driver)  # drop what earlier pages logged
    driver.get(url)
    return _state(driver)


def _click(driver: webdriver.Chrome) -> Page:
    """Press the button and wait until the page shows the outcome."""
    driver.find_element(By.ID, "signin").click()
    WebDriverWait(driver, 30).until(
        lambda d: d.find_element(By.ID, "status").text not in (PROMPT, WORKING))
    return _state(driver)


def _fetch_me(driver: webdriver.Chrome) -> dict[str, Any]:
    """``GET /v1/sessions/me`` from the page itself: only the browser's cookies go with it."""
    result: dict[str, Any] = driver.execute_async_script(_FETCH_ME)
    return result


def _on_service(service: Api, link: str) -> str:
    """The mailed link (on the public base URL) pointed at the service under test."""
    parts = urlsplit(link)
    return f"{service.base_url}{parts.path}?{parts.query}#{parts.fragment}"


async def _mailed_link(service: Api, project: Project) -> tuple[str, str]:
    email = f"landing-{secrets.token_hex(4)}@example.com"
    r = await send_link(project.api, project, email)
    assert r.status == 200, r.body
    return email, _on_service(service, await latest_link(project, email))


async def _consumed_at(db: asyncpg.Pool, token: str, email: str) -> Any:
    row = await db.fetchrow(
        "SELECT consumed_at FROM magic_link_tokens WHERE token_hash = $1 AND destination = $2",
        token_digest(token), email)
    assert row is not None, "the mailed token is not stored"
    return row["consumed_at"]


async def test_opening_the_link_shows_a_button_and_consumes_nothing(
        service: Api, project: Project, db: asyncpg.Pool, browser: webdriver.Chrome) -> None:
    email, link = await _mailed_link(service, project)
    page = await asyncio.to_thread(_open, browser, link)
    assert page.title == "Sign in"
    assert page.status == PROMPT
    assert page.button_shown and page.button_label == "Sign in"
    assert page.console == [], page.console  # no script error, no CSP violation
    assert await _consumed_at(db, token_of(link), email) is None
    # Loading it again (a scanner, a preview, a reload) still consumes nothing.
    page = await asyncio.to_thread(_open, browser, link)
    assert page.status == PROMPT
    assert await _consumed_at(db, token_of(link), email) is None


async def test_the_button_signs_in_and_leaves_a_working_session_cookie(
        service: Api, project: Project, db: asyncpg.Pool, browser: webdriver.Chrome) -> None:
    email, link = await _mailed_link(service, project)
    await asyncio.to_thread(_open, browser, link)
    before = await asyncio.to_thread(_fetch_me, browser)
    assert before["status"] == 401, before
    assert before["body"]["error"]["code"] == "no_session", before
    await asyncio.to_thread(_console, browser)  # that 401 is logged; the click must log nothing

    page = await asyncio.to_thread(_click, browser)
    assert page.status == f"You are signed in as {email}.", page
    assert not page.button_shown
    assert page.console == [], page.console
    assert await _consumed_at(db, token_of(link), email) is not None

    cookie = await asyncio.to_thread(browser.get_cookie, "service_session")
    assert cookie is not None
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Lax"
    assert cookie["path"] == "/"
    assert cookie["secure"] is False  # plain-HTTP localhost
    scripts_see = await asyncio.to_thread(browser.execute_script, "return document.cookie")
    assert "service_session" not in scripts_see

    me = await asyncio.to_thread(_fetch_me, browser)
    assert me["status"] == 200, me
    assert me["body"]["user"]["email"] == email
    assert me["body"]["user"]["email_verified"] is True


async def test_a_used_link_shows_that_it_was_used(
        service: Api, project: Project, browser: webdriver.Chrome) -> None:
    email, link = await _mailed_link(service, project)
    await asyncio.to_thread(_open, browser, link)
    page = await asyncio.to_thread(_click, browser)
    assert page.status == f"You are signed in as {email}.", page

    page = await asyncio.to_thread(_open, browser, link)
    assert page.status == PROMPT
    page = await asyncio.to_thread(_click, browser)
    assert page.status == CONSUMED, page
    assert await asyncio.to_thread(browser.get_cookie, "service_session") is None


async def test_an_unknown_token_shows_that_the_link_is_not_valid(
        service: Api, project: Project, browser: webdriver.Chrome) -> None:
    query = urlencode({"project_id": project.id})
    fragment = urlencode({"token": secrets.token_urlsafe(32)})
    page = await asyncio.to_thread(_open, browser,
                                   f"{service.base_url}/v1/auth/magic-link/verify?{query}#{fragment}")
    assert page.status == PROMPT
    page = await asyncio.to_thread(_click, browser)
    assert page.status == INVALID, page
    assert await asyncio.to_thread(browser.get_cookie, "service_session") is None
