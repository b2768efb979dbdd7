"""The purge of setup links a day after they ended (their token unused and expired, or their
portal session over)."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.db import delete_in_batches
from common.runtime import background, every
from control_plane.portal.repository import PURGE

log = logging.getLogger("authio.portal")


async def purge(pool: asyncpg.Pool) -> dict[str, int]:
    """Delete links whose token or session ended over a day ago. Rows deleted by table."""
    return {"portal_links": await delete_in_batches(pool, PURGE)}


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The purge, now and every ``SERVICE_HOUSEKEEPING_INTERVAL_SECONDS``."""
    return background(portal_links_purge=every(
        app[SETTINGS].housekeeping_interval_seconds, functools.partial(purge, app[PG_POOL]),
        what="admin portal link purge", logger=log))
