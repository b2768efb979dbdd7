"""The engine's app: its routes (checks, batch checks, edge validation), the store registry,
readiness.

``create_engine_app`` is ``authio serve engine``; ``setup_engine`` adds the engine to an app that
may host the control plane too (``authio serve``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from common.appkeys import PG_POOL, READINESS, SETTINGS, Readiness
from common.jwks import PublishedKeys
from common.runtime import base_app, install_resources
from common.settings import Settings
from engine import edge
from engine.appkeys import KEYS, STORES
from engine.checks import routes
from engine.keys import KeyFollower
from engine.registry import StoreRegistry

__all__ = ["create_engine_app", "routes", "setup_engine"]

log = logging.getLogger("authio.engine")

KEYS_WAIT_SECONDS = 2.0
"""How long start-up waits for the first read of the signing keys before serving anyway."""


async def _registry_ctx(app: web.Application) -> AsyncIterator[None]:
    """The store registry and the signing keys, which follow PostgreSQL on its one listener
    connection (``engine.keys``). Waits up to :data:`KEYS_WAIT_SECONDS` for the first read of
    the keys (until then an unknown ``kid`` is looked up, at most once a second)."""
    settings = app[SETTINGS]
    keys = PublishedKeys(app[PG_POOL])
    follower = KeyFollower(keys)
    registry = StoreRegistry(
        pool=app[PG_POOL], dsn=settings.database_url, poll_seconds=settings.engine_poll_seconds,
        followers=(follower.follower,), stores=settings.engine_stores,
        idle_seconds=settings.engine_store_idle_seconds,
    )
    app[STORES], app[KEYS] = registry, keys
    registry.start()
    follower.start()
    try:
        async with asyncio.timeout(KEYS_WAIT_SECONDS):
            await keys.loaded.wait()
    except TimeoutError:
        log.warning("signing keys not read yet; edge validation starts without them")
    try:
        yield
    finally:
        await registry.close()
        await follower.close()


def setup_engine(app: web.Application) -> None:
    """Add the engine to ``app`` (built by ``common.runtime.base_app``): shared resources, the
    store registry and the signing keys (started in a cleanup context; load in the background),
    their readiness probe (``/readyz`` answers 503 until every store is loaded and caught up and
    the signing keys are read, then 200, with status ``stale`` while the registry cannot follow
    the change log; with ``SERVICE_ENGINE_STORES=on_demand`` no store is loaded at start, and
    ready means the change-log follower is listening and the keys are read), the check routes,
    and edge session validation (``engine.edge``: its revocation mirror and routes)."""
    install_resources(app)
    app.cleanup_ctx.append(_registry_ctx)
    app.cleanup_ctx.append(edge.edge_ctx)

    def stores_ready() -> Readiness:
        registry, keys = app.get(STORES), app.get(KEYS)
        if registry is None or not registry.ready or keys is None or not keys.loaded.is_set():
            return "not_ready"
        return "stale" if registry.stale else "ready"

    app[READINESS].append(stores_ready)
    routes.mount(app.router)
    edge.mount(app.router)


def create_engine_app(settings: Settings) -> web.Application:
    """The engine service alone: ``base_app(settings)`` plus :func:`setup_engine`."""
    app = base_app(settings)
    setup_engine(app)
    return app
