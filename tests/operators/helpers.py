"""The operator console in a real browser: a service of its own that mails through a real SMTP
server (aiosmtpd, tests/fixtures/peers.py) with ``SERVICE_BASE_URL`` naming its own port, so the
links it mails are the ones the browser opens, and headless Chromium driving its pages.

Selenium is synchronous: the browser helpers here are plain functions the tests run in a thread
(``asyncio.to_thread``), so the service, on the test's event loop, keeps answering.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from common.db import create_pool
from control_plane.risk import service as risk
from control_plane.risk.schemas import PolicyBody
from control_plane.web.actor import system_actor
from tests.fixtures.peers import SmtpSink
from tests.fixtures.service import BOOTSTRAP_TOKEN, Api, Project

SENT = "If {email} is an operator's address, a sign-in link is on its way. It expires in 15 minutes."
LINK_RE = re.compile(r"https?://\S+/v1/auth/magic-link/verify\?\S+#token=\S+")
SIGN_IN_SUBJECT = "Your sign-in link for "
FIREFOX_WINDOWS = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 "
                   "Firefox/133.0")
"""Another device than headless Chromium, to the risk engine."""


@dataclass
class ConsoleService:
    """The service the console tests use, the SMTP server it mails through, and its database."""

    api: Api
    sink: SmtpSink
    db: asyncpg.Pool

    @property
    def base_url(self) -> str:
        return self.api.base_url


@dataclass
class Tenant:
    """A tenant bootstrapped with its first operator."""

    project: Project
    operator_id: str
    operator_email: str


async def tenant(console: ConsoleService, name: str = "acme") -> Tenant:
    """A new tenant, its project and full-access key, and its first operator."""
    address = f"op-{secrets.token_hex(5)}@example.com"
    r = await console.api.post(
        "/v1/bootstrap", {"tenant_name": name.title(), "project_name": name,
                          "environment": "test", "operator_email": address},
        headers={"x-service-bootstrap-token": BOOTSTRAP_TOKEN}, key=None)
    assert r.status == 201, r.body
    key = r.body["api_key"]["secret"]
    project = Project(r.body["project"]["id"], r.body["tenant"]["id"], key,
                      r.body["api_key"]["id"], console.api.with_key(key))
    return Tenant(project, r.body["operator"]["id"], address)


def mail_text(console: ConsoleService, destination: str, subject: str) -> list[str]:
    """The plain-text bodies of the messages to ``destination`` whose subject starts with
    ``subject``, oldest first."""
    out = []
    for received in console.sink.to(destination):
        message = received.message
        if str(message["Subject"]).startswith(subject):
            part = message.get_body(preferencelist=("plain",))
            assert part is not None
            out.append(str(part.get_content()))  # type: ignore[attr-defined]
    return out


async def mailed_link(console: ConsoleService, destination: str, *, count: int = 1,
                      subject: str = SIGN_IN_SUBJECT) -> str:
    """The link of the ``count``-th message to ``destination`` of that subject, once it came."""
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        texts = mail_text(console, destination, subject)
        if len(texts) >= count:
            found = LINK_RE.search(texts[count - 1])
            assert found, texts[count - 1]
            return found.group(0)
        assert asyncio.get_running_loop().time() < deadline, \
            f"{len(texts)} of {count} message(s) {subject!r} to {destination} arrived"
        await asyncio.sleep(0.05)


async def challenge_new_devices(console_db: str, project_id: str) -> None:
    """Set the operator project ``project_id``'s risk policy: challenge at 10, block at 90,
    every signal at its default weight, so a sign-in from a device the operator has not used
    (``new_device``, 15) is challenged. The operator project has no API key, so no
    ``PUT /v1/risk/policy`` reaches it: this runs what that route runs
    (``risk.service.set_policy``), on a pool with the service's codecs."""
    actor = dataclasses.replace(system_actor("console_test"), project_id=project_id)
    pool = await create_pool(console_db, max_size=1)
    try:
        async with pool.acquire() as conn:
            await risk.set_policy(conn, actor, body=PolicyBody.model_validate(
                {"threshold_challenge": 10, "threshold_block": 90}))
    finally:
        await pool.close()


