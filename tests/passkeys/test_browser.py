"""The whole passkey ceremony in a real browser: headless Chromium (tests/fixtures/browser.py)
with its virtual authenticator (resident keys, user verification) registers a passkey on the
page the service serves for the project, then signs in with it usernameless, and the session
works. RP id ``localhost``: browsers treat ``http://localhost`` as a secure context."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.virtual_authenticator import (
    Protocol,
    Transport,
    VirtualAuthenticatorOptions,
)
from selenium.webdriver.support.ui import WebDriverWait

from tests.fixtures.identity import session_call
from tests.fixtures.service import Api, Project
from tests.passkeys.helpers import configure, signed_in_user

_FETCH_ME = """
const done = arguments[arguments.length - 1];
fetch("/v1/sessions/me", {credentials: "same-origin"})
  .then(async (r) => done({status: r.status, body: await r.json()}))
  .catch((e) => done({status: 0, body: String(e)}));
"""


def _status_after(driver: webdriver.Chrome, button: str, done: str) -> str:
    """Click ``button`` and wait until the status starts with ``done`` or reports a failure."""
    driver.find_element(By.ID, button).click()

    def settled(d: Any) -> str | None:
        text = str(d.find_element(By.ID, "status").text)
        return text if text.startswith((done, "Could not", "Sign-in failed")) else None
    return str(WebDriverWait(driver, 20).until(settled))


def _console(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    get_log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # untyped in selenium
    return [e for e in get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def _ceremony(driver: webdriver.Chrome, page: str, access_token: str) -> dict[str, Any]:
    driver.get(page)
    driver.delete_all_cookies()
    driver.add_cookie({"name": "service_session", "value": access_token, "path": "/",
                       "httpOnly": True, "sameSite": "Lax"})
    driver.get(page)
    _console(driver)
    options = VirtualAuthenticatorOptions(
        protocol=Protocol.CTAP2, transport=Transport.INTERNAL, has_resident_key=True,
        has_user_verification=True, is_user_consenting=True, is_user_verified=True)
    driver.add_virtual_authenticator(options)
    try:
        driver.find_element(By.ID, "name").send_keys("Chromium")
        registered = _status_after(driver, "register", "Added the passkey")
        passkey_id = driver.find_element(By.ID, "status").get_attribute("data-passkey-id")
        credentials = driver.get_credentials()
        driver.delete_all_cookies()  # signed out: the login must stand on the passkey alone
        driver.get(page)
        signed_in = _status_after(driver, "login", "Signed in as")
        status = driver.find_element(By.ID, "status")
        cookie = driver.get_cookie("service_session")
        me = driver.execute_async_script(_FETCH_ME)
        return {"registered": registered, "passkey_id": passkey_id, "signed_in": signed_in,
                "user_id": status.get_attribute("data-user-id"), "cookie": cookie, "me": me,
                "resident": [c.is_resident_credential for c in credentials],
                "console": _console(driver)}
    finally:
        driver.remove_virtual_authenticator()
        driver.delete_all_cookies()


async def test_register_on_the_page_then_usernameless_login(
        service: Api, project: Project, browser: webdriver.Chrome) -> None:
    port = urlsplit(service.base_url).port
    origin = f"http://localhost:{port}"
    await configure(project, origins=[origin])
    user = await signed_in_user(project)
    page = f"{origin}/v1/auth/passkey/page?project_id={project.id}"

    seen = await asyncio.to_thread(_ceremony, browser, page, user.access_token)

    assert seen["registered"] == "Added the passkey Chromium.", seen
    assert seen["resident"] == [True], seen
    assert seen["signed_in"].startswith("Signed in as"), seen
    assert seen["user_id"] == user.user_id, seen
    assert seen["cookie"] is not None and seen["cookie"]["httpOnly"] is True
    assert seen["me"]["status"] == 200 and seen["me"]["body"]["user"]["id"] == user.user_id, seen
    assert seen["me"]["body"]["session"]["auth_method"] == "passkey"
    assert seen["console"] == [], seen["console"]  # no script error, no CSP violation
    me = await session_call(service, "GET", "/v1/sessions/me", seen["cookie"]["value"])
    assert me.status == 200 and me.body["user"]["id"] == user.user_id
    listed = await project.api.get(f"/v1/users/{user.user_id}/passkeys")
    assert [(p["id"], p["name"], p["sign_count"] >= 0, p["last_used_at"] is not None)
            for p in listed.body["data"]] == [(seen["passkey_id"], "Chromium", True, True)]
