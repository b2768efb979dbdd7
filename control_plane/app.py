"""The control plane's app factory: one list of routes, one resources context, one workers
context (DESIGN.md "One package per domain").

Every domain's ``endpoints.routes`` is mounted from :func:`route_tables`; every domain's
``tasks.workers`` runs from ``_workers``; every resource of the control plane is opened and
closed in ``_resources``. ``GET /openapi.json`` serves the document of every route of the
service (the engine's too: production routes ``/openapi.json`` to the control plane).
``GET /readyz`` shows the maintenance windows in progress in its detail
(``compliance.service.MaintenanceBoard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from importlib import metadata
from typing import Final

from aiohttp import web

from common.appkeys import PG_POOL, READINESS_DETAIL, REDIS, SETTINGS
from common.openapi import build_document, document_json
from common.routing import Reply, RouteTable, operations
from common.runtime import base_app, health_routes, install_resources
from common.settings import Settings, SettingsError
from control_plane.appkeys import (
    CORS_ORIGINS,
    CURSOR_SECRET,
    KEYRING,
    KMS,
    MAILBOX,
    MAINTENANCE_BOARD,
    OAUTH,
    OPENAPI,
    OUTBOX_WAKE,
    RISK,
    SEND_LIMITS,
    TOKENS,
    TXT_RESOLVER,
)
from control_plane.audit import endpoints as audit
from control_plane.audit import tasks as audit_tasks
from control_plane.authz import endpoints as authz
from control_plane.authz import tasks as authz_tasks
from control_plane.compliance import endpoints as compliance
from control_plane.compliance import tasks as compliance_tasks
from control_plane.compliance.service import MaintenanceBoard
from control_plane.imports import endpoints as imports
from control_plane.imports import tasks as import_tasks
from control_plane.kms import LocalKms
from control_plane.magic_links import endpoints as magic_links
from control_plane.magic_links import tasks as magic_link_tasks
from control_plane.magic_links.service import SendLimits
from control_plane.messages import endpoints as messages
from control_plane.messages import tasks as message_tasks
from control_plane.messages.senders import ConsoleSink, uses_console
from control_plane.oauth import endpoints as oauth
from control_plane.oauth.protocol import OAuthClient
from control_plane.operators import console as operator_console
from control_plane.operators import endpoints as operators
from control_plane.organizations import endpoints as organizations
from control_plane.passkeys import endpoints as passkeys
from control_plane.passkeys import tasks as passkey_tasks
from control_plane.portal import endpoints as portal
from control_plane.portal import tasks as portal_tasks
from control_plane.portal.resolver import TxtResolver
from control_plane.recovery import endpoints as recovery
from control_plane.risk import endpoints as risk
from control_plane.risk import tasks as risk_tasks
from control_plane.risk.service import RiskEngine
from control_plane.scim import endpoints as scim
from control_plane.scim import service as scim_service
from control_plane.sessions import endpoints as sessions
from control_plane.sessions import tasks as session_tasks
from control_plane.sessions.tokens import TokenService
from control_plane.signing_keys import endpoints as signing_keys
from control_plane.signing_keys import tasks as signing_key_tasks
from control_plane.signing_keys.service import Keyring
from control_plane.tenancy import cors
from control_plane.tenancy import endpoints as tenancy
from control_plane.users import endpoints as users
from control_plane.web import browser
from control_plane.web.pagination import load_cursor_secret
from control_plane.web.ratelimit import RateLimits
from control_plane.webhooks import endpoints as webhooks
from control_plane.webhooks import tasks as webhook_tasks
from engine.checks import routes as engine_routes
from engine.edge import routes as edge_routes

TITLE: Final = "authio"
DESCRIPTION: Final = (
    "Passwordless sign-in, sessions and Zanzibar-style permission checks for multi-tenant "
    "applications. Every response carries X-Request-Id, equal to the request_id of its body; "
    "errors are {\"error\": {\"code\", \"message\", \"details\"}, \"request_id\"}. "
    "The public routes (/v1/auth/*, /v1/sessions/*) answer CORS, preflights (OPTIONS) included, "
    "to the origins their project allows (its webauthn.origins and cors_origins, "
    "PATCH /v1/projects/me), with credentials; no other route answers CORS (docs/browser.md)."
)
ROUTES: Final = (tenancy.routes, authz.routes, users.routes, organizations.routes,
                 sessions.routes, magic_links.routes, passkeys.routes, oauth.routes,
                 risk.routes, signing_keys.routes,
                 audit.routes, webhooks.routes, compliance.routes, imports.routes,
                 recovery.routes, scim.routes, portal.routes, operators.routes,
                 operator_console.routes, browser.routes)
WORKERS: Final[Sequence[Callable[[web.Application], AbstractAsyncContextManager[None]]]] = (
    audit_tasks.workers, signing_key_tasks.workers, message_tasks.workers,
    session_tasks.workers, magic_link_tasks.workers, authz_tasks.workers, passkey_tasks.workers,
    risk_tasks.workers, webhook_tasks.workers, compliance_tasks.workers, import_tasks.workers,
    portal_tasks.workers,
)
meta_routes = RouteTable("meta", "This document.")


def route_tables(settings: Settings) -> list[RouteTable]:
    """The control plane's route tables under ``settings`` (the development mailbox only where
    ``settings.serves_dev_mailbox``)."""
    return _tables(settings.serves_dev_mailbox)


def _tables(dev_mailbox: bool) -> list[RouteTable]:
    return [*ROUTES, *([messages.dev_routes] if dev_mailbox else []), meta_routes]


@functools.cache
def openapi_document(*, dev_mailbox: bool) -> bytes:
    """The OpenAPI 3.1 document of every route the service answers: the probes, the engine's
    checks and edge validation, and the control plane's (the development mailbox's with ``dev_mailbox``), as
    ``document_json`` writes it."""
    tables = [health_routes, engine_routes, edge_routes, *_tables(dev_mailbox)]
    doc = build_document(operations(tables), title=TITLE, version=metadata.version("authio"),
                         description=DESCRIPTION,
                         tags=[(t.tag, t.description) for t in tables])
    return document_json(doc)


@meta_routes.route("GET", "/openapi.json", replies=[Reply(200, "The OpenAPI 3.1 document.",
                                                          envelope=False)])
async def get_openapi(request: web.Request) -> web.Response:
    """The OpenAPI 3.1 document of this service (generated from its route tables)."""
    return web.Response(body=request.app[OPENAPI], content_type="application/json",
                        headers={"Cache-Control": "public, max-age=300"})


def load_kms(settings: Settings) -> LocalKms:
    """The KMS over ``SERVICE_KMS_KEY`` / ``SERVICE_KMS_KEY_FILE``. Raises SettingsError when
    neither is set: signing keys and message bodies are never stored unencrypted."""
    kek = settings.kek()
    if kek is None:
        raise SettingsError(
            "SERVICE_KMS_KEY or SERVICE_KMS_KEY_FILE must be set: the key-encryption key that "
            "wraps signing keys and secrets at rest (base64 of 32 random bytes; make one with "
            "'authio kms-key --file PATH')"
        )
    return LocalKms(kek)


async def _resources(app: web.Application) -> AsyncIterator[None]:
    """The control plane's resources, after the shared ones (``common.runtime``)."""
    settings, pool = app[SETTINGS], app[PG_POOL]
    app[CURSOR_SECRET] = await load_cursor_secret(pool)
    app[KEYRING] = Keyring(pool, app[KMS])
    app[TOKENS] = TokenService(app[KEYRING], settings)
    limits = RateLimits(app[REDIS], settings.redis_url, settings.redis_prefix)
    app[SEND_LIMITS] = SendLimits(
        per_destination=limits.limit("magic_link_destination",
                                     settings.magic_link_rate_per_destination),
        per_ip=limits.limit("magic_link_ip", settings.magic_link_rate_per_ip),
    )
    app[OAUTH] = OAuthClient(settings)
    app[RISK] = RiskEngine(settings, app[REDIS])
    await app[RISK].start()
    try:
        yield
    finally:
        await app[OAUTH].close()
        await app[RISK].close()


