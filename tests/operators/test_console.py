"""The operator console in headless Chromium (issue 23): an operator signs in by a magic link
mailed over real SMTP, then approves and denies recovery requests, approves a device's
``authio login``, revokes an API key and reads the audit log with its filters and export; each
action is recorded as the operator's (``actor_type`` ``operator``, ``actor_id`` the ``opr_``
id). A removed operator's session stops working; actions without the page's CSRF token or from
another origin are refused. When a test fails, a screenshot and the HTML of the page are kept in
its ``tmp_path`` (the path is printed).
"""

from __future__ import annotations

import asyncio
import csv
import io
import secrets
import statistics
from pathlib import Path
from typing import Any

import orjson
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from tests.fixtures.browser import kept_on_failure
from tests.fixtures.database import events
from tests.fixtures.service import assert_error, eventually
from tests.operators.helpers import (
    SENT,
    ConsoleService,
    Tenant,
    console_log,
    csrf_of,
    dom_interactive,
    fresh,
    mailed_link,
    open_page,
    page_fetch,
    request_link,
    signed_in,
    status_text,
    tenant,
)


async def user_with_request(who: Tenant) -> tuple[str, str]:
    """A user of the tenant's project with a pending recovery request: (user id, request id)."""
    api = who.project.api
    r = await api.post("/v1/users", {"email": f"u-{secrets.token_hex(5)}@example.com"})
    assert r.status == 201, r.body
    user_id = r.body["id"]
    r = await api.post("/v1/recovery/requests", {
        "user_id": user_id, "email": f"new-{secrets.token_hex(5)}@example.com",
        "reason": "lost phone and mailbox"})
    assert r.status == 201, r.body
    return user_id, r.body["id"]


def _click_in_row(driver: webdriver.Chrome, row_id: str, label: str, note: str = "") -> str:
    row = driver.find_element(By.ID, row_id)
    if note:
        row.find_element(By.TAG_NAME, "input").send_keys(note)
    [button] = [b for b in row.find_elements(By.TAG_NAME, "button") if b.text == label]
    button.click()
    WebDriverWait(driver, 20).until(
        lambda d: d.find_element(By.ID, row_id).find_element(By.CLASS_NAME, "outcome").text)
    return str(row.find_element(By.CLASS_NAME, "outcome").text)


def _labels(driver: webdriver.Chrome) -> dict[str, str]:
    """Each visible form field's id and the text of its ``label[for]``."""
    found = {}
    for field in driver.find_elements(By.CSS_SELECTOR, "input, select"):
        if field.get_attribute("type") == "hidden":
            continue
        ident = field.get_attribute("id") or ""
        labels = driver.find_elements(By.CSS_SELECTOR, f"label[for='{ident}']") if ident else []
        found[ident or str(field.get_attribute("outerHTML"))] = labels[0].text if labels else ""
    return found


def _tab_order(driver: webdriver.Chrome, steps: int) -> list[str]:
    driver.execute_script("document.activeElement && document.activeElement.blur()")
    order = []
    for _ in range(steps):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        order.append(str(driver.execute_script(
            "const a = document.activeElement; return a.id || a.textContent.trim()")))
    return order


# --- signing in -----------------------------------------------------------------------------------


