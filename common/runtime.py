"""App factory pieces both services share: the base app, shared resources, health routes.

``base_app`` builds an Application with the envelope (as a middleware behind the tracing one when
tracing is set up, else run by ``common.http.EnvelopeRunner`` around the app) and settings;
``install_resources`` opens the PostgreSQL pool, Redis client, API-key authenticator
with its revocation feed, and the signing-key source in a ``cleanup_ctx`` once, whether one
service or both live in the app (``authio serve``); ``run_app`` serves an app until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Literal

import asyncpg
from aiohttp import web

from common.appkeys import (
    AUTHENTICATOR,
    PG_POOL,
    READINESS,
    READINESS_DETAIL,
    REDIS,
    RESOURCES_INSTALLED,
    SETTINGS,
    SIGNING_KEYS,
)
from common.auth import ApiKeyAuthenticator, follow_revocations
from common.db import create_pool, create_redis
from common.errors import NotReady
from common.http import EnvelopeRunner, envelope_middleware, json_response
from common.jwks import PgKeySource
from common.routing import Reply, RouteTable
from common.settings import Settings
from common.telemetry import server_middlewares
from common.tls import HSTS, HSTS_HEADER, ServerTls

log = logging.getLogger("authio.runtime")


def base_app(settings: Settings) -> web.Application:
    """An Application with the envelope, settings and the health routes; serve it with
    :class:`common.http.EnvelopeRunner` (``run_app`` does).

    When tracing is set up in this process (``common.telemetry.setup_tracing``), the middlewares
    are the server span's, then the envelope's, so the span covers the envelope's error responses
    too. Without tracing the app has no middleware at all and ``EnvelopeRunner`` runs the same
    envelope around the whole app: aiohttp adds a coroutine layer and a chain lookup per request
    to any app that has one middleware (issue 12: the check path's cost).
    """
    tracing = server_middlewares()
    app = web.Application(middlewares=[*tracing, envelope_middleware] if tracing else [],
                          client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[READINESS] = []
    app[READINESS_DETAIL] = {}
    app[RESOURCES_INSTALLED] = False
    health_routes.mount(app.router)
    return app


def install_resources(app: web.Application) -> None:
    """Add the shared-resource context once (idempotent across services in one app)."""
    if not app[RESOURCES_INSTALLED]:
        app[RESOURCES_INSTALLED] = True
        app.cleanup_ctx.append(_resources)


async def _resources(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    pool = await create_pool(settings.database_url, max_size=settings.pg_pool_max,
                             connect_timeout=settings.pg_connect_timeout_seconds,
                             command_timeout=settings.pg_command_timeout_seconds)
    redis = create_redis(settings.redis_url)
    auth = ApiKeyAuthenticator(pool, ttl_seconds=settings.api_key_cache_seconds)
    app[PG_POOL], app[REDIS], app[AUTHENTICATOR] = pool, redis, auth
    app[SIGNING_KEYS] = PgKeySource(pool)
    feed = asyncio.create_task(follow_revocations(redis, settings.redis_prefix, auth))
    try:
        yield
    finally:
        await stop_tasks(feed)
        await redis.aclose()
        await close_pool(pool)


POOL_CLOSE_SECONDS: Final = 10.0

GC_THRESHOLDS: Final = (10_000, 10, 10)
"""The cyclic collector's generation thresholds in a serving process (CPython's default is
(700, 10, 10)). A 1,000-item batch check keeps some 3,000 containers alive while it is
answered, so at 700 the collector ran several young passes per call, each walking the live
request body and promoting it towards the old generations: 7.7% of the batch handler's time
(issue 12's batch figures). At 10,000 no pass runs inside a call; what a pass walks is
bounded by what a request allocates, and the loaded graphs are frozen (``gc.freeze``). Read as
CPython 3.11 to 3.13 read them (3.14's incremental collector gives the first number another
meaning: measure again on a move to it)."""


def run_app(app: web.Application, *, host: str, port: int, loop: asyncio.AbstractEventLoop,
            shutdown_timeout: float, on_listening: Callable[[], None],
            tls: ServerTls | None = None) -> None:
    """Serve ``app`` on ``host:port`` in ``loop`` until SIGTERM or SIGINT: ``web.run_app``'s
    steps with :class:`common.http.EnvelopeRunner` (``web.run_app`` builds its own runner), so
    the envelope covers what aiohttp answers itself. On a signal: stop accepting, finish the
    requests in flight (up to ``shutdown_timeout`` seconds), run every cleanup context. Sets the
    collector's thresholds to :data:`GC_THRESHOLDS` for the process.

    With ``tls`` the port speaks HTTPS only, every response carries HSTS, and SIGHUP reloads
    the certificate and key (``common.tls``); without it SIGHUP keeps its default action."""

    async def serve() -> None:
        headers = {HSTS_HEADER: HSTS} if tls is not None else None
        runner = EnvelopeRunner(app, handle_signals=True, access_log=None,
                                shutdown_timeout=shutdown_timeout, keepalive_timeout=75.0,
                                response_headers=headers)
        await runner.setup()
        try:
            if tls is not None:
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, tls.reload)
            await web.TCPSite(runner, host, port,
                              ssl_context=tls.context if tls is not None else None).start()
            on_listening()
            await asyncio.Future()  # until the signal's GracefulExit cancels this task
        finally:
            await runner.cleanup()

    gc.set_threshold(*GC_THRESHOLDS)
    asyncio.set_event_loop(loop)
    main = loop.create_task(serve())
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not main.done():
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    loop.run_until_complete(main)
        finally:
            rest = asyncio.all_tasks(loop)
            for task in rest:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


@contextlib.asynccontextmanager
async def background(**workers: Coroutine[Any, Any, object]) -> AsyncIterator[None]:
    """Run each of ``workers`` (its task named by its keyword) while the block runs, then
    cancel them and wait until each has ended (``stop_tasks``): a domain's workers context."""
    tasks = [asyncio.create_task(coro, name=name.replace("_", "-"))
             for name, coro in workers.items()]
    try:
        yield
    finally:
        await stop_tasks(*tasks)


async def every(interval_seconds: float, step: Callable[[], Awaitable[object]], *, what: str,
                logger: logging.Logger, first_after: float = 0.0) -> None:
    """Run ``step`` after ``first_after`` seconds, then every ``interval_seconds``, until
    cancelled: a background worker's loop. A failed pass is logged (``what`` names it) and the
    next one comes at the next interval, so a database outage never ends the worker."""
    await asyncio.sleep(first_after)
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("%s failed; retrying in %.0f s", what, interval_seconds)
        await asyncio.sleep(interval_seconds)


async def stop_tasks(*tasks: asyncio.Task[Any]) -> None:
    """Cancel the background ``tasks`` of an app and wait until each has ended (the end of a
    ``cleanup_ctx``). Their cancellation is expected and not raised; another error is.

    A library that swallows a ``CancelledError`` (seen inside client reconnect loops) would
    otherwise leave its task running forever and the shutdown waiting on it, so a task still
    running ``CANCEL_REPEAT_SECONDS`` after the request is cancelled again."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        while True:
            done, _ = await asyncio.wait({task}, timeout=CANCEL_REPEAT_SECONDS)
            if done:
                break
            log.info("task %s ignored its cancellation; cancelling it again", task.get_name())
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


CANCEL_REPEAT_SECONDS: Final = 1.0


async def close_pool(pool: asyncpg.Pool) -> None:
    """Close ``pool`` gracefully, but not forever: asyncpg's ``close`` waits for every acquired
    connection to come back, and one a stuck task never returns would hold the shutdown. Past
    ``POOL_CLOSE_SECONDS`` the remaining connections are terminated, with a warning."""
    try:
        async with asyncio.timeout(POOL_CLOSE_SECONDS):
            await pool.close()
    except TimeoutError:
        log.warning("PostgreSQL pool still had connections in use after %.0f s; terminated them",
                    POOL_CLOSE_SECONDS)
        pool.terminate()


health_routes = RouteTable("health", "Liveness and readiness probes of either service.")


@dataclass(frozen=True, slots=True)
class Health:
    """``ok`` (alive), ``ready`` (serving), or ``stale``: serving, but the engine cannot follow
    PostgreSQL and answers checks from memory at the last revision it has (each answer says so).
    A stale engine stays ready on purpose: every engine loses the same database at once, and
    taking them all out of service would turn a write outage into a check outage."""

    status: Literal["ok", "ready", "stale"]


@health_routes.route("GET", "/healthz", replies=[Reply(200, "The process answers.", Health)])
async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return json_response(request, Health("ok"))


@dataclass(frozen=True, slots=True)
class Ready:
    """Serving: ``ready``, or ``stale`` (``Health``). ``detail`` holds what the services hosted
    here report beside it, never a reason not to serve: the control plane's ``maintenance``,
    ``{"in_progress": [{"id", "started_at", "ends_at"}], "as_of"}``, lists the
    maintenance windows under way (of every project), as read at ``as_of`` (a few seconds ago
    at most, unless PostgreSQL is away). An entry that failed is null."""

    status: Literal["ready", "stale"]
    detail: dict[str, Any]


@health_routes.route("GET", "/readyz", errors=(NotReady,),
                     replies=[Reply(200, "Ready to serve (`status` `ready` or `stale`), with "
                                         "`detail`.", Ready)])
async def readyz(request: web.Request) -> web.Response:
    """Readiness: every service hosted here can serve (the engine: its stores are loaded).

    ``status`` is ``stale`` while the engine cannot follow the change log (PostgreSQL
    unreachable) and answers checks from memory; it still counts as ready, so that a readiness
    probe does not take every engine out of service during a database outage. ``not_ready`` (503)
    until the stores are loaded. ``detail`` reports what is going on without deciding readiness:
    the maintenance windows in progress."""
    states = [probe() for probe in request.app[READINESS]]
    if "not_ready" in states:
        raise NotReady()
    detail: dict[str, Any] = {}
    for name, report in request.app[READINESS_DETAIL].items():
        try:
            detail[name] = await report()
        except Exception:  # informative only: never a reason not to answer ready
            log.exception("readiness detail %s failed", name)
            detail[name] = None
    return json_response(request, Ready("stale" if "stale" in states else "ready", detail))
