"""A real browser for tests of the pages we serve: headless Chromium driven by Selenium.

Debian's ``chromium`` and ``chromedriver`` (package ``chromium-driver``) are used, installed with
apt-get when missing (as :mod:`devtools` installs PostgreSQL), so ``make test`` on a
fresh machine needs no manual step. Selenium Manager never runs: the driver path is given, so
nothing is downloaded from outside PyPI and Debian.

Selenium is synchronous; async tests call it through :func:`asyncio.to_thread` so the service,
which runs in the test's event loop, keeps answering.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from devtools import DevServicesError, apt_install

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PACKAGES = ("chromium", "chromium-driver")
# One installer at a time on this machine (parallel test runs share it).
_LOCK = Path(tempfile.gettempdir()) / "authio-chromium-install.lock"


class BrowserUnavailable(RuntimeError):
    """Chromium or chromedriver is missing and cannot be installed here."""


def _present() -> bool:
    return all(os.access(p, os.X_OK) for p in (CHROMIUM, CHROMEDRIVER))


def _tell(line: str) -> None:
    """Show ``line`` now, past pytest's output capture (which holds even ``sys.__stderr__``): on
    the controlling terminal when there is one, else on standard error."""
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"\n{line}\n")
            return
    except OSError:
        pass
    print(line, file=sys.__stderr__ or sys.stderr, flush=True)


def ensure_chromium() -> tuple[str, str]:
    """``(chromium, chromedriver)`` paths (``/usr/bin/chromium``, ``/usr/bin/chromedriver``).

    When either is missing, installs the Debian packages ``chromium`` and ``chromium-driver``
    with :func:`devtools.apt_install` (a minute or two, once per machine). Raises
    :class:`BrowserUnavailable` when that is impossible (not root, no apt-get) or fails.
    """
    if _present():
        return CHROMIUM, CHROMEDRIVER
    wanted = " ".join(PACKAGES)
    # Said before the install starts: pytest shows nothing until the test ends, and on a slow
    # mirror the 140 packages take minutes, which would look like a hung test run.
    _tell(f"browser: installing {wanted} with apt-get for the browser tests (about 140 Debian packages, "
          "once per machine; minutes on a slow mirror)")
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _present():  # another run installed them while we waited
            return CHROMIUM, CHROMEDRIVER
        began = time.monotonic()
        try:
            apt_install(list(PACKAGES), log=lambda line: print(line, file=sys.stderr, flush=True),
                        unable=(f"the browser tests need {CHROMIUM} and {CHROMEDRIVER} and cannot "
                                "install them ({why}): install the packages {wanted} (Debian: "
                                "sudo apt-get install --no-install-recommends {wanted})"))
        except DevServicesError as exc:
            raise BrowserUnavailable(str(exc)) from exc
        if not _present():
            raise BrowserUnavailable(f"installed {wanted} but {CHROMIUM} or {CHROMEDRIVER} is missing")
        _tell(f"browser: installed {wanted} in {time.monotonic() - began:.0f} s")
    return CHROMIUM, CHROMEDRIVER


def new_driver() -> webdriver.Chrome:
    """A headless Chromium WebDriver that records the page's console (``get_log("browser")``)."""
    try:
        chromium, chromedriver = ensure_chromium()
    except BrowserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1024,768"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))


@contextlib.contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """:func:`new_driver`, quit on exit (a session fixture wraps this)."""
    driver = new_driver()
    try:
        yield driver
    finally:
        driver.quit()