async def _workers(app: web.Application) -> AsyncIterator[None]:
    """Every domain's background workers, while the app runs."""
    async with contextlib.AsyncExitStack() as stack:
        for workers in WORKERS:
            await stack.enter_async_context(workers(app))
        yield


def setup_control_plane(app: web.Application) -> None:
    """Add the control plane to ``app`` (alone or beside the engine). Raises SettingsError
    without a key-encryption key."""
    settings = app[SETTINGS]
    install_resources(app)
    app[KMS] = load_kms(settings)
    app[OUTBOX_WAKE] = asyncio.Event()
    if uses_console(settings):
        app[MAILBOX] = ConsoleSink()
    app[OPENAPI] = openapi_document(dev_mailbox=settings.serves_dev_mailbox)
    board = app[MAINTENANCE_BOARD] = MaintenanceBoard()
    app[TXT_RESOLVER] = TxtResolver(settings.dns_nameservers)
    app[READINESS_DETAIL]["maintenance"] = lambda: board.detail(app.get(PG_POOL))
    scim_service.follow_memberships()  # directory group tuples follow every membership change
    app.cleanup_ctx.append(_resources)
    app.cleanup_ctx.append(_workers)
    app[CORS_ORIGINS] = cors.OriginCache()
    cache = functools.partial(_origin_cache, app)
    for table in route_tables(settings):
        # The public routes answer CORS to the origins their project allows (DESIGN.md "the
        # browser (CORS)"); no other route is touched.
        resources = table.mount(app.router, wrap=lambda op: cors.decorated(op.handler, cache)
                                if cors.is_public(op.path) else op.handler)
        cors.mount(table, resources, cache)


def _origin_cache(app: web.Application, request: web.Request) -> cors.OriginCache:
    return app[CORS_ORIGINS]


def create_control_plane_app(settings: Settings) -> web.Application:
    """The control plane alone (``authio serve control-plane``)."""
    app = base_app(settings)
    setup_control_plane(app)
    return app
