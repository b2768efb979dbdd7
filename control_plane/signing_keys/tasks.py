"""The rotation worker: a ``service.rotation_pass`` every ``SERVICE_SIGNING_KEY_CHECK_SECONDS``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.runtime import every, stop_tasks
from common.settings import Settings
from control_plane.appkeys import KMS
from control_plane.kms import LocalKms
from control_plane.signing_keys.service import rotation_pass

log = logging.getLogger("authio.signing_keys")


async def _pass(pool: asyncpg.Pool, kms: LocalKms, settings: Settings) -> None:
    done = await rotation_pass(pool, kms, settings)
    if done.published or done.rotated or done.deleted:
        log.info("signing keys: published %d, rotated %d, deleted %d",
                 len(done.published), len(done.rotated), len(done.deleted))


@contextlib.asynccontextmanager
async def workers(app: web.Application) -> AsyncIterator[None]:
    """Run the rotation worker while the app runs (a failed pass is retried at the next check)."""
    pool, kms, settings = app[PG_POOL], app[KMS], app[SETTINGS]
    task = asyncio.create_task(every(
        settings.signing_key_check_seconds, lambda: _pass(pool, kms, settings),
        what="signing key rotation pass", logger=log,
    ), name="signing-key-rotation")
    try:
        yield
    finally:
        await stop_tasks(task)
