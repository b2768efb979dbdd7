"""A console sign-in that the risk engine challenges, finished by a step-up in headless
Chromium (issue 23): the sign-in page (a passkey) and the link's page (``/console/verify``)
offer the step-ups the ``step_up_required`` refusal allows, make them with the public step-up
calls of the operator project, and open the console session with the tokens they answer.

The operator project has no API key, so no ``PUT /v1/risk/policy`` reaches it: the tests set its
policy with the risk rules themselves (``risk.service.set_policy``, what that route runs):
challenge at 10, block at 90, every signal at its default weight. The operator signs in once
from headless Chromium (its device is then known), and then from "another device": the browser
says it is Firefox on Windows (``Emulation.setUserAgentOverride``), so ``new_device`` (15) fires
and the sign-in is challenged, as ``tests/risk`` challenges its users with a new place.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.fixtures.browser import add_authenticator, kept_on_failure, remove_authenticator
from tests.fixtures.database import events
from tests.operators.helpers import (
    FIREFOX_WINDOWS,
    SENT,
    ConsoleService,
    Tenant,
    add_passkey,
    challenge_new_devices,
    console_log,
    follow_link,
    left_for,
    mailed_link,
    passkey_sign_in,
    pretend,
    request_link,
    signed_in,
    status_text,
    step_up_buttons,
    tenant,
)

BOTH: Final = "This sign-in needs confirming: use your passkey, or get a link by e-mail within 5 minutes."
STEP_UP_SUBJECT: Final = "Confirm your sign-in to "


async def _operator_project(console: ConsoleService, who: Tenant) -> str:
    project_id: str = await console.db.fetchval(
        "SELECT id FROM projects WHERE tenant_id = $1 AND kind = 'operators'",
        who.project.tenant_id)
    return project_id


def _sign_out(driver: webdriver.Chrome) -> None:
    driver.find_element(By.ID, "sign-out").click()
    left_for(driver, "/console/sign-in")


def _press(driver: webdriver.Chrome, button: str) -> None:
    driver.find_element(By.ID, button).click()


def _focused(driver: webdriver.Chrome) -> str:
    return str(driver.execute_script("return document.activeElement.id"))


async def _challenged_decisions(console: ConsoleService, project_id: str) -> list[str]:
    rows = await console.db.fetch(
        "SELECT decision FROM risk_decisions WHERE project_id = $1 ORDER BY created_at",
        project_id)
    return [r["decision"] for r in rows]


async def _on_a_new_device(console: ConsoleService, console_db: str, browser: webdriver.Chrome,
                           who: Tenant, operators: str) -> None:
    """``who``'s operator signs in, adds a passkey ("Laptop") and signs out; then the operator
    project challenges new devices and the browser says it is Firefox on Windows: the next
    sign-in is challenged."""
    await signed_in(browser, console, who)
    said = await asyncio.to_thread(add_passkey, browser, console.base_url, "Laptop")
    assert said == "Added the passkey Laptop.", said
    await asyncio.to_thread(_sign_out, browser)
    await challenge_new_devices(console_db, operators)
    await asyncio.to_thread(pretend, browser, FIREFOX_WINDOWS)


async def test_a_challenged_passkey_sign_in_is_confirmed_with_the_passkey(
        console: ConsoleService, console_db: str, browser: webdriver.Chrome,
        tmp_path: Path) -> None:
    acme = await tenant(console)
    operators = await _operator_project(console, acme)
    authenticator = await asyncio.to_thread(add_authenticator, browser)
    try:
        async with kept_on_failure(browser, tmp_path / "failure"):
            await _on_a_new_device(console, console_db, browser, acme, operators)
            await asyncio.to_thread(console_log, browser)

            said = await asyncio.to_thread(passkey_sign_in, browser, console.base_url)
            assert said == BOTH, said
            assert await asyncio.to_thread(step_up_buttons, browser) == \
                {"step-up-passkey": True, "step-up-link": True}
            assert await asyncio.to_thread(_focused, browser) == "step-up-title"
            assert await asyncio.to_thread(browser.get_cookie, "authio_console") is None

            await asyncio.to_thread(_press, browser, "step-up-passkey")
            assert await asyncio.to_thread(left_for, browser, "/console/recovery") == \
                "/console/recovery"
            header = await asyncio.to_thread(
                lambda: browser.find_element(By.CSS_SELECTOR, "header").text)
            assert f"Signed in as {acme.operator_email}" in header
            cookies = {c["name"] for c in await asyncio.to_thread(browser.get_cookies)}
            assert "authio_console" in cookies and "service_session" not in cookies
            # Only the refusal's 401, which the page handled: no script or CSP error.
            errors = await asyncio.to_thread(console_log, browser)
            assert [e for e in errors if "status of 401" not in e["message"]] == [], errors
    finally:
        await asyncio.to_thread(pretend, browser, None)
        await asyncio.to_thread(remove_authenticator, browser, authenticator)

    assert await _challenged_decisions(console, operators) == ["allow", "challenge"]
    [satisfied] = await events(console.db, operators, "auth.step_up_satisfied")
    assert satisfied["metadata"]["method"] == "step_up_passkey", satisfied["metadata"]
    assert satisfied["metadata"]["primary_method"] == "passkey", satisfied["metadata"]
    [risked] = [e for e in await events(console.db, operators, "auth.risk_evaluated")
                if e["metadata"].get("decision") == "challenge"]
    assert "new_device" in risked["metadata"]["signals"], risked["metadata"]


async def test_a_challenged_link_sign_in_is_confirmed_with_a_step_up_link(
        console: ConsoleService, console_db: str, browser: webdriver.Chrome,
        tmp_path: Path) -> None:
    acme = await tenant(console)
    operators = await _operator_project(console, acme)
    authenticator = await asyncio.to_thread(add_authenticator, browser)
    try:
        async with kept_on_failure(browser, tmp_path / "failure"):
            await _on_a_new_device(console, console_db, browser, acme, operators)

            said = await asyncio.to_thread(request_link, browser, console.base_url,
                                           acme.operator_email)
            assert said == SENT.format(email=acme.operator_email), said
            link = await mailed_link(console, acme.operator_email, count=2)
            landed = await asyncio.to_thread(follow_link, browser, link)
            assert "/console/verify?" in landed, landed
            assert await asyncio.to_thread(status_text, browser) == BOTH
            assert await asyncio.to_thread(step_up_buttons, browser) == \
                {"step-up-passkey": True, "step-up-link": True}
            # The used link's token left the address bar.
            assert "#token=" not in await asyncio.to_thread(lambda: browser.current_url)

            await asyncio.to_thread(_press, browser, "step-up-link")
            said = await asyncio.to_thread(status_text, browser)
            masked = acme.operator_email[0] + "***@example.com"
            assert said == (f"A confirmation link is on its way to {masked}. It expires in 5 "
                            "minutes; opening it signs you in."), said
            # The step-up link is a link of the operator project like any: it lands on the
            # console's own page, which redeems it and opens the console.
            step_up_link = await mailed_link(console, acme.operator_email,
                                             subject=STEP_UP_SUBJECT)
            assert f"/v1/auth/magic-link/verify?project_id={operators}#token=" in step_up_link
            landed = await asyncio.to_thread(follow_link, browser, step_up_link)
            assert landed.endswith("/console/recovery"), landed
            header = await asyncio.to_thread(
                lambda: browser.find_element(By.CSS_SELECTOR, "header").text)
            assert f"Signed in as {acme.operator_email}" in header
    finally:
        await asyncio.to_thread(pretend, browser, None)
        await asyncio.to_thread(remove_authenticator, browser, authenticator)

    assert await _challenged_decisions(console, operators) == ["allow", "challenge"]
    [satisfied] = await events(console.db, operators, "auth.step_up_satisfied")
    assert satisfied["metadata"]["method"] == "step_up_magic_link", satisfied["metadata"]
