"""The control plane's app factory: routes and background workers (DESIGN.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.runtime import base_app, install_resources, stop_tasks
from common.settings import Settings, SettingsError
from control_plane import (
    api_keys,
    audit_events,
    bootstrap,
    invitations,
    memberships,
    organizations,
    outbox,
    projects,
    sessions,
    signin,
    signing_keys,
    stores,
    tuples,
    users,
)
from control_plane.appkeys import CURSOR_SECRET, KMS
from control_plane.audit_partitions import manage_partitions, run_partition_manager
from control_plane.housekeeping import run_housekeeping
from control_plane.kms import LocalKms
from control_plane.pagination import load_cursor_secret


def setup_control_plane(app: web.Application) -> None:
    """Add the control plane's routes and workers to ``app`` (alone or beside the engine)."""
    install_resources(app)
    app[KMS] = load_kms(app[SETTINGS])
    app.cleanup_ctx.append(_cursor_secret)
    app.cleanup_ctx.append(_workers)
    r = app.router
    r.add_post("/v1/bootstrap", bootstrap.post_bootstrap)
    r.add_get("/v1/projects/me", projects.get_me)
    r.add_post("/v1/api-keys", api_keys.post_key)
    r.add_get("/v1/api-keys", api_keys.list_keys)
    r.add_delete("/v1/api-keys/{key_id}", api_keys.delete_key)
    r.add_post("/v1/stores", stores.post_store)
    r.add_get("/v1/stores", stores.list_stores)
    r.add_get("/v1/stores/{store_id}", stores.show_store)
    r.add_post("/v1/stores/{store_id}/write", tuples.post_write)
    r.add_get("/v1/stores/{store_id}/tuples", tuples.get_tuples)
    r.add_get("/v1/audit/events", audit_events.get_events)
    r.add_get("/v1/audit/events.csv", audit_events.get_events_csv, allow_head=False)
    r.add_get("/v1/audit/events.jsonl", audit_events.get_events_jsonl, allow_head=False)
    r.add_get("/v1/audit/events/types", audit_events.get_event_types)
    r.add_get("/v1/audit-events", audit_events.get_legacy_events)
    # Identity (issue 4): each module registers its own routes (and workers) with setup(app).
    # identity-setup
    signing_keys.setup(app)
    outbox.setup(app)
    users.setup(app)
    organizations.setup(app)
    memberships.setup(app)
    invitations.setup(app)
    sessions.setup(app)
    signin.setup(app)


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


async def _cursor_secret(app: web.Application) -> AsyncIterator[None]:
    """The cursor-signing secret every process shares (``control_plane.pagination``)."""
    app[CURSOR_SECRET] = await load_cursor_secret(app[PG_POOL])
    yield


async def _workers(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    async with app[PG_POOL].acquire() as conn:
        await manage_partitions(
            conn, now=datetime.now(UTC), forward_months=settings.audit_forward_months,
            retention_months=settings.audit_retention_months,
        )
    tasks = [
        asyncio.create_task(run_partition_manager(
            app[PG_POOL], forward_months=settings.audit_forward_months,
            retention_months=settings.audit_retention_months,
            interval_seconds=settings.audit_partition_interval_seconds,
        ), name="audit-partitions"),
        asyncio.create_task(run_housekeeping(
            app[PG_POOL], interval_seconds=settings.housekeeping_interval_seconds,
        ), name="housekeeping"),
    ]
    try:
        yield
    finally:
        await stop_tasks(*tasks)


def create_control_plane_app(settings: Settings) -> web.Application:
    """The control plane alone (``authio serve control-plane``)."""
    app = base_app(settings)
    setup_control_plane(app)
    return app