async def test_an_operator_signs_in_by_a_mailed_link(console: ConsoleService,
                                                    browser: webdriver.Chrome,
                                                    tmp_path: Path) -> None:
    acme = await tenant(console)
    async with kept_on_failure(browser, tmp_path / "failure"):
        # The bootstrap invited the operator; its link lands on the console too.
        invitation = await mailed_link(console, acme.operator_email, subject="Welcome to ")
        assert "project_id=" in invitation

        landed = await signed_in(browser, console, acme)
        assert landed.startswith(f"{console.base_url}/console/recovery"), landed
        assert await asyncio.to_thread(lambda: browser.title) == \
            "Recovery requests · authio console"
        assert await asyncio.to_thread(console_log, browser) == []  # no script error, no CSP

        cookies = {c["name"]: c for c in await asyncio.to_thread(browser.get_cookies)}
        for name in ("authio_console", "authio_console_refresh"):
            assert cookies[name]["httpOnly"] is True, cookies[name]
            assert cookies[name]["sameSite"] == "Strict", cookies[name]
            assert cookies[name]["path"] == "/console", cookies[name]
        assert "service_session" not in cookies  # the sign-in's own cookie was cleared
        assert "authio_console" not in await asyncio.to_thread(
            browser.execute_script, "return document.cookie")
        header = await asyncio.to_thread(
            lambda: browser.find_element(By.CSS_SELECTOR, "header").text)
        assert f"Signed in as {acme.operator_email}" in header
        # Accessible: the skip link first, then the sections, then sign-out; the current
        # section is marked.
        order = await asyncio.to_thread(_tab_order, browser, 7)
        assert order == ["Skip to the page", "Recovery requests", "Device sign-ins", "API keys",
                         "Audit log", "Your passkeys", "sign-out"], order
        current = await asyncio.to_thread(
            lambda: browser.find_element(By.CSS_SELECTOR, "nav [aria-current='page']").text)
        assert current == "Recovery requests"

        # The sign-in was the operator project's, by magic link, of the operator's user.
        [signin] = [e for e in await _console_events(console, acme, "auth.signin_attempt")
                    if e["metadata"]["outcome"] == "success"]
        assert signin["metadata"]["method"] == "magic_link"


async def _console_events(console: ConsoleService, who: Tenant, action: str) -> list[dict[str, Any]]:
    project_id = await console.db.fetchval(
        "SELECT id FROM projects WHERE tenant_id = $1 AND kind = 'operators'",
        who.project.tenant_id)
    return await events(console.db, project_id, action)


async def test_an_address_that_is_no_operators_gets_the_same_answer_and_no_mail(
        console: ConsoleService, browser: webdriver.Chrome, tmp_path: Path) -> None:
    stranger = f"stranger-{secrets.token_hex(4)}@example.com"
    async with kept_on_failure(browser, tmp_path / "failure"):
        await asyncio.to_thread(fresh, browser)
        said = await asyncio.to_thread(request_link, browser, console.base_url, stranger)
        assert said == SENT.format(email=stranger)
        labels = await asyncio.to_thread(_labels, browser)
        assert labels == {"email": "E-mail address"}, labels
    await asyncio.sleep(0.5)  # the outbox polls every 0.1 s: a message would be out by now
    assert console.sink.to(stranger) == []


async def test_a_sign_in_that_is_no_operators_opens_no_console(console: ConsoleService) -> None:
    """A user of the operator project who is not an operator (anyone can sign in to a project
    by a public magic link) gets no console session."""
    acme = await tenant(console)
    project_id = await console.db.fetchval(
        "SELECT id FROM projects WHERE tenant_id = $1 AND kind = 'operators'",
        acme.project.tenant_id)
    stranger = f"stranger-{secrets.token_hex(4)}@example.com"
    r = await console.api.post(f"/v1/auth/magic-link/send?project_id={project_id}",
                               {"destination": stranger}, key=None)
    assert r.status == 200, r.body
    link = await mailed_link(console, stranger)
    token = link.split("#token=", 1)[1]
    r = await console.api.post(f"/v1/auth/magic-link/verify?project_id={project_id}",
                               {"token": token}, key=None)
    assert r.status == 200, r.body
    r = await console.api.post("/console/session", {"access_token": r.body["access_token"],
                                                    "refresh_token": r.body["refresh_token"]},
                               key=None)
    assert_error(r, 401, "no_session")
    assert r.body["error"]["details"]["reason"] == "not_an_operator"
    assert "authio_console" not in r.headers.get("Set-Cookie", "")


