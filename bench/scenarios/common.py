"""What every scenario shares: its settings (environment, then the set-up's state file), the
checks a request must pass, and the helpers of a simulated browser.

Settings (environment variables; each falls back to the state file that
``bench/locust_setup.py`` writes, ``AUTHIO_STATE``, default ``bench/data/locust-state.json``):

* ``AUTHIO_API_KEY``: a full-access key of the project (the development mailbox needs one);
* ``AUTHIO_PROJECT_ID``: the project of the public sign-in calls (``?project_id=``);
* ``AUTHIO_STORE_ID`` / ``AUTHIO_DATASET``: the store and the dataset loaded into it
  (``scenarios.checks``);
* ``AUTHIO_THINK_TIME``: seconds between two tasks of a simulated user (default 0: a closed
  loop); ``AUTHIO_TASK_RATE``: tasks per second per simulated user instead (locust's
  ``constant_throughput``; what ``bench/soak.py`` sets to hold a rate).

The state file names the host too (``host``), which is the default ``--host``.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import logging
import os
import random
import secrets
import time
from pathlib import Path
from typing import Any

import orjson
from locust import constant, constant_throughput
from locust.contrib.fasthttp import ResponseContextManager

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = BENCH_DIR.parent
DEFAULT_STATE = BENCH_DIR / "data" / "locust-state.json"
log = logging.getLogger("authio.bench")

# What the simulated browsers say they are: one browser family, so the risk engine's
# new_device signal fires only on a user's first sign-in (as for a real returning user).
BROWSER_UA = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
              "Chrome/131.0.0.0 Safari/537.36")


def state_path() -> Path:
    raw = Path(os.environ.get("AUTHIO_STATE", str(DEFAULT_STATE)))
    return raw if raw.is_absolute() or raw.exists() else REPO_DIR / raw


@functools.cache
def state() -> dict[str, Any]:
    """The set-up's state file (``{}`` when there is none)."""
    path = state_path()
    if path.exists():
        return dict(orjson.loads(path.read_bytes()))
    return {}


def setting(env: str, key: str, default: str = "") -> str:
    """``env`` from the environment, else ``key`` of the state file, else ``default``."""
    value = os.environ.get(env) or state().get(key)
    return str(value) if value else default


def api_key() -> str:
    key = setting("AUTHIO_API_KEY", "api_key")
    if not key:
        log.warning("no AUTHIO_API_KEY and no api_key in %s: run bench/locust_setup.py",
                    state_path())
    return key


def project_id() -> str:
    return setting("AUTHIO_PROJECT_ID", "project_id")


def default_host() -> str | None:
    return setting("AUTHIO_HOST", "host") or None


def wait_time() -> Any:
    """Locust's wait: ``AUTHIO_TASK_RATE`` tasks/s per user, else ``AUTHIO_THINK_TIME`` s."""
    rate = float(os.environ.get("AUTHIO_TASK_RATE", "0") or 0)
    if rate > 0:
        return constant_throughput(rate)
    return constant(float(os.environ.get("AUTHIO_THINK_TIME", "0") or 0))


def key_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key()}", "Content-Type": "application/json"}


def fresh_address() -> str:
    """A client address for one sign-in, in 10.0.0.0/8. The service believes it from
    ``X-Forwarded-For`` only when ``SERVICE_TRUSTED_PROXIES`` holds the load generator's address
    (127.0.0.1): then each sign-in comes from its own browser, as in production, and the
    per-address send limit and the risk engine's ``ip_velocity`` count per browser."""
    return str(ipaddress.IPv4Address(0x0A000000 + random.randrange(1, 1 << 24)))


def browser_headers(address: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "User-Agent": BROWSER_UA,
            "X-Forwarded-For": address}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "User-Agent": BROWSER_UA}


def new_email(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(8)}@bench.example.com"


def jwt_exp(token: str) -> float:
    """The ``exp`` of a JWT (not verified: the bench only needs to know when to refresh)."""
    try:
        payload = token.split(".")[1]
        return float(orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
                     ["exp"])
    except (IndexError, KeyError, ValueError):
        return time.time() + 60


def expect(resp: ResponseContextManager, status: int, *fields: str) -> dict[str, Any] | None:
    """The decoded body when ``resp`` has ``status`` and every one of ``fields``; else marks the
    request failed (with the status and the start of the body) and returns None."""
    if resp.status_code != status:
        resp.failure(f"HTTP {resp.status_code} (expected {status}): {(resp.text or '')[:300]}")
        return None
    try:
        body = orjson.loads(resp.content or b"{}")
    except orjson.JSONDecodeError:
        resp.failure(f"not JSON: {(resp.text or '')[:200]}")
        return None
    missing = [f for f in fields if f not in body]
    if missing:
        resp.failure(f"missing {missing}: {(resp.text or '')[:300]}")
        return None
    return dict(body)
