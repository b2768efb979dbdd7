"""The engine's app: its routes (checks, batch checks, edge validation), the store registry,
readiness.

``create_engine_app`` is ``authio serve engine``; ``setup_engine`` adds the engine to an app that
may host the control plane too (``authio serve``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from common.appkeys import PG_POOL, READINESS, SETTINGS, Readiness
from common.runtime import base_app, install_resources
from common.settings import Settings
from engine import edge
from engine.appkeys import STORES
from engine.checks import routes
from engine.registry import StoreRegistry

__all__ = ["create_engine_app", "routes", "setup_engine"]

async def _registry_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    registry = StoreRegistry(
        pool=app[PG_POOL], dsn=settings.database_url, poll_seconds=settings.engine_poll_seconds
    )
    app[STORES] = registry
    registry.start()
    try:
        yield
    finally:
        await registry.close()


def setup_engine(app: web.Application) -> None:
    """Add the engine to ``app`` (built by ``common.runtime.base_app``): shared resources, the
    store registry (started in a cleanup context; loads in the background), its readiness probe
    (``/readyz`` answers 503 until every store is loaded and caught up, then 200, with status
    ``stale`` while the registry cannot follow the change log), the check routes, and edge
    session validation (``engine.edge``: its revocation mirror and routes)."""
    install_resources(app)
    app.cleanup_ctx.append(_registry_ctx)
    app.cleanup_ctx.append(edge.edge_ctx)

    def stores_ready() -> Readiness:
        registry = app.get(STORES)
        if registry is None or not registry.ready:
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
