"""The purge of magic-link tokens a day past their expiry."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.db import delete_in_batches
from common.runtime import background, every
from control_plane.magic_links.repository import PURGE

log = logging.getLogger("authio.magic_links")


async def purge(pool: asyncpg.Pool) -> dict[str, int]:
    """Delete tokens a day past their expiry (until then a late click still hears "expired"
    rather than "not valid"). Rows deleted by table."""
    return {"magic_link_tokens": await delete_in_batches(pool, PURGE)}


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The purge, now and every ``SERVICE_HOUSEKEEPING_INTERVAL_SECONDS``."""
    return background(magic_links_purge=every(
        app[SETTINGS].housekeeping_interval_seconds, functools.partial(purge, app[PG_POOL]),
        what="magic-link purge", logger=log))
