"""``authio login`` end to end as an operator lives it: the command runs in a real terminal
(a detached ``tmux`` session, its screen read with ``capture-pane``), and the approval page it
names is opened in a real browser (headless Chromium, tests/fixtures/browser.py).

The operator reads the code and the link on the terminal, opens the link, finds the code filled
in, pastes their project's full-access key and presses Approve (or Deny); the terminal then says
it signed in (the credentials file written, mode 0600) or that the login was denied (exit
status 1). The page is also held to its accessibility promises: a label for every field, and
Tab going from the code to the key to Approve to Deny.

The service runs here with ``SERVICE_BASE_URL`` set to its own address, so the link the
terminal shows is the one the browser opens, unchanged. Debian's ``tmux`` is installed when
missing, as the browser tests install Chromium (:mod:`tests.fixtures.installs`). When a test
fails, a screenshot of the page, its HTML and the terminal's screen are kept in the test's
``tmp_path`` (the path is printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from aiohttp import ClientSession
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from common.settings import Settings
from devtools import DevServicesError
from tests.fixtures.browser import kept_on_failure
from tests.fixtures.installs import debian_packages
from tests.fixtures.service import Api, Project, eventually, serving_public
from tests.imports.helpers import AUTHIO, cli_env, text_and_mode

KEY_LABEL = "Your project's full-access API key"
CODE = re.compile(r"enter the code ([A-Z]{4}-[A-Z]{4})")
LINK = re.compile(r"\(or open (\S+)\)")
DENIED = "authio login: the login was denied on the approval page"
EXIT_STATUS = re.compile(r"^\[exit status (\d+)\]$", re.MULTILINE)
"""What the shell in the pane writes once the command has exited. tmux's own
``#{pane_dead_status}`` is not used: tmux 3.3a can mark the pane dead (its terminal closed)
before it has reaped the process, and then never shows the status (tmux/tmux#4841)."""


# --- a real terminal ---------------------------------------------------------------------------


def ensure_tmux() -> str:
    """The path of ``tmux``, installing Debian's ``tmux`` when missing; fails the test when that
    is impossible or fails."""
    try:
        debian_packages(["tmux"], present=lambda: shutil.which("tmux") is not None,
                        needed_by="the terminal tests")
    except DevServicesError as exc:
        pytest.fail(str(exc), pytrace=False)
    found = shutil.which("tmux")
    assert found is not None
    return found


@dataclass
class Terminal:
    """One detached tmux session on a tmux server of its own (``-S socket``), 200x50, whose
    pane stays on screen after its command exits (``remain-on-exit``)."""

    tmux: str
    socket: str
    name: str

    async def run(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.tmux, "-S", self.socket, *args, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, (args, err.decode())
        return out.decode()

    async def screen(self) -> str:
        """What the pane shows, wrapped lines joined."""
        return await self.run("capture-pane", "-p", "-J", "-t", self.name)

    async def keep_screen(self, where: Path) -> str:
        """Keep the screen as ``where/terminal.txt`` (for ``kept_on_failure``)."""
        (where / "terminal.txt").write_text(await self.screen())
        return "the terminal (terminal.txt)"

    async def shows(self, text: str, *, within: float = 30.0) -> str:
        """The screen once it shows ``text``; fails the test after ``within`` seconds."""
        async def probe() -> str | None:
            screen = await self.screen()
            return screen if text in screen else None
        shown: str = await eventually(probe, within=within, what=f"the terminal to show {text!r}")
        return shown

    async def exited(self, *, within: float = 15.0) -> int:
        """The command's exit status, once the shell has written it (:data:`EXIT_STATUS`);
        fails the test after ``within`` seconds."""
        screen = await self.shows("[exit status ", within=within)
        status = EXIT_STATUS.search(screen)
        assert status is not None, screen
        return int(status[1])


@contextlib.asynccontextmanager
async def terminal(tmp_path: Path, command: list[str], env: dict[str, str]) -> AsyncIterator[Terminal]:
    """``command`` running in a new tmux session (module docstring), its exit status written
    after it (:data:`EXIT_STATUS`); the tmux server is killed on exit. Its socket lives in a
    short directory of its own (a socket path must be short)."""
    tmux = ensure_tmux()
    conf = tmp_path / "tmux.conf"
    conf.write_text("set-option -g remain-on-exit on\nset-option -g history-limit 2000\n")
    home = Path(tempfile.mkdtemp(prefix="authio-tmux-"))
    term = Terminal(tmux, str(home / "socket"), "login")
    line = f'{shlex.join(command)}; echo "[exit status $?]"'
    try:
        proc = await asyncio.create_subprocess_exec(
            tmux, "-S", term.socket, "-f", str(conf), "new-session", "-d", "-x", "200", "-y",
            "50", "-s", term.name, line, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, f"tmux new-session failed: {err.decode()}"
        yield term
    finally:  # the server's end hangs the command up if it still runs
        with contextlib.suppress(AssertionError, OSError, TimeoutError):
            await term.run("kill-server")
        shutil.rmtree(home, ignore_errors=True)


def login_command(config: Path, base_url: str) -> list[str]:
    """``authio login`` as typed at a shell whose configuration lives in ``config``."""
    return ["env", f"XDG_CONFIG_HOME={config}", f"HOME={config}", "NO_COLOR=1",
            AUTHIO, "login", "--base-url", base_url, "--no-browser"]


async def code_and_link(term: Terminal) -> tuple[str, str]:
    """The user code and ``verification_uri_complete`` the terminal shows."""
    screen = await term.shows("(or open ", within=20)
    code, link = CODE.search(screen), LINK.search(screen)
    assert code is not None and link is not None, screen
    return code[1], link[1]


# --- the service at its public address ---------------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def public_service(settings_factory: Callable[..., Settings],
                         http: ClientSession) -> AsyncIterator[Api]:
    """The whole service on a loopback port with ``SERVICE_BASE_URL`` naming that port, so the
    links it gives (``verification_uri_complete``) lead to it."""
    async with serving_public(http, settings_factory) as api:
        yield api


# --- the approval page in the browser ------------------------------------------------------------


@dataclass
class Page:
    code_value: str
    focused_on_load: str
    labels: dict[str, str]
    tab_order: list[str]
    status: str
    console: list[dict[str, Any]]


def _console(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """The console entries since the last call (errors, CSP violations, warnings)."""
    get_log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # untyped in selenium
    return [e for e in get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def _active(driver: webdriver.Chrome) -> str:
    return str(driver.execute_script("return document.activeElement && document.activeElement.id"))


def _decide(driver: webdriver.Chrome, url: str, key: str, button: str) -> Page:
    """Open ``url`` afresh, read the fields' labels and the Tab order, paste ``key`` into the key
    field and press ``button`` (``approve`` or ``deny``); the page once its status settles."""
    driver.get("about:blank")
    _console(driver)  # drop what earlier pages logged
    driver.get(url)
    WebDriverWait(driver, 10).until(
        lambda d: d.execute_script("return document.readyState") == "complete")
    code_field = driver.find_element(By.ID, "user_code")
    focused_on_load = _active(driver)
    labels = {}
    for field in driver.find_elements(By.TAG_NAME, "input"):
        ident = field.get_attribute("id") or ""
        found = driver.find_elements(By.CSS_SELECTOR, f"label[for='{ident}']") if ident else []
        labels[ident or field.get_attribute("outerHTML") or "?"] = found[0].text if found else ""
    driver.execute_script("arguments[0].focus()", code_field)
    order = [_active(driver)]
    for _ in range(3):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        order.append(_active(driver))
    code_value = str(code_field.get_attribute("value"))
    driver.find_element(By.ID, "api_key").send_keys(key)
    driver.find_element(By.ID, button).click()

    def settled(d: Any) -> str | None:
        text = str(d.find_element(By.ID, "status").text)
        return text if text and not text.endswith("…") else None
    status = str(WebDriverWait(driver, 20).until(settled))
    return Page(code_value, focused_on_load, labels, order, status, _console(driver))


def _page_checks(page: Page, code: str) -> None:
    """What holds on the page whatever the operator decides."""
    assert page.code_value == code  # filled in from the link
    assert page.focused_on_load == "api_key"  # the code is there: the key is what is missing
    assert set(page.labels) == {"user_code", "api_key"}, page.labels
    assert all(page.labels.values()), page.labels  # every field has its label[for]
    assert page.labels["api_key"] == KEY_LABEL
    assert page.tab_order == ["user_code", "api_key", "approve", "deny"]
    assert page.console == [], page.console  # no script error, no CSP violation


# --- the tests ------------------------------------------------------------------------------------


async def test_login_approved_in_the_browser(public_service: Api, project: Project,
                                             browser: webdriver.Chrome, tmp_path: Path) -> None:
    config = tmp_path / "config"
    async with terminal(tmp_path, login_command(config, public_service.base_url),
                        cli_env(config)) as term, \
            kept_on_failure(browser, tmp_path / "failure", also=term.keep_screen):
        code, link = await code_and_link(term)
        assert link == f"{public_service.base_url}/device?{urlencode({'user_code': code})}"
        page = await asyncio.to_thread(_decide, browser, link, project.key, "approve")
        _page_checks(page, code)
        assert page.status.startswith("Approved."), page.status
        assert f"project {project.id}" in page.status, page.status

        await term.shows(f"Signed in to project {project.id}")
        assert await term.exited() == 0, await term.screen()
        text, mode = text_and_mode(config / "authio" / "credentials")
        assert mode == 0o600
        assert f"project_id = {project.id}" in text
        key = re.search(r"api_key = (\S+)", text)
        assert key is not None and key[1].startswith("sk_live_")
        assert (await public_service.with_key(key[1]).get("/v1/users")).status == 200


async def test_login_denied_in_the_browser(public_service: Api, project: Project,
                                           browser: webdriver.Chrome, tmp_path: Path) -> None:
    config = tmp_path / "config"
    async with terminal(tmp_path, login_command(config, public_service.base_url),
                        cli_env(config)) as term, \
            kept_on_failure(browser, tmp_path / "failure", also=term.keep_screen):
        code, link = await code_and_link(term)
        page = await asyncio.to_thread(_decide, browser, link, project.key, "deny")
        _page_checks(page, code)
        assert page.status == "Denied. The tool was refused.", page.status

        await term.shows(DENIED)
        assert await term.exited() == 1, await term.screen()
        assert not (config / "authio" / "credentials").exists()
