"""``authio import`` over an unreliable path: the suite's service is the real peer, behind a small
aiohttp reverse proxy written here that stands in for a load balancer in trouble.

The proxy forwards everything to the service, except that it troubles ``POST /v1/users``: it
answers 429 (``Retry-After: 1``) to the first requests, then 503, then for about two seconds
closes every connection without answering (an outage: the client sees the server disconnect),
and afterwards forwards everything. The run must still create every user exactly once, say once
that it paused and once that it resumed, and end with the expected tally. A record the proxy
answers 500 forever ends ``errored`` after ``HTTP_ATTEMPTS`` attempts
(``control_plane/imports/client.py``), and only that record.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import ClientSession, web

from tests.fixtures.database import events
from tests.fixtures.service import Project, start_app
from tests.imports.helpers import DATA, authio, cli_env, cursor_of, users_of

EXPORT = "auth0/users-export.ndjson"
EXPECTED: dict[str, Any] = json.loads((DATA / "expected.json").read_text())["fixtures"][EXPORT]
PAUSED = "cannot reach the service"
RESUMED = "the service answers again: resumed"
HTTP_ATTEMPTS = 10
"""``control_plane.imports.client.HTTP_ATTEMPTS``, written out: the command is tested from the
outside, as a subprocess, and importing the client here would only test it in-process."""
# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp computes again for the new message.
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                            "transfer-encoding", "upgrade", "content-length", "content-encoding",
                            "host", "date", "server"})


@dataclass
class Trouble:
    """A reverse proxy in front of ``upstream`` that troubles ``POST /v1/users`` (module
    docstring): ``too_many`` answers 429 with ``Retry-After: 1``, then ``unavailable`` answers
    503, then ``outage_seconds`` of closed connections (those arriving in its first
    ``hold_seconds`` are held that long first, so that the 429 and 503 answers already sent are
    read before the first connection drops), then forwarding. Every request to ``failing_email``
    is answered 500 with ``Retry-After: 0``, whatever the phase.

    ``did`` counts what it did; ``seen`` keeps, per e-mail, when each attempt arrived and what it
    got."""

    upstream: str
    http: ClientSession
    too_many: int = 3
    unavailable: int = 2
    outage_seconds: float = 2.0
    hold_seconds: float = 0.3
    failing_email: str | None = None
    did: Counter[str] = field(default_factory=Counter)
    seen: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    _count: int = 0
    _outage: tuple[float, float] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method != "POST" or request.path != "/v1/users":
            return await self._forward(request, body, "other")
        now = asyncio.get_running_loop().time()
        email = str(json.loads(body).get("email", "")).lower()
        if self.failing_email is not None and email == self.failing_email.lower():
            return self._answer(email, now, 500, {"Retry-After": "0"})
        self._count += 1
        if self._count <= self.too_many:
            return self._answer(email, now, 429, {"Retry-After": "1"})
        if self._count <= self.too_many + self.unavailable:
            return self._answer(email, now, 503, {})
        if self._outage is None:
            self._outage = (now, now + self.outage_seconds)
        began, ends = self._outage
        if now < ends:
            self.seen[email].append((now, "closed"))
            self.did["closed"] += 1
            await asyncio.sleep(max(0.0, began + self.hold_seconds - now))
            assert request.transport is not None
            request.transport.close()  # no answer: what is returned is never written
            return web.Response(status=502)
        return await self._forward(request, body, email, now)

    def _answer(self, email: str, now: float, status: int, headers: dict[str, str]) -> web.Response:
        self.seen[email].append((now, str(status)))
        self.did[str(status)] += 1
        return web.Response(status=status, text=f"the proxy answers {status}",
                            headers=headers)

    async def _forward(self, request: web.Request, body: bytes, email: str,
                       now: float | None = None) -> web.Response:
        if now is not None:
            self.seen[email].append((now, "forwarded"))
        self.did["forwarded"] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        async with self.http.request(request.method, self.upstream + request.path_qs,
                                     data=body, headers=headers) as r:
            raw = await r.read()
            back = {k: v for k, v in r.headers.items() if k.lower() not in _NOT_FORWARDED}
            return web.Response(status=r.status, body=raw, headers=back)


@contextlib.asynccontextmanager
async def proxied(trouble: Trouble) -> AsyncIterator[str]:
    """Serve ``trouble`` on a loopback port; its base URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", trouble.handle)
    running = await start_app(app)
    try:
        yield running.base_url
    finally:
        await running.stop()


