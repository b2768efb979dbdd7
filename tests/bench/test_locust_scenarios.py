"""The locust scenarios of bench/ run against the service and fail nothing, so they cannot rot.

The whole service serves on a loopback port in this process (``serving_public``: the development
mailbox on, ``SERVICE_TRUSTED_PROXIES=127.0.0.1`` so each simulated sign-in has its own address,
loopback webhook receivers allowed); ``bench/locust_setup.py`` sets it up as an operator would
(bootstrap token, a small dataset in a store, the passkey relying party, its probes), and
``locust`` runs as a subprocess, headless, with its ``--csv`` statistics read back:

* every scenario class at once (12 users: each class gets its weight in users) for a few
  seconds: each scenario's requests are there, more than none, and nothing failed (a wrong
  check answer, a non-2xx, a link that never reached the mailbox, a webhook that did not verify
  or did not arrive, all count as failures);
* ``--tags mixed``: only ``MixedApplication`` runs (the other classes are left out, not started
  to fail), with no failure.
"""

from __future__ import annotations

import asyncio
import csv
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.database import migrated_database
from tests.fixtures.service import BOOTSTRAP_TOKEN, ROOT, serving_public

PYTHON = sys.executable
LOCUST = str(Path(sys.executable).with_name("locust"))

# Per scenario class, requests its users must have made (type, name).
EXPECTED = {
    "SingleCheckUser": [("POST", "POST /v1/stores/[id]/check")],
    "BatchCheckUser": [("POST", "POST /v1/stores/[id]/batch-check x20")],
    "ForwardAuthUser": [("GET", "GET /v1/edge/auth"), ("GET", "GET /v1/edge/auth (+ check)")],
    "MagicLinkUser": [("POST", "POST /v1/auth/magic-link/verify"),
                      ("POST", "POST /v1/sessions/refresh")],
    "PasskeyUser": [("POST", "POST /v1/auth/passkey/login/verify")],
    "AuditUser": [("GET", "GET /v1/audit/events.csv"), ("GET", "GET /v1/audit/events.jsonl")],
    "WebhookFanoutUser": [("POST", "POST /v1/users"), ("WEBHOOK", "user.created delivered")],
}


async def run(*cmd: str, env: dict[str, str], within: float) -> tuple[int, str]:
    """``cmd``'s exit status and output; fails past ``within`` s."""
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=within)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        raise AssertionError(f"{cmd[:3]} took over {within} s: {out.decode()[-3000:]}") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def stats(prefix: Path) -> dict[tuple[str, str], dict[str, Any]]:
    with open(f"{prefix}_stats.csv", newline="") as f:
        return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}


def failures(prefix: Path) -> str:
    return Path(f"{prefix}_failures.csv").read_text()


@pytest.fixture(scope="module")
def bench_database_url(database_url: str) -> Iterator[str]:
    """A database of this test's own: the shared in-process service's outbox worker would
    otherwise deliver the scenarios' sign-in links into its own development mailbox."""
    with migrated_database(database_url, "bench") as url:
        yield url


async def test_every_scenario_runs_without_failures(
        http: ClientSession, settings_factory: Callable[..., Settings], tmp_path: Path,
        bench_database_url: str) -> None:
    env = {**os.environ, "AUTHIO_STATE": str(tmp_path / "state.json"), "AUTHIO_THINK_TIME": "0.02",
           "AUTHIO_BATCH_SIZE": "20", "AUTHIO_AUDIT_LIST_WEIGHT": "1",
           "AUTHIO_AUDIT_EXPORT_WEIGHT": "1", "AUTHIO_AUDIT_EXPORT_ROWS": "500",
           "AUTHIO_PASSKEY_ACCOUNTS": "2"}
    async with serving_public(http, settings_factory, trusted_proxies="127.0.0.1",
                              webhook_allow_private_urls=True, database_url=bench_database_url) as api:
        dataset = tmp_path / "small"
        code, output = await run(PYTHON, "bench/dataset.py", "--scale", "small", "--checks",
                                 "300", "--out", str(dataset), env=env, within=60)
        assert code == 0, output[-3000:]
        code, output = await run(PYTHON, "bench/locust_setup.py", "--host", api.base_url,
                                 "--bootstrap-token", BOOTSTRAP_TOKEN, "--dataset", str(dataset),
                                 env=env, within=90)
        assert code == 0, output[-3000:]

        every = tmp_path / "every"
        code, output = await run(LOCUST, "-f", "bench/locustfile.py", "--headless", "-u", "12",
                                 "-r", "12", "-t", "8s", "--host", api.base_url, "--csv",
                                 str(every), "--only-summary", *EXPECTED, "MixedApplication",
                                 env=env, within=60)
        assert code == 0, f"{output[-3000:]}\n{failures(every)}"
        seen = stats(every)
        assert int(seen[("", "Aggregated")]["Failure Count"]) == 0, failures(every)
        for scenario, names in EXPECTED.items():
            for key in names:
                assert key in seen and int(seen[key]["Request Count"]) > 0, \
                    (scenario, key, sorted(seen))

        mixed = tmp_path / "mixed"
        code, output = await run(LOCUST, "-f", "bench/locustfile.py", "--headless", "-u", "4",
                                 "-r", "4", "-t", "4s", "--host", api.base_url, "--tags", "mixed",
                                 "--csv", str(mixed), "--only-summary", env=env, within=45)
        assert code == 0, f"{output[-3000:]}\n{failures(mixed)}"
        assert '"MixedApplication": 4' in output, output[-3000:]
        total = stats(mixed)[("", "Aggregated")]
        assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0, \
            failures(mixed)