async def test_the_session_is_refreshed_when_its_access_token_is_gone(
        console: ConsoleService, browser: webdriver.Chrome, tmp_path: Path) -> None:
    acme = await tenant(console)
    async with kept_on_failure(browser, tmp_path / "failure"):
        await signed_in(browser, console, acme)
        before = await asyncio.to_thread(browser.get_cookie, "authio_console_refresh")
        await asyncio.to_thread(browser.delete_cookie, "authio_console")
        await asyncio.to_thread(open_page, browser, f"{console.base_url}/console/audit")
        assert "/console/audit" in await asyncio.to_thread(lambda: browser.current_url)
        renewed = await asyncio.to_thread(browser.get_cookie, "authio_console")
        assert renewed is not None and renewed["sameSite"] == "Strict"
        after = await asyncio.to_thread(browser.get_cookie, "authio_console_refresh")
        assert after is not None and before is not None and after["value"] != before["value"]


# --- acting -----------------------------------------------------------------------------------------


async def test_recovery_requests_approved_and_denied_as_the_operator(
        console: ConsoleService, browser: webdriver.Chrome, tmp_path: Path) -> None:
    acme = await tenant(console)
    approved_user, to_approve = await user_with_request(acme)
    denied_user, to_deny = await user_with_request(acme)
    async with kept_on_failure(browser, tmp_path / "failure"):
        await signed_in(browser, console, acme)
        await asyncio.to_thread(
            open_page, browser,
            f"{console.base_url}/console/recovery?project_id={acme.project.id}")
        rows = await asyncio.to_thread(
            lambda: [r.get_attribute("id") for r in browser.find_elements(By.CSS_SELECTOR,
                                                                          "tr[data-row]")])
        assert rows == [to_approve, to_deny]
        labels = await asyncio.to_thread(_labels, browser)
        assert all(labels.values()), labels
        assert await asyncio.to_thread(_click_in_row, browser, to_approve, "Approve",
                                       "called the user back") == "Approved."
        assert (await asyncio.to_thread(status_text, browser)).startswith("Approved.")
        assert await asyncio.to_thread(_click_in_row, browser, to_deny, "Deny") == "Denied."
        assert await asyncio.to_thread(console_log, browser) == []

    api = acme.project.api
    approved = (await api.get(f"/v1/recovery/requests/{to_approve}")).body
    assert (approved["status"], approved["decided_by"], approved["decision_note"]) == \
        ("approved", acme.operator_id, "called the user back")
    denied = (await api.get(f"/v1/recovery/requests/{to_deny}")).body
    assert (denied["status"], denied["decided_by"]) == ("denied", acme.operator_id)
    for action, target, user in (("recovery.request.approved", to_approve, approved_user),
                                 ("recovery.request.denied", to_deny, denied_user)):
        [evt] = await events(console.db, acme.project.id, action)
        assert (evt["actor_type"], evt["actor_id"], evt["target_id"], evt["user_id"]) == \
            ("operator", acme.operator_id, target, user), evt
        assert evt["api_key_id"] is None
    # The approval's own changes are the operator's too.
    [updated] = await events(console.db, acme.project.id, "user.updated")
    assert (updated["actor_type"], updated["actor_id"]) == ("operator", acme.operator_id)
    # The queue is empty now.
    await asyncio.to_thread(
        open_page, browser, f"{console.base_url}/console/recovery?project_id={acme.project.id}")
    main = await asyncio.to_thread(lambda: browser.find_element(By.ID, "main").text)
    assert "No request is waiting." in main


