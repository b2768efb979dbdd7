"""The rotation worker: a ``service.rotation_pass`` every ``SERVICE_SIGNING_KEY_CHECK_SECONDS``."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.runtime import background, every
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


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """Run the rotation worker while the app runs (a failed pass is retried at the next check)."""
    settings = app[SETTINGS]
    return background(signing_key_rotation=every(
        settings.signing_key_check_seconds,
        functools.partial(_pass, app[PG_POOL], app[KMS], settings),
        what="signing key rotation pass", logger=log))
