"""The risk engine's housekeeping: facts about users not seen for 180 days, and step-up
challenges 30 days past their expiry."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.db import delete_in_batches
from common.runtime import background, every
from control_plane.risk.repository import PURGES

log = logging.getLogger("authio.risk")


async def purge(pool: asyncpg.Pool) -> dict[str, int]:
    """Delete known devices, networks and countries not seen for ``repository.KNOWN_DAYS`` and
    challenges ``repository.CHALLENGE_KEEP_DAYS`` past their expiry. Rows deleted by table."""
    return {table: await delete_in_batches(pool, sql) for table, sql in PURGES.items()}


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The purge, now and every ``SERVICE_HOUSEKEEPING_INTERVAL_SECONDS``."""
    return background(risk_purge=every(
        app[SETTINGS].housekeeping_interval_seconds, functools.partial(purge, app[PG_POOL]),
        what="risk purge", logger=log))
