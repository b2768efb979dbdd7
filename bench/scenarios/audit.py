"""Reading the audit log: keyset pages of ``GET /v1/audit/events`` and exports.

* Listing (tag ``audit-list``): the first page (``limit`` 50, newest first) of one of a few
  filters (none, ``type=auth.signin_attempt``, ``type=user.created,session.revoked``,
  ``q=bench.example.com``, the last hour by ``from``), then up to ``AUTHIO_AUDIT_PAGES`` (3) more
  pages through ``next_cursor`` while there is one. Each page must be 200 with ``data`` newest
  first (``created_at`` not increasing) and at most ``limit`` items.
* Export (tag ``audit-export``): ``GET /v1/audit/events.jsonl`` or ``.csv`` with ``limit``
  ``AUTHIO_AUDIT_EXPORT_ROWS`` (default 10,000; the service streams at most 100,000): 200, and the
  rows are counted (no more than asked).

The key must hold ``audit:read`` (a full-access key does). The log grows with whatever the other
scenarios do (sign-ins, users, tuple writes); run them first, or the set-up's own events are all
there is. Settings: ``AUTHIO_API_KEY``, ``AUTHIO_AUDIT_PAGES``, ``AUTHIO_AUDIT_EXPORT_ROWS``,
``AUTHIO_AUDIT_LIST_WEIGHT`` and ``AUTHIO_AUDIT_EXPORT_WEIGHT`` (20 and 1: ``AuditUser``'s mix). Tags:
``audit-list``, ``audit-export``, ``audit`` (both).
"""

from __future__ import annotations

import csv
import io
import os
import random
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import orjson
from locust import FastHttpUser, tag, task
from locust.contrib.fasthttp import FastHttpSession

from scenarios import common

FILTERS = ("", "type=auth.signin_attempt", "type=user.created,session.revoked",
           "q=bench.example.com", "from=")
PAGE = 50


class AuditFlow:
    def __init__(self, client: FastHttpSession) -> None:
        self.client = client
        self.headers = common.key_headers()
        self.pages = int(os.environ.get("AUTHIO_AUDIT_PAGES", "3"))
        self.export_rows = int(os.environ.get("AUTHIO_AUDIT_EXPORT_ROWS", "10000"))

    def list_pages(self) -> None:
        kind = random.choice(FILTERS)
        query = kind
        if kind == "from=":
            since = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            query = f"from={since}"
        label = kind.split("=")[0] or "none"
        cursor: str | None = None
        for page in range(1 + self.pages):
            path = f"/v1/audit/events?limit={PAGE}" + (f"&{query}" if query else "")
            if cursor:
                path += f"&cursor={quote(cursor)}"
            name = f"GET /v1/audit/events ({label}, {'first page' if page == 0 else 'next page'})"
            with self.client.get(path, headers=self.headers, name=name,
                                 catch_response=True) as resp:
                body = common.expect(resp, 200, "data")
                if body is None:
                    return
                stamps = [datetime.fromisoformat(e["created_at"]) for e in body["data"]]
                if len(stamps) > PAGE or stamps != sorted(stamps, reverse=True):
                    resp.failure(f"{len(stamps)} events, not newest first: {stamps[:5]}")
                    return
                cursor = body.get("next_cursor")
            if not cursor:
                return

    def export(self) -> None:
        fmt = random.choice(("jsonl", "csv"))
        with self.client.get(f"/v1/audit/events.{fmt}?limit={self.export_rows}",
                             headers=self.headers, name=f"GET /v1/audit/events.{fmt}",
                             catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            text = (resp.content or b"").decode()
            if fmt == "csv":  # RFC 4180: a field may hold line breaks; the header is no row
                rows = max(0, sum(1 for _ in csv.reader(io.StringIO(text))) - 1)
            else:
                rows = sum(1 for line in text.splitlines() if orjson.loads(line))
            if rows > self.export_rows:
                resp.failure(f"{rows} rows for a limit of {self.export_rows}")


class AuditUser(FastHttpUser):
    """An administrator's console reading the log (pages 20:1 exports)."""

    weight = 1
    host = common.default_host()
    wait_time = common.wait_time()

    def on_start(self) -> None:
        self.flow = AuditFlow(self.client)

    @tag("audit-list", "audit")
    @task(int(os.environ.get("AUTHIO_AUDIT_LIST_WEIGHT", "20")))
    def list_pages(self) -> None:
        self.flow.list_pages()

    @tag("audit-export", "audit")
    @task(int(os.environ.get("AUTHIO_AUDIT_EXPORT_WEIGHT", "1")))
    def export(self) -> None:
        self.flow.export()