async def test_a_device_approved_in_the_console_gets_its_key(
        console: ConsoleService, browser: webdriver.Chrome, tmp_path: Path) -> None:
    acme = await tenant(console)
    r = await console.api.post("/v1/cli/device/code", {}, key=None)
    assert r.status == 200, r.body
    code = r.body
    async with kept_on_failure(browser, tmp_path / "failure"):
        await signed_in(browser, console, acme)
        await asyncio.to_thread(
            open_page, browser, f"{console.base_url}/console/devices?project_id={acme.project.id}")
        labels = await asyncio.to_thread(_labels, browser)
        assert labels == {"user_code": "Code shown by authio login"}, labels

        def approve() -> str:
            field = browser.find_element(By.ID, "user_code")
            field.send_keys(code["user_code"].lower().replace("-", ""))  # as people type it
            browser.find_element(By.ID, "approve").click()
            return status_text(browser)
        said = await asyncio.to_thread(approve)
        assert said.startswith(f"Approved {code['user_code']}: the tool is signed in to "
                               f"project {acme.project.id}"), said

    r = await console.api.post("/v1/cli/device/token", {
        "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
        "device_code": code["device_code"]}, key=None)
    assert r.status == 200, r.body
    assert r.body["project_id"] == acme.project.id
    assert (await console.api.with_key(r.body["access_token"]).get("/v1/users")).status == 200
    [approved] = await events(console.db, acme.project.id, "cli.device.approved")
    assert (approved["actor_type"], approved["actor_id"]) == ("operator", acme.operator_id)
    [created] = [e for e in await events(console.db, acme.project.id, "api_key.created")
                 if e["target_id"] == r.body["key_id"]]
    assert (created["actor_type"], created["actor_id"]) == ("operator", acme.operator_id)
    assert created["metadata"]["via"] == "device_authorization"


async def test_an_api_key_revoked_in_the_console_is_refused(
        console: ConsoleService, browser: webdriver.Chrome, tmp_path: Path) -> None:
    acme = await tenant(console)
    r = await acme.project.api.post("/v1/api-keys", {"prefix": "sk_live_", "name": "ci robot",
                                                     "scopes": ["users:read"]})
    assert r.status == 201, r.body
    doomed = r.body
    robot = console.api.with_key(doomed["secret"])
    assert (await robot.get("/v1/users")).status == 200
    async with kept_on_failure(browser, tmp_path / "failure"):
        await signed_in(browser, console, acme)
        await asyncio.to_thread(
            open_page, browser, f"{console.base_url}/console/api-keys?project_id={acme.project.id}")
        table = await asyncio.to_thread(lambda: browser.find_element(By.ID, doomed["id"]).text)
        assert "ci robot" in table and doomed["secret"][-4:] in table
        assert doomed["secret"] not in await asyncio.to_thread(lambda: browser.page_source)
        assert await asyncio.to_thread(_click_in_row, browser, doomed["id"], "Revoke") == "Revoked."

    async def refused() -> bool:
        return (await robot.get("/v1/users")).status == 401
    await eventually(refused, within=5, what="the revoked key refused")
    assert_error(await robot.get("/v1/users"), 401, "invalid_api_key")
    [evt] = await events(console.db, acme.project.id, "api_key.revoked")
    assert (evt["actor_type"], evt["actor_id"], evt["target_id"]) == \
        ("operator", acme.operator_id, doomed["id"])
    # The bootstrap key, which the page lists too, still works.
    assert (await acme.project.api.get("/v1/users")).status == 200


def _event_rows(driver: webdriver.Chrome) -> list[list[str]]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")
    return [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows]


