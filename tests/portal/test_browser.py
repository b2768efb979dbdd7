"""The admin portal in a real browser (headless Chromium, tests/fixtures/browser.py), as an IT
administrator lives it: the link opens the page, which drops the token from its address, and the
page verifies a domain against the local DNS server (tests/fixtures/dns.py) or mints the SCIM
token, shown once. The page is held to its promises: a label for every field, the focus where
the next step is, the Tab order, no console error (a CSP violation would be one), a reload that
resumes the session, and a used link answered by a page that says so.

When a test fails, a screenshot of the page and its HTML are kept in the test's ``tmp_path``
(the path is printed). How fast the page becomes interactive is measured and printed (run with
``-s`` to see it), never asserted: a loaded machine would fail it for nothing.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from tests.fixtures.browser import kept_on_failure
from tests.fixtures.database import events
from tests.fixtures.dns import Zone
from tests.fixtures.identity import make_org
from tests.fixtures.service import Api, Project
from tests.portal.helpers import domain, make_link

TIMING = """
const nav = performance.getEntriesByType("navigation")[0];
return {interactive: nav.domInteractive, content_loaded: nav.domContentLoadedEventEnd,
        ready: Number(document.documentElement.dataset.ready)};
"""


def _console(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """The console entries since the last call (errors, CSP violations, warnings)."""
    get_log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # untyped in selenium
    return [e for e in get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def _active(driver: webdriver.Chrome) -> str:
    return str(driver.execute_script("return document.activeElement && document.activeElement.id"))


def _text(driver: webdriver.Chrome, ident: str) -> str:
    return str(driver.find_element(By.ID, ident).text)


def _value(driver: webdriver.Chrome, ident: str) -> str:
    return str(driver.find_element(By.ID, ident).get_attribute("value"))


def _open(driver: webdriver.Chrome, url: str) -> dict[str, float]:
    """Load ``url`` afresh (no cookie), wait until the script has the portal's state; its
    timings in milliseconds since the navigation started."""
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    _console(driver)
    driver.get(url)
    WebDriverWait(driver, 15).until(
        lambda d: d.execute_script("return document.documentElement.dataset.ready"))
    timing: dict[str, float] = driver.execute_script(TIMING)
    return timing


def _wait_status(driver: webdriver.Chrome, *starts: str) -> str:
    def settled(d: Any) -> str | None:
        text = str(d.find_element(By.ID, "status").text)
        return text if text.startswith(starts) else None
    return str(WebDriverWait(driver, 20).until(settled))


def _labels(driver: webdriver.Chrome) -> dict[str, str]:
    """Each visible input's id and the text of its ``label[for]``."""
    out = {}
    for field in driver.find_elements(By.TAG_NAME, "input"):
        if not field.is_displayed():
            continue
        ident = str(field.get_attribute("id"))
        found = driver.find_elements(By.CSS_SELECTOR, f"label[for='{ident}']")
        out[ident] = str(found[0].text) if found else ""
    return out


def _tab_order(driver: webdriver.Chrome, start: str, count: int) -> list[str]:
    driver.execute_script("document.getElementById(arguments[0]).focus()", start)
    order = [_active(driver)]
    for _ in range(count):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        order.append(_active(driver))
    return order


def _print_timing(what: str, timing: dict[str, float]) -> None:
    print(f"\nportal page ({what}): interactive (domInteractive) {timing['interactive']:.0f} ms, "
          f"DOMContentLoaded end {timing['content_loaded']:.0f} ms, state shown (script ready) "
          f"{timing['ready']:.0f} ms after the navigation started", file=sys.stderr)


