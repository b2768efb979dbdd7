"""Permission-check scenarios: single ``/check`` and ``/batch-check`` users.

Each simulated user is a closed loop (no think time unless ``AUTHIO_THINK_TIME``) cycling
through the dataset's ``checks.jsonl`` from a random offset, and marks a request failed
when the service's ``allowed`` differs from the dataset's expectation.

Configuration (environment, else the set-up's state file, see ``scenarios.common``):
``AUTHIO_API_KEY``, ``AUTHIO_DATASET`` (default: the state's ``dataset``, else
``bench/data/medium``, relative to the repository if not found from the working directory),
``AUTHIO_STORE_ID`` (default: the state's ``store_id``, else the dataset's ``store.json``,
whose ``base_url`` is also the default host), ``AUTHIO_BATCH_SIZE`` (100), ``AUTHIO_VERIFY``
(1), ``AUTHIO_THINK_TIME`` (0 seconds) or ``AUTHIO_TASK_RATE``. Tags: ``single-check``,
``batch-check``, ``checks`` (both).
"""

from __future__ import annotations

import functools
import logging
import os
import random
from pathlib import Path
from typing import Any

import orjson
from locust import FastHttpUser, tag, task
from locust.contrib.fasthttp import FastHttpSession

from scenarios import common

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = BENCH_DIR.parent
log = logging.getLogger("authio.bench")


def dataset_dir() -> Path:
    raw = Path(common.setting("AUTHIO_DATASET", "dataset", "bench/data/medium"))
    if raw.is_absolute() or raw.exists():
        return raw
    return REPO_DIR / raw  # relative to the repository, whatever the working directory


@functools.cache
def store_info() -> dict[str, Any]:
    path = dataset_dir() / "store.json"
    if path.exists():
        return dict(orjson.loads(path.read_bytes()))
    return {}


def store_id() -> str:
    sid = common.setting("AUTHIO_STORE_ID", "store_id") or store_info().get("store_id")
    if not sid:
        log.warning("no AUTHIO_STORE_ID and no %s/store.json: using 'store_bench'",
                    dataset_dir())
        return "store_bench"
    return str(sid)


def default_host() -> str | None:
    host = common.default_host() or store_info().get("base_url")
    return str(host) if host else None


def verify() -> bool:
    return os.environ.get("AUTHIO_VERIFY", "1").lower() not in ("0", "false", "no")


def batch_size() -> int:
    return int(os.environ.get("AUTHIO_BATCH_SIZE", "100"))


@functools.cache
def checks() -> tuple[list[bytes], list[bool], list[dict[str, str]]]:
    """(pre-serialized /check bodies, expected answers, tuple keys) from checks.jsonl."""
    path = dataset_dir() / "checks.jsonl"
    keys: list[dict[str, str]] = []
    expected: list[bool] = []
    if path.exists():
        with open(path, "rb") as fh:
            for line in fh:
                if line.strip():
                    c = orjson.loads(line)
                    keys.append({"object": c["object"], "relation": c["relation"],
                                 "user": c["user"]})
                    expected.append(bool(c["allowed"]))
    if not keys:
        log.warning("no checks in %s: using one synthetic check", path)
        keys = [{"object": "document:1", "relation": "viewer", "user": "user:1"}]
        expected = [True]
    bodies = [orjson.dumps({"tuple_key": k}) for k in keys]
    return bodies, expected, keys


def headers() -> dict[str, str]:
    return common.key_headers()


class CheckFlow:
    """Single and batch checks of one simulated user, cycling through the dataset's checks from
    a random offset."""

    def __init__(self, client: FastHttpSession) -> None:
        self.client = client
        self.bodies, self.expected, self.keys = checks()
        self.pos = random.randrange(len(self.bodies))
        self.headers = headers()
        self.base_path = f"/v1/stores/{store_id()}"
        self.verify = verify()
        self.batch_size = batch_size()

    def _next(self) -> int:
        i = self.pos
        self.pos = (i + 1) % len(self.bodies)
        return i

    def check(self) -> None:
        """POST /v1/stores/{id}/check, one tuple."""
        i = self._next()
        with self.client.post(f"{self.base_path}/check", data=self.bodies[i],
                              headers=self.headers, name="POST /v1/stores/[id]/check",
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            if self.verify:
                doc: dict[str, Any] = orjson.loads(resp.content or b"{}")
                if doc.get("allowed") != self.expected[i]:
                    resp.failure(f"allowed={doc.get('allowed')} expected {self.expected[i]} "
                                 f"for {self.keys[i]}")

    def batch_check(self) -> None:
        """POST /v1/stores/{id}/batch-check with ``AUTHIO_BATCH_SIZE`` checks."""
        idx = [self._next() for _ in range(self.batch_size)]
        body = orjson.dumps({"checks": [{"tuple_key": self.keys[i]} for i in idx]})
        with self.client.post(f"{self.base_path}/batch-check", data=body,
                              headers=self.headers,
                              name=f"POST /v1/stores/[id]/batch-check x{self.batch_size}",
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            results = orjson.loads(resp.content or b"{}").get("results") or []
            if len(results) != len(idx):
                resp.failure(f"{len(results)} results for {len(idx)} checks")
                return
            errors = sum(1 for r in results if "error" in r)
            wrong = 0
            if self.verify:
                wrong = sum(1 for r, i in zip(results, idx, strict=True)
                            if "error" not in r and r.get("allowed") != self.expected[i])
            if errors or wrong:
                resp.failure(f"{errors} item errors, {wrong} wrong answers")


class SingleCheckUser(FastHttpUser):
    """POST /v1/stores/{id}/check, one tuple per request."""

    weight = 3
    host = default_host()
    wait_time = common.wait_time()

    def on_start(self) -> None:
        self.flow = CheckFlow(self.client)

    @tag("single-check", "checks")
    @task
    def check(self) -> None:
        self.flow.check()


class BatchCheckUser(FastHttpUser):
    """POST /v1/stores/{id}/batch-check with ``AUTHIO_BATCH_SIZE`` (100) checks."""

    weight = 1
    host = default_host()
    wait_time = common.wait_time()

    def on_start(self) -> None:
        self.flow = CheckFlow(self.client)

    @tag("batch-check", "checks")
    @task
    def batch_check(self) -> None:
        self.flow.batch_check()
