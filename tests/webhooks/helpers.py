"""A webhook receiver for the tests: a real HTTP server on a loopback port that verifies every
delivery with the Standard Webhooks reference library (``standardwebhooks``, never our signing
code) under the secrets it is given, and answers what the test scripts (status, ``Retry-After``,
a delay)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.fixtures.service import BOOTSTRAP_TOKEN, Api, eventually

SETTINGS: dict[str, Any] = {
    "webhook_allow_private_urls": True, "webhook_retry_schedule": "0.3,0.3,0.3",
    "webhook_timeout_seconds": 2.0, "stream_batch_size": 3,
}
"""The outbound tests' service: receivers on loopback over http, a short retry schedule, audit
stream batches of 3 events."""


def subprocess_env(database_url: str, redis_url: str, redis_prefix: str) -> dict[str, str]:
    """The environment of an ``authio serve`` subprocess on ``database_url``: no inherited
    ``OTEL_*`` or ``SERVICE_*`` variable, receivers allowed on loopback over http, a retry
    schedule of 1 s steps, 1 s timeouts and stream batches of 3."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SERVICE_")) and k not in ("PORT", "DATABASE_URL", "REDIS_URL")}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix,
               SERVICE_BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN, SERVICE_KMS_KEY=os.environ["SERVICE_KMS_KEY"],
               SERVICE_PG_POOL_MAX="4", OTEL_EXPORTER="none", SERVICE_LOG_LEVEL="WARNING",
               SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS="true", SERVICE_WEBHOOK_RETRY_SCHEDULE="1,1,1",
               SERVICE_WEBHOOK_TIMEOUT_SECONDS="1", SERVICE_STREAM_BATCH_SIZE="3")
    return env


@dataclass
class Received:
    """One request as the receiver saw it, and whether each secret verified it."""

    headers: dict[str, str]
    body: bytes
    verified: dict[str, bool]
    at: float

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Receiver:
    """What to answer (``answers``: a status per request in order, the last one repeated;
    ``retry_after``; ``delay`` seconds before answering, ``hold_first`` more for the first
    request, whose arrival sets ``first``) and what came in."""

    url: str = ""
    secrets: list[str] = field(default_factory=list)
    answers: list[int] = field(default_factory=lambda: [200])
    retry_after: str | None = None
    delay: float = 0.0
    hold_first: float = 0.0
    received: list[Received] = field(default_factory=list)
    first: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        verified = {}
        for secret in self.secrets:
            try:
                Webhook(secret).verify(body, headers)
                verified[secret] = True
            except WebhookVerificationError:
                verified[secret] = False
        self.received.append(Received(headers, body, verified, asyncio.get_running_loop().time()))
        status = self.answers[min(len(self.received), len(self.answers)) - 1]
        if len(self.received) == 1:
            self.first.set()
            await asyncio.sleep(self.hold_first)
        if self.delay:
            await asyncio.sleep(self.delay)
        extra = {"Retry-After": self.retry_after} if self.retry_after and status >= 400 else {}
        return web.Response(status=status, text="ok" if status < 300 else "no", headers=extra)

    async def wait_for(self, count: int, within: float = 20.0) -> list[Received]:
        async def enough() -> bool:
            return len(self.received) >= count
        await eventually(enough, within=within)
        return self.received


@contextlib.asynccontextmanager
async def receiver(*, tls: tuple[Path, Path] | None = None, **script: Any) -> AsyncIterator[Receiver]:
    """A :class:`Receiver` served on a loopback port (``url``) until the block ends: over http
    at ``http://127.0.0.1:<port>/hooks``, or with ``tls`` (a certificate for ``localhost`` and
    its key, PEM files) over https at ``https://localhost:<port>/hooks``."""
    r = Receiver(**script)
    app = web.Application()
    app.router.add_post("/{tail:.*}", r.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    context = None
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    r.url = f"https://localhost:{port}/hooks" if tls else f"http://127.0.0.1:{port}/hooks"
    try:
        yield r
    finally:
        await runner.cleanup()


async def subscribe(api: Api, target: Receiver, events: list[str]) -> dict[str, Any]:
    """A new endpoint for ``target`` (whose secrets it is then verified with)."""
    r = await api.post("/v1/webhook-endpoints", {"url": target.url, "events": events})
    assert r.status == 201, r.body
    target.secrets.append(r.body["secret"])
    return dict(r.body)


async def deliveries(api: Api, endpoint_id: str, *, until: Callable[[list[dict[str, Any]]], bool],
                     within: float = 20.0) -> list[dict[str, Any]]:
    """The endpoint's deliveries once ``until`` holds for them."""
    found: list[dict[str, Any]] = []

    async def ready() -> bool:
        nonlocal found
        r = await api.get(f"/v1/webhook-endpoints/{endpoint_id}/deliveries")
        assert r.status == 200, r.body
        found = r.body["data"]
        return until(found)
    await eventually(ready, within=within)
    return found