def _verify_domain_in_page(driver: webdriver.Chrome, url: str, name: str,
                           zone: Zone) -> dict[str, Any]:
    seen: dict[str, Any] = {"timing": _open(driver, url)}
    seen["url"] = driver.current_url
    seen["title"] = _text(driver, "title")
    seen["focused_on_load"] = _active(driver)
    seen["labels"] = _labels(driver)
    seen["tab_order"] = _tab_order(driver, "domain", 1)
    driver.find_element(By.ID, "domain").send_keys(name)
    driver.find_element(By.ID, "add-domain").click()
    seen["claimed"] = _wait_status(driver, "Publish the TXT record", "Could not", "Enter")
    seen["record"] = (_value(driver, "record-name"), _value(driver, "record-value"))
    seen["focused_after_claim"] = _active(driver)
    seen["record_labels"] = _labels(driver)
    driver.find_element(By.ID, "verify").click()
    seen["missing"] = _wait_status(driver, "No TXT record", f"{name} is verified", "The DNS")
    zone.publish(*seen["record"])
    driver.find_element(By.ID, "verify").click()
    seen["verified"] = _wait_status(driver, f"{name} is verified", "No TXT record", "TXT records",
                                    "The DNS")
    seen["list"] = _text(driver, "domains")
    seen["console"] = _console(driver)
    # A reload resumes the session from its cookie (the token is gone from the address).
    driver.refresh()
    WebDriverWait(driver, 15).until(
        lambda d: d.execute_script("return document.documentElement.dataset.ready"))
    seen["after_reload"] = _text(driver, "domains")
    seen["reload_status"] = _text(driver, "status")
    # The link itself is spent: opening it again shows a page that says so.
    driver.get(url)
    seen["reopened_heading"] = str(driver.find_element(By.TAG_NAME, "h1").text)
    seen["reopened_console"] = _console(driver)
    return seen


async def test_an_it_admin_verifies_a_domain_in_the_portal(
        portal_service: Api, portal_project: Project, browser: webdriver.Chrome, zone: Zone,
        db: asyncpg.Pool, tmp_path: Path) -> None:
    org = await make_org(portal_project)
    link = await make_link(portal_project, org["id"], "domain_verification")
    name = domain()
    async with kept_on_failure(browser, tmp_path / "failure"):
        seen = await asyncio.to_thread(_verify_domain_in_page, browser, link["link"], name, zone)
        _print_timing("domain verification", seen["timing"])
        assert seen["url"] == f"{portal_service.base_url}/portal"  # the token left the address
        assert seen["title"] == f"Set up {org['name']}"
        assert seen["focused_on_load"] == "domain"
        assert seen["labels"] == {"domain": "Domain"}
        assert seen["tab_order"] == ["domain", "add-domain"]
        assert seen["claimed"].startswith(f"Publish the TXT record for {name}"), seen["claimed"]
        assert seen["record"][0] == f"_authio-verification.{name}"
        assert seen["record"][1].startswith("authio-domain-verification=")
        assert seen["focused_after_claim"] == "verify"
        assert seen["record_labels"] == {"domain": "Domain", "record-name": "Name (host)",
                                         "record-value": "Value"}
        assert seen["missing"].startswith("No TXT record was found"), seen["missing"]
        assert seen["verified"] == f"{name} is verified.", seen["verified"]
        assert name in seen["list"] and "Verified" in seen["list"], seen["list"]
        assert seen["console"] == [], seen["console"]  # no script error, no CSP violation
        assert name in seen["after_reload"] and "Verified" in seen["after_reload"]
        assert seen["reload_status"] == ""
        assert seen["reopened_heading"] == "This setup link was already used"
        # Only the page's own status is reported (its style sheet loads under the CSP).
        [gone] = seen["reopened_console"]
        assert gone["source"] == "network" and "status of 410" in gone["message"], gone

    updated = await events(db, portal_project.id, "organization.updated")
    assert [(e["metadata"]["domain"], e["metadata"]["domain_status"]) for e in updated] == [
        (name, "pending"), (name, "verified")]
    assert {(e["actor_type"], e["actor_id"]) for e in updated} == {("portal", link["id"])}