def _line(tally: dict[str, int]) -> str:
    return (f"created {tally['created']}, existed {tally['existed']}, skipped {tally['skipped']}, "
            f"errored {tally['errored']}")


async def _import_through(proxy: str, project: Project, tmp_path: Path) -> tuple[Any, Path]:
    file = tmp_path / "users-export.ndjson"
    shutil.copy(DATA / EXPORT, file)
    env = cli_env(tmp_path / "config", AUTHIO_BASE_URL=proxy, AUTHIO_API_KEY=project.key)
    ran = await authio("import", "auth0", "--file", str(file), "--rate-limit-rps", "200",
                       env=env, within=90)
    return ran, file


async def test_throttled_failing_and_unreachable_then_every_user_once(
        project: Project, http: ClientSession, tmp_path: Path, db: asyncpg.Pool) -> None:
    trouble = Trouble(project.api.base_url, http)
    async with proxied(trouble) as proxy:
        ran, file = await _import_through(proxy, project, tmp_path)

    assert ran.code == 0, (ran.out, ran.err)
    assert ran.last_line == _line(EXPECTED["first_run"]) == "created 36, existed 0, skipped 14, errored 0"
    assert ran.err.count(PAUSED) == 1, ran.err
    assert ran.err.count(RESUMED) == 1, ran.err
    assert ran.err.index(PAUSED) < ran.err.index(RESUMED), ran.err
    assert "error:" not in ran.out, ran.out
    # The proxy did trouble the run as it was meant to.
    assert trouble.did["429"] == 3 and trouble.did["503"] == 2, trouble.did
    assert trouble.did["closed"] >= 1, trouble.did
    # Retry-After was honoured: each record answered 429 came back a second later, not sooner.
    for email, attempts in trouble.seen.items():
        for (at, what), (again, _) in itertools.pairwise(attempts):
            if what == "429":
                assert again - at >= 0.95, (email, attempts)
        assert attempts[-1][1] == "forwarded", (email, attempts)  # nothing given up

    users = await users_of(project.api)
    assert sorted(u["email"].lower() for u in users) == sorted(
        e.lower() for e in EXPECTED["created_emails"])
    assert len(await events(db, project.id, "user.created")) == 36
    assert cursor_of(file) is None


async def test_a_record_answered_500_forever_is_the_only_one_errored(
        project: Project, http: ClientSession, tmp_path: Path) -> None:
    failing = "jane.doe@example.com"
    # Retry-After: 0 makes each retry immediate (backoff alone would wait about two minutes).
    trouble = Trouble(project.api.base_url, http, too_many=0, unavailable=0, outage_seconds=0,
                      failing_email=failing)
    async with proxied(trouble) as proxy:
        ran, file = await _import_through(proxy, project, tmp_path)

    assert ran.code == 1, (ran.out, ran.err)
    assert ran.last_line == "created 35, existed 0, skipped 14, errored 1"
    errors = [line for line in ran.out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, ran.out
    assert failing in errors[0] and f"after {HTTP_ATTEMPTS} attempts" in errors[0], errors
    assert trouble.did["500"] == HTTP_ATTEMPTS, trouble.did
    assert PAUSED not in ran.err and RESUMED not in ran.err, ran.err

    users = await users_of(project.api)
    assert sorted(u["email"].lower() for u in users) == sorted(
        e.lower() for e in EXPECTED["created_emails"] if e.lower() != failing)
    assert cursor_of(file) is None
