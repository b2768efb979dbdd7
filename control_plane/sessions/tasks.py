"""The purge of ended sessions and of refresh generations long superseded."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.db import delete_in_batches
from common.runtime import background, every
from control_plane.sessions.repository import PURGES

log = logging.getLogger("authio.sessions")


async def purge(pool: asyncpg.Pool) -> dict[str, int]:
    """Delete sessions a day past their end (expired, or revoked with no access token of theirs
    still valid) with their refresh tokens, and refresh generations more than
    ``repository.KEEP_GENERATIONS`` behind a live session's newest. Rows deleted by table."""
    return {table: await delete_in_batches(pool, sql) for table, sql in PURGES.items()}


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The purge, now and every ``SERVICE_HOUSEKEEPING_INTERVAL_SECONDS``."""
    return background(sessions_purge=every(
        app[SETTINGS].housekeeping_interval_seconds, functools.partial(purge, app[PG_POOL]),
        what="session purge", logger=log))
