"""Passkey sign-in to the operator console in headless Chromium with a virtual authenticator
(Chrome DevTools Protocol ``WebAuthn.addVirtualAuthenticator``: CTAP2, internal, resident keys,
user verification): an operator signed in by a link adds a (discoverable) passkey, signs out,
signs in with it without typing an address and acts as the operator (``actor_type``
``operator``); a user of an ordinary project with a passkey of the same host gets no console
session; a removed operator's passkey signs no one in to the console.
The operator project's relying party is the service's host (``localhost``) and base URL, set by
the service itself. When a test fails, a screenshot and the HTML of the page are kept in its
``tmp_path`` (the path is printed).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.fixtures.browser import add_authenticator, credential_count, kept_on_failure, remove_authenticator
from tests.fixtures.database import events
from tests.operators.helpers import (
    ConsoleService,
    Tenant,
    add_passkey,
    ceremonies,
    console_log,
    csrf_of,
    fresh,
    mailed_link,
    open_page,
    page_fetch,
    passkey_sign_in,
    signed_in,
    tenant,
)

NOT_AN_OPERATOR = ("This passkey is no operator's: sign in with a link, then add a passkey on "
                   "the console's Passkeys page.")
UNKNOWN_PASSKEY = "No passkey of this project has that credential id."


async def _operator_project(console: ConsoleService, who: Tenant) -> str:
    project_id: str = await console.db.fetchval(
        "SELECT id FROM projects WHERE tenant_id = $1 AND kind = 'operators'",
        who.project.tenant_id)
    return project_id


def _sign_out(driver: webdriver.Chrome) -> None:
    driver.find_element(By.ID, "sign-out").click()
    WebDriverWait(driver, 10).until(lambda d: d.current_url.endswith("/console/sign-in"))


def _click_in_row(driver: webdriver.Chrome, row_id: str, label: str) -> str:
    row = driver.find_element(By.ID, row_id)
    [button] = [b for b in row.find_elements(By.TAG_NAME, "button") if b.text == label]
    button.click()
    WebDriverWait(driver, 20).until(
        lambda d: d.find_element(By.ID, row_id).find_element(By.CLASS_NAME, "outcome").text)
    return str(row.find_element(By.CLASS_NAME, "outcome").text)


async def test_an_operator_adds_a_passkey_and_signs_in_with_it(
        console: ConsoleService, browser: webdriver.Chrome, tmp_path: Path) -> None:
    acme = await tenant(console)
    r = await acme.project.api.post("/v1/api-keys", {"prefix": "sk_live_", "name": "old robot",
                                                     "scopes": ["users:read"]})
    assert r.status == 201, r.body
    doomed = r.body
    operators = await _operator_project(console, acme)
    # The operator project's relying party was set when the bootstrap made it.
    rp = await console.db.fetchrow(
        "SELECT rp_id, origins, user_verification FROM webauthn_settings WHERE project_id = $1",
        operators)
    assert rp is not None and (rp["rp_id"], list(rp["origins"]), rp["user_verification"]) == \
        ("localhost", [console.base_url], "required")
    authenticator = await asyncio.to_thread(add_authenticator, browser)
    try:
        async with kept_on_failure(browser, tmp_path / "failure"):
            await signed_in(browser, console, acme)
            # The console asks for a discoverable credential (the sign-in needs no address),
            # named with the operator project (every tenant's console passkeys share a host).
            got = await asyncio.to_thread(page_fetch, browser, "POST", "/console/passkeys/options",
                                          {}, {"X-CSRF-Token": await asyncio.to_thread(
                                              csrf_of, browser)})
            assert got["status"] == 200, got
            creation = json.loads(got["text"])
            assert creation["authenticatorSelection"]["residentKey"] == "required", creation
            assert creation["authenticatorSelection"]["userVerification"] == "required", creation
            assert creation["user"]["name"] == acme.operator_email
            assert creation["user"]["displayName"] == f"{acme.operator_email} (Acme operators)"
            said = await asyncio.to_thread(add_passkey, browser, console.base_url, "Laptop")
            assert said == "Added the passkey Laptop.", said
            assert await asyncio.to_thread(credential_count, browser, authenticator) == 1
            listed = await asyncio.to_thread(
                lambda: browser.find_element(By.ID, "passkeys").text)
            assert "Laptop" in listed
            assert await asyncio.to_thread(console_log, browser) == []

            await asyncio.to_thread(_sign_out, browser)
            assert await asyncio.to_thread(browser.get_cookie, "authio_console") is None
            landed = await asyncio.to_thread(passkey_sign_in, browser, console.base_url)
            assert landed == "/console/recovery", landed
            header = await asyncio.to_thread(
                lambda: browser.find_element(By.CSS_SELECTOR, "header").text)
            assert f"Signed in as {acme.operator_email}" in header
            cookies = {c["name"]: c for c in await asyncio.to_thread(browser.get_cookies)}
            assert cookies["authio_console"]["httpOnly"] is True
            assert "service_session" not in cookies  # handed to the console's cookies

            # An action after a passkey sign-in is the operator's.
            await asyncio.to_thread(
                open_page, browser,
                f"{console.base_url}/console/api-keys?project_id={acme.project.id}")
            assert await asyncio.to_thread(_click_in_row, browser, doomed["id"], "Revoke") == \
                "Revoked."
            assert await asyncio.to_thread(console_log, browser) == []

            # Removing the passkey on the page: it signs in no more.
            await asyncio.to_thread(open_page, browser, f"{console.base_url}/console/passkeys")
            [row] = await asyncio.to_thread(
                lambda: [r.get_attribute("id")
                         for r in browser.find_elements(By.CSS_SELECTOR, "#passkeys tbody tr")])
            assert row is not None
            assert await asyncio.to_thread(_click_in_row, browser, row, "Remove") == "Removed."
            await asyncio.to_thread(_sign_out, browser)
            # The authenticator still offers it; the operator project knows it no more.
            said = await asyncio.to_thread(passkey_sign_in, browser, console.base_url)
            assert said == UNKNOWN_PASSKEY, said
            assert await asyncio.to_thread(browser.get_cookie, "authio_console") is None
    finally:
        await asyncio.to_thread(remove_authenticator, browser, authenticator)

    [revoked] = await events(console.db, acme.project.id, "api_key.revoked")
    assert (revoked["actor_type"], revoked["actor_id"], revoked["target_id"]) == \
        ("operator", acme.operator_id, doomed["id"])
    signins = [e["metadata"]["method"] for e in await events(console.db, operators,
                                                              "auth.signin_attempt")
               if e["metadata"]["outcome"] == "success"]
    assert sorted(signins) == ["magic_link", "passkey"], signins
    [created] = await events(console.db, operators, "passkey.created")
    [deleted] = await events(console.db, operators, "passkey.deleted")
    assert created["target_id"] == deleted["target_id"] == row


async def test_a_user_of_an_ordinary_project_with_a_passkey_gets_no_console_session(
        console: ConsoleService, browser: webdriver.Chrome, tmp_path: Path) -> None:
    acme = await tenant(console)
    r = await acme.project.api.request("PATCH", "/v1/projects/me", json={"webauthn": {
        "rp_id": "localhost", "rp_name": "Acme", "origins": [console.base_url],
        "user_verification": "required"}})
    assert r.status == 200, r.body
    address = f"user-{secrets.token_hex(4)}@example.com"
    r = await console.api.post(f"/v1/auth/magic-link/send?project_id={acme.project.id}",
                               {"destination": address}, key=None)
    assert r.status == 200, r.body
    link = await mailed_link(console, address)
    r = await console.api.post(f"/v1/auth/magic-link/verify?project_id={acme.project.id}",
                               {"token": link.split("#token=", 1)[1]}, key=None)
    assert r.status == 200, r.body
    access_token = r.body["access_token"]
    authenticator = await asyncio.to_thread(add_authenticator, browser)
    try:
        async with kept_on_failure(browser, tmp_path / "failure"):
            await asyncio.to_thread(fresh, browser)
            await asyncio.to_thread(open_page, browser, f"{console.base_url}/console/sign-in")
            seen: dict[str, Any] = await asyncio.to_thread(ceremonies, browser, acme.project.id,
                                                           access_token)
            assert "error" not in seen, seen
            assert seen["registered"]["status"] == 201, seen
            # The passkey signs the user in to their project...
            assert seen["login"]["status"] == 200, seen
            assert seen["login"]["body"]["user"]["email"] == address
            # ...and opens no console.
            assert seen["console"]["status"] == 401, seen
            assert seen["console"]["body"]["error"]["details"]["reason"] == "not_an_operator"
            assert await asyncio.to_thread(browser.get_cookie, "authio_console") is None
            # The console's passkey sign-in is offered that passkey (same host), and its user
            # is no operator.
            said = await asyncio.to_thread(passkey_sign_in, browser, console.base_url)
            assert said == NOT_AN_OPERATOR, said
            assert await asyncio.to_thread(browser.get_cookie, "authio_console") is None
    finally:
        await asyncio.to_thread(remove_authenticator, browser, authenticator)


async def test_a_removed_operators_passkey_no_longer_signs_in(
        console: ConsoleService, browser: webdriver.Chrome, tmp_path: Path) -> None:
    acme = await tenant(console)
    operators = await _operator_project(console, acme)
    authenticator = await asyncio.to_thread(add_authenticator, browser)
    try:
        async with kept_on_failure(browser, tmp_path / "failure"):
            await signed_in(browser, console, acme)
            said = await asyncio.to_thread(add_passkey, browser, console.base_url, "Phone")
            assert said == "Added the passkey Phone.", said
            r = await acme.project.api.delete(f"/v1/operators/{acme.operator_id}")
            assert r.status == 204, r.body
            await asyncio.to_thread(fresh, browser)
            # The authenticator still holds the credential; the console refuses it.
            assert await asyncio.to_thread(credential_count, browser, authenticator) == 1
            said = await asyncio.to_thread(passkey_sign_in, browser, console.base_url)
            assert said == NOT_AN_OPERATOR, said
            # Nor does the operator project's own passkey login take it: the passkey went with
            # the operator's user.
            seen = await asyncio.to_thread(ceremonies, browser, operators, None)
            assert "error" not in seen, seen
            assert seen["login"]["status"] == 400, seen
            assert seen["login"]["body"]["error"]["code"] == "verification_failed", seen
            assert "console" not in seen
            assert await asyncio.to_thread(browser.get_cookie, "authio_console") is None
            assert await asyncio.to_thread(browser.get_cookie, "service_session") is None
            # And the pages stay closed.
            got = await asyncio.to_thread(page_fetch, browser, "GET", "/console/passkeys")
            assert "Sign in to the operator console" in got["text"], got
    finally:
        await asyncio.to_thread(remove_authenticator, browser, authenticator)
