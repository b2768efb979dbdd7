"""What the client tests share: a recorder of the requests a client sends (an httpx event
hook), clients built with it, and a signed-in user."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp import ClientSession, web
from authio_client import AsyncAuthioClient, AuthioClient, RetryPolicy

from tests.fixtures.identity import SignedIn, email, sign_in
from tests.fixtures.service import Project, loopback_app


@dataclass
class Sent:
    """What a client sent: one ``(method, path)`` per HTTP request, and the statuses answered."""

    requests: list[tuple[str, str]] = field(default_factory=list)
    statuses: list[tuple[str, int]] = field(default_factory=list)
    headers: list[httpx.Headers] = field(default_factory=list)

    def count(self, method: str, suffix: str) -> int:
        return sum(1 for m, p in self.requests if m == method and p.endswith(suffix))

    def clear(self) -> None:
        self.requests.clear()
        self.statuses.clear()
        self.headers.clear()

    def on_request(self, request: httpx.Request) -> None:
        self.requests.append((request.method, request.url.path))
        self.headers.append(request.headers)

    def on_response(self, response: httpx.Response) -> None:
        self.statuses.append((response.request.url.path, response.status_code))

    async def a_request(self, request: httpx.Request) -> None:
        self.on_request(request)

    async def a_response(self, response: httpx.Response) -> None:
        self.on_response(response)


FAST_RETRY = RetryPolicy(attempts=6, total_seconds=20.0, backoff=0.05, max_backoff=0.5)


def async_client(base_url: str, key: str | None, sent: Sent, **kw: Any) -> AsyncAuthioClient:
    hooks: dict[str, list[Callable[..., Any]]] = {"request": [sent.a_request],
                                                  "response": [sent.a_response]}
    return AsyncAuthioClient(base_url, key, event_hooks=hooks, retry=kw.pop("retry", FAST_RETRY), **kw)


def sync_client(base_url: str, key: str | None, sent: Sent, **kw: Any) -> AuthioClient:
    hooks: dict[str, list[Callable[..., Any]]] = {"request": [sent.on_request],
                                                  "response": [sent.on_response]}
    return AuthioClient(base_url, key, event_hooks=hooks, retry=kw.pop("retry", FAST_RETRY), **kw)




async def signed_in(project: Project) -> SignedIn:
    """A new user of ``project`` signed in by magic link (through the service's HTTP API)."""
    return await sign_in(project, email())


Intercept = Callable[[str, bytes], Awaitable["web.Response | None"]]
Rewrite = Callable[[str, bytes], Awaitable[bytes]]


async def _unchanged(path: str, body: bytes) -> bytes:
    return body


@contextlib.asynccontextmanager
async def ingress(http: ClientSession, upstream: str, intercept: Intercept,
                  rewrite: Rewrite = _unchanged) -> AsyncIterator[str]:
    """A small HTTP ingress on a loopback port (its URL yielded) passing requests to
    ``upstream``: ``intercept(path, request body)`` may answer instead, and ``rewrite(path,
    answer body)`` may change what the service answered (a fault put in front of the real
    service, for the moments it cannot be made to produce on purpose)."""
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        own = await intercept(request.path, body)
        if own is not None:
            return own
        headers = {k: request.headers[k] for k in ("Authorization", "Content-Type") if k in request.headers}
        async with http.request(request.method, upstream + request.path_qs, data=body, headers=headers) as r:
            answer = await rewrite(request.path, await r.read())
            kept = {k: v for k, v in r.headers.items() if k.lower() in ("retry-after", "x-request-id")}
            return web.Response(body=answer, status=r.status, headers=kept, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with loopback_app(app) as port:
        yield f"http://127.0.0.1:{port}"