async def test_the_audit_log_filters_and_exports(console: ConsoleService,
                                                 browser: webdriver.Chrome,
                                                 tmp_path: Path) -> None:
    acme = await tenant(console)
    user_id, _ = await user_with_request(acme)
    await user_with_request(acme)
    base = f"{console.base_url}/console/audit?project_id={acme.project.id}"
    async with kept_on_failure(browser, tmp_path / "failure"):
        await signed_in(browser, console, acme)
        await asyncio.to_thread(open_page, browser, base)
        everything = await asyncio.to_thread(_event_rows, browser)
        actions = {row[1] for row in everything}
        assert {"user.created", "recovery.request.created", "dashboard_operator.bootstrapped",
                "api_key.created"} <= actions, actions
        labels = await asyncio.to_thread(_labels, browser)
        assert set(labels) == {"f-type", "f-actor", "f-user", "f-from", "f-to", "f-q"}, labels
        assert all(labels.values()), labels

        def filter_by(**values: str) -> list[list[str]]:
            open_page(browser, base)
            for name, value in values.items():
                browser.find_element(By.ID, f"f-{name}").send_keys(value)
            browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
            WebDriverWait(browser, 10).until(
                lambda d: "type=" in d.current_url
                and d.execute_script("return document.readyState") == "complete")
            return _event_rows(browser)

        by_action = await asyncio.to_thread(filter_by, type="recovery.request.created")
        assert [row[1] for row in by_action] == ["recovery.request.created"] * 2, by_action
        by_user = await asyncio.to_thread(filter_by, user=user_id)
        assert {row[1] for row in by_user} == {"user.created", "recovery.request.created"}
        assert all(user_id in row[3] for row in by_user), by_user
        by_actor = await asyncio.to_thread(filter_by, actor=acme.project.key_id,
                                           type="recovery.request.created, user.created")
        assert len(by_actor) == 4 and all(acme.project.key_id in row[2] for row in by_actor)
        future = await asyncio.to_thread(filter_by, **{"from": "2999-01-01T00:00"})
        assert future == []
        assert "No event matches." in await asyncio.to_thread(
            lambda: browser.find_element(By.ID, "main").text)
        # A time the log cannot read is said on the page.
        await asyncio.to_thread(filter_by, to="yesterday")
        alert = await asyncio.to_thread(
            lambda: browser.find_element(By.CSS_SELECTOR, "[role=alert]").text)
        assert "ISO 8601" in alert, alert

        # The export link carries the filters; what it downloads is the log's own CSV.
        await asyncio.to_thread(filter_by, type="recovery.request.created")
        link = await asyncio.to_thread(
            lambda: browser.find_element(By.LINK_TEXT, "CSV").get_attribute("href"))
        assert link is not None and "type=recovery.request.created" in link
        got = await asyncio.to_thread(page_fetch, browser, "GET", link)
        assert got["status"] == 200, got
        table = list(csv.reader(io.StringIO(got["text"])))
        assert table[0] == ["id", "created_at", "action", "actor_type", "actor_id", "user_id",
                            "project_id", "target_type", "target_id", "ip", "user_agent",
                            "description"]
        assert [row[2] for row in table[1:]] == ["recovery.request.created"] * 2
        link = await asyncio.to_thread(
            lambda: browser.find_element(By.LINK_TEXT, "JSON lines").get_attribute("href"))
        got = await asyncio.to_thread(page_fetch, browser, "GET", str(link))
        lines = [orjson.loads(line) for line in got["text"].splitlines()]
        assert [line["action"] for line in lines] == ["recovery.request.created"] * 2
        assert await asyncio.to_thread(console_log, browser) == []
    # Not signed in, the export is not served.
    async with console.api.session.get(link, allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == "/console/sign-in"


# --- refusals -----------------------------------------------------------------------------------


async def test_a_removed_operators_session_stops_working(console: ConsoleService,
                                                         browser: webdriver.Chrome,
                                                         tmp_path: Path) -> None:
    acme = await tenant(console)
    _, pending = await user_with_request(acme)
    async with kept_on_failure(browser, tmp_path / "failure"):
        await signed_in(browser, console, acme)
        csrf = await asyncio.to_thread(csrf_of, browser)
        r = await acme.project.api.delete(f"/v1/operators/{acme.operator_id}")
        assert r.status == 204, r.body
        got = await asyncio.to_thread(
            page_fetch, browser, "POST",
            f"/console/recovery/{pending}/approve?project_id={acme.project.id}", {},
            {"X-CSRF-Token": csrf})
        assert got["status"] == 401, got
        assert orjson.loads(got["text"])["error"]["code"] == "no_session"
        await asyncio.to_thread(open_page, browser, f"{console.base_url}/console/recovery")
        assert (await asyncio.to_thread(lambda: browser.current_url)).endswith("/console/sign-in")
        # Its cookies are gone, and a new sign-in link is not sent.
        assert await asyncio.to_thread(browser.get_cookie, "authio_console") is None
        said = await asyncio.to_thread(request_link, browser, console.base_url,
                                       acme.operator_email)
        assert said == SENT.format(email=acme.operator_email)
    await asyncio.sleep(0.5)
    assert len([m for m in console.sink.to(acme.operator_email)
                if str(m.message["Subject"]).startswith("Your sign-in link")]) == 1
    assert (await acme.project.api.get(f"/v1/recovery/requests/{pending}")).body["status"] == \
        "pending"


async def test_actions_need_the_csrf_token_and_this_origin(console: ConsoleService,
                                                           browser: webdriver.Chrome,
                                                           tmp_path: Path) -> None:
    acme = await tenant(console)
    _, pending = await user_with_request(acme)
    approve = f"/console/recovery/{pending}/approve?project_id={acme.project.id}"
    async with kept_on_failure(browser, tmp_path / "failure"):
        await signed_in(browser, console, acme)
        csrf = await asyncio.to_thread(csrf_of, browser)
        for headers in ({}, {"X-CSRF-Token": "x" + csrf[1:]}):
            got = await asyncio.to_thread(page_fetch, browser, "POST", approve, {}, headers)
            assert got["status"] == 403, got
            error = orjson.loads(got["text"])["error"]
            assert (error["code"], error["details"]["reason"]) == ("forbidden", "csrf")
        assert (await acme.project.api.get(f"/v1/recovery/requests/{pending}")).body[
            "status"] == "pending"
        cookies = {c["name"]: c["value"] for c in await asyncio.to_thread(browser.get_cookies)}

    # The cookies and the right token, from another origin: refused before anything else.
    jar = "; ".join(f"{k}={v}" for k, v in cookies.items())
    async with console.api.session.post(
            console.base_url + approve, json={}, headers={
                "Cookie": jar, "X-CSRF-Token": csrf, "Origin": "https://evil.example",
                "Sec-Fetch-Site": "cross-site"}) as r:
        body = await r.json()
        assert r.status == 403 and body["error"]["details"]["reason"] == "cross_origin", body
    # Another tenant's project is not the operator's to act in.
    other = await tenant(console, "other")
    got = await asyncio.to_thread(
        page_fetch, browser, "POST",
        f"/console/recovery/{pending}/approve?project_id={other.project.id}", {},
        {"X-CSRF-Token": csrf})
    assert got["status"] == 404, got
    # With the token, from the page, the same call goes through.
    got = await asyncio.to_thread(page_fetch, browser, "POST", approve, {}, {"X-CSRF-Token": csrf})
    assert got["status"] == 200, got
    assert orjson.loads(got["text"])["decided_by"] == acme.operator_id


# --- how fast the pages are ready ------------------------------------------------------------


async def test_console_pages_become_interactive(console: ConsoleService,
                                                browser: webdriver.Chrome, tmp_path: Path,
                                                record_property: Any) -> None:
    """The time to ``domInteractive`` of each page, loaded ten times after one warm-up (issue
    23's figure is under 300 ms locally; measured and reported here, not asserted: timing
    depends on the machine). Printed, and recorded as the test's properties."""
    acme = await tenant(console)
    for _ in range(5):
        await user_with_request(acme)
    pid = acme.project.id
    async with kept_on_failure(browser, tmp_path / "failure"):
        await signed_in(browser, console, acme)
        figures: dict[str, list[float]] = {}
        for path in ("/console/sign-in", "/console/recovery", "/console/devices",
                     "/console/api-keys", "/console/audit"):
            url = f"{console.base_url}{path}?project_id={pid}" if path != "/console/sign-in" \
                else f"{console.base_url}{path}"

            def measure(url: str = url) -> list[float]:
                open_page(browser, url)
                out = []
                for _ in range(10):
                    open_page(browser, url)
                    out.append(dom_interactive(browser))
                return out
            figures[path] = await asyncio.to_thread(measure)
    for path, values in figures.items():
        line = (f"{path}: domInteractive median {statistics.median(values):.0f} ms, "
                f"max {max(values):.0f} ms over {len(values)} loads")
        print(line)
        record_property(path, line)
    assert all(v > 0 for values in figures.values() for v in values)