# --- the browser ----------------------------------------------------------------------------------


def console_log(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """The browser console's errors and warnings since the last call (a script error, a CSP
    violation)."""
    get_log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # untyped in selenium
    return [e for e in get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def fresh(driver: webdriver.Chrome) -> None:
    """An empty cookie jar and a blank page (the browser is shared by the run's tests)."""
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    console_log(driver)


def status_text(driver: webdriver.Chrome) -> str:
    """The page's live region once it settled (not empty, not ending with an ellipsis)."""
    def settled(d: Any) -> str | None:
        text = str(d.find_element(By.ID, "status").text)
        return text if text and not text.endswith("…") and text != \
            "Press the button to finish signing in." else None
    return str(WebDriverWait(driver, 20).until(settled))


def request_link(driver: webdriver.Chrome, base_url: str, address: str) -> str:
    """Ask the sign-in page for a link to ``address``; what the page then says."""
    driver.get(f"{base_url}/console/sign-in")
    field = driver.find_element(By.ID, "email")
    field.clear()
    field.send_keys(address)
    driver.find_element(By.ID, "send").click()
    return status_text(driver)


def follow_link(driver: webdriver.Chrome, link: str) -> str:
    """Open a mailed link (landing on the console's own page) and press its button; the URL
    the browser ends on."""
    driver.get(link)
    WebDriverWait(driver, 10).until(lambda d: "/console/verify" in d.current_url)
    driver.find_element(By.ID, "signin").click()

    def arrived(d: Any) -> bool:
        path, said = d.execute_script(
            'return [location.pathname, (document.getElementById("status") || {}).textContent'
            ' || ""]')
        if path == "/console/recovery":
            return d.execute_script("return document.readyState") == "complete"
        # A refusal stays on the page and says so.
        return said not in ("", "Signing in…", "Press the button to finish signing in.") \
            and not said.startswith("Signed in as ")

    # The page goes away while it is read (the browser navigates): it is read again.
    WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(arrived)
    return str(driver.current_url)


async def signed_in(driver: webdriver.Chrome, console: ConsoleService, who: Tenant, *,
                    count: int = 1) -> str:
    """Sign ``who``'s operator in through the pages, from an empty cookie jar: the sign-in page
    sends the ``count``-th link, the browser follows it. The URL it ends on."""
    await asyncio.to_thread(fresh, driver)
    said = await asyncio.to_thread(request_link, driver, console.base_url, who.operator_email)
    assert said == SENT.format(email=who.operator_email), said
    link = await mailed_link(console, who.operator_email, count=count)
    return str(await asyncio.to_thread(follow_link, driver, link))


def open_page(driver: webdriver.Chrome, url: str) -> None:
    driver.get(url)
    WebDriverWait(driver, 10).until(
        lambda d: d.execute_script("return document.readyState") == "complete")


def dom_interactive(driver: webdriver.Chrome) -> float:
    """Milliseconds from the navigation's start to ``domInteractive`` (Navigation Timing 2):
    the page parsed and its script run, ready for input."""
    value = driver.execute_script(
        'return performance.getEntriesByType("navigation")[0].domInteractive')
    return float(value)


FETCH = """
const [method, path, body, headers] = Array.prototype.slice.call(arguments, 0, 4);
const done = arguments[arguments.length - 1];
fetch(path, {method, credentials: "same-origin",
             headers: {"Content-Type": "application/json", ...headers},
             body: body === null || method === "GET" ? undefined : JSON.stringify(body)})
  .then(async (r) => done({status: r.status, text: await r.text()}))
  .catch((e) => done({status: 0, text: String(e)}));
"""


def page_fetch(driver: webdriver.Chrome, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None) -> dict[str, Any]:
    """A request from the page itself (its cookies, its origin): ``{status, text}``."""
    result: dict[str, Any] = driver.execute_async_script(FETCH, method, path, body, headers or {})
    return result


def csrf_of(driver: webdriver.Chrome) -> str:
    return str(driver.execute_script(
        'return document.querySelector(\'meta[name="csrf-token"]\').content'))


# --- passkeys (the virtual authenticator: tests.fixtures.browser) ---------------------------------


def add_passkey(driver: webdriver.Chrome, base_url: str, name: str) -> str:
    """On the console's passkeys page (signed in), add a passkey named ``name``; what the page
    said."""
    open_page(driver, f"{base_url}/console/passkeys")
    driver.find_element(By.ID, "passkey-name").send_keys(name)
    driver.find_element(By.ID, "add").click()
    # Added, the page reloads to list the passkey and says so; refused, it says why.
    def settled(d: Any) -> str | None:
        text = str(d.find_element(By.ID, "status").text)
        return text if text and not text.endswith("…") else None
    return str(WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(settled))


def passkey_sign_in(driver: webdriver.Chrome, base_url: str) -> str:
    """On the console's sign-in page, sign in with a passkey (no address: the authenticator
    offers its passkeys of the service): the path the browser ends on when it left the page,
    else what the page said."""
    driver.get(f"{base_url}/console/sign-in")
    driver.find_element(By.ID, "passkey").click()

    def settled(d: Any) -> str | None:
        path, said = d.execute_script(
            'return [location.pathname, (document.getElementById("status") || {}).textContent'
            ' || ""]')
        if path != "/console/sign-in":
            return str(path) if d.execute_script("return document.readyState") == "complete" \
                else None
        return said if said and not said.endswith("…") and not said.startswith("Signed in as") \
            else None
    return str(WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(settled))


CEREMONIES = """
const [project, accessToken] = arguments;
const done = arguments[arguments.length - 1];
async function call(path, body, token) {
  const headers = {"Content-Type": "application/json"};
  if (token) headers.Authorization = "Bearer " + token;
  const r = await fetch(path, {method: "POST", credentials: "omit", headers,
                               body: JSON.stringify(body)});
  return {status: r.status, body: await r.json()};
}
(async () => {
  const out = {};
  const q = "?" + new URLSearchParams({project_id: project});
  if (accessToken) {
    const options = await call("/v1/auth/passkey/register/options", {name: "Mine"}, accessToken);
    const created = await navigator.credentials.create(
      {publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(options.body)});
    out.registered = await call("/v1/auth/passkey/register/verify", created.toJSON(), accessToken);
  }
  const options = await call("/v1/auth/passkey/login/options" + q, {});
  const got = await navigator.credentials.get(
    {publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options.body)});
  out.login = await call("/v1/auth/passkey/login/verify" + q, got.toJSON());
  if (out.login.status === 200) {
    out.console = await call("/console/session", {access_token: out.login.body.access_token,
                                                  refresh_token: out.login.body.refresh_token});
  }
  return out;
})().then(done, (err) => done({error: String(err)}));
"""


def ceremonies(driver: webdriver.Chrome, project_id: str,
               access_token: str | None) -> dict[str, Any]:
    """From the current page: register a passkey for the user of ``access_token`` (when
    given) with the public passkey endpoints of ``project_id``, then log in with a passkey
    there (usernameless) and hand the tokens to ``POST /console/session``. Each answer
    (``registered``, ``login``, ``console``: ``{status, body}``), or ``error``."""
    result: dict[str, Any] = driver.execute_async_script(CEREMONIES, project_id,
                                                         access_token or "")
    return result


def pretend(driver: webdriver.Chrome, user_agent: str | None) -> None:
    """From now on the browser says it is ``user_agent`` (its requests' User-Agent, without
    client hints: another device to the risk engine); None: itself again."""
    driver.execute_cdp_cmd("Emulation.setUserAgentOverride", {"userAgent": user_agent or ""})


def step_up_buttons(driver: webdriver.Chrome) -> dict[str, bool]:
    """Which step-up buttons the page shows (``step-up-passkey``, ``step-up-link``)."""
    return {name: driver.find_element(By.ID, name).is_displayed()
            for name in ("step-up-passkey", "step-up-link")}


def left_for(driver: webdriver.Chrome, path: str) -> str:
    """Wait until the browser is on ``path`` with the page loaded; its path (else a timeout)."""
    def arrived(d: Any) -> str | None:
        at, state = d.execute_script("return [location.pathname, document.readyState]")
        return str(at) if at == path and state == "complete" else None
    return str(WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(arrived))
