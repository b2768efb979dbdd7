"""Import workers, every :data:`PURGE_SECONDS`: device authorizations expired for more than a
day are deleted (a request nobody approved leaves nothing behind), and live-import credentials
past their 24 hours (SPEC.md 4 rule 6: the credential row is deleted within 24 hours)."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Final

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL
from common.runtime import background, every
from control_plane.imports import repository

log = logging.getLogger("authio.imports")

PURGE_SECONDS: Final = 300.0
KEEP_EXPIRED: Final = timedelta(days=1)
"""How long an expired device authorization stays (its poll answers ``expired_token``)."""


async def purge_pass(pool: asyncpg.Pool) -> tuple[int, int]:
    """Delete what has outlived its time: (device authorizations, live-import credentials)."""
    devices = await repository.purge(pool, older_than=KEEP_EXPIRED)
    credentials = await repository.purge_credentials(pool)
    if credentials:
        log.info("deleted %d live-import credentials past their 24 hours", credentials)
    return devices, credentials


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The purge, every :data:`PURGE_SECONDS` (the first at start)."""
    return background(import_purge=every(
        PURGE_SECONDS, functools.partial(purge_pass, app[PG_POOL]), what="import purge",
        logger=log))