def _mint_in_page(driver: webdriver.Chrome, url: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"timing": _open(driver, url)}
    seen["focused_on_load"] = _active(driver)
    seen["secret_shown_before"] = driver.find_element(By.ID, "scim-secret").is_displayed()
    seen["status_before"] = _text(driver, "scim-status")
    driver.find_element(By.ID, "mint").click()
    seen["minted"] = _wait_status(driver, "Token generated", "Could not", "This admin portal")
    seen["token"] = _value(driver, "scim-token")
    seen["base_url"] = _value(driver, "scim-base-url")
    seen["focused_after_mint"] = _active(driver)
    seen["labels"] = _labels(driver)
    seen["status_after"] = _text(driver, "scim-status")
    seen["console"] = _console(driver)
    driver.refresh()  # the token is shown once: a reload shows that one exists, not the token
    WebDriverWait(driver, 15).until(
        lambda d: d.execute_script("return document.documentElement.dataset.ready"))
    seen["secret_shown_after_reload"] = driver.find_element(By.ID, "scim-secret").is_displayed()
    seen["token_after_reload"] = _value(driver, "scim-token")
    seen["status_after_reload"] = _text(driver, "scim-status")
    seen["mint_label_after_reload"] = _text(driver, "mint")
    return seen


async def test_an_it_admin_sees_the_scim_token_once(
        portal_service: Api, portal_project: Project, browser: webdriver.Chrome,
        db: asyncpg.Pool, tmp_path: Path) -> None:
    org = await make_org(portal_project)
    link = await make_link(portal_project, org["id"], "scim")
    async with kept_on_failure(browser, tmp_path / "failure"):
        seen = await asyncio.to_thread(_mint_in_page, browser, link["link"])
        _print_timing("SCIM", seen["timing"])
        assert seen["focused_on_load"] == "mint"
        assert not seen["secret_shown_before"]
        assert "Token\nnone yet" in seen["status_before"], seen["status_before"]
        assert seen["minted"].startswith("Token generated."), seen["minted"]
        assert seen["token"].startswith("scim_")
        assert seen["base_url"] == f"{portal_service.base_url}/scim/v2"
        assert seen["focused_after_mint"] == "scim-token"
        assert seen["labels"] == {"scim-base-url": "SCIM base URL", "scim-token": "Bearer token"}
        assert "Token\ngenerated" in seen["status_after"], seen["status_after"]
        assert seen["console"] == [], seen["console"]
        assert not seen["secret_shown_after_reload"] and seen["token_after_reload"] == ""
        assert "Token\ngenerated" in seen["status_after_reload"]
        assert seen["mint_label_after_reload"] == "Generate a new SCIM token"

    # The token the page showed is the organization's: a directory can use it.
    r = await portal_service.with_key(seen["token"]).get("/scim/v2/Users")
    assert r.status == 200 and r.body["totalResults"] == 0, r.body
    [event] = await events(db, portal_project.id, "scim.token.created")
    assert (event["actor_type"], event["actor_id"]) == ("portal", link["id"])

def _open_many(driver: webdriver.Chrome, urls: list[str]) -> list[dict[str, Any]]:
    seen = []
    for url in urls:
        timing = _open(driver, url)
        seen.append({**timing, "title": _text(driver, "title"), "console": _console(driver)})
    return seen


async def test_how_fast_the_page_is_interactive(portal_service: Api, portal_project: Project,
                                                browser: webdriver.Chrome,
                                                tmp_path: Path) -> None:
    """Issue 23's figure, "interactive in under 300 ms locally": several fresh links opened one
    after the other (each a new setup token consumed, a new session), measured from the
    navigation's start to ``domInteractive`` and to the state shown by the script. Printed, not
    asserted; the test holds every page to having loaded its state without a console error."""
    org = await make_org(portal_project)
    links = [(await make_link(portal_project, org["id"]))["link"] for _ in range(7)]
    async with kept_on_failure(browser, tmp_path / "failure"):
        seen = await asyncio.to_thread(_open_many, browser, links)
        for page in seen:
            assert page["title"] == f"Set up {org['name']}" and page["console"] == [], page
    for key in ("interactive", "ready"):
        values = sorted(page[key] for page in seen)
        print(f"\nportal page, {len(values)} fresh links: {key} min {values[0]:.0f} ms, median "
              f"{values[len(values) // 2]:.0f} ms, max {values[-1]:.0f} ms "
              f"({', '.join(f'{v:.0f}' for v in (page[key] for page in seen))})", file=sys.stderr)
