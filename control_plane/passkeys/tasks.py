"""The purge of WebAuthn challenges that expired unspent."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.db import delete_in_batches
from common.runtime import background, every
from control_plane.passkeys.repository import PURGE

log = logging.getLogger("authio.passkeys")


async def purge(pool: asyncpg.Pool) -> dict[str, int]:
    """Delete challenges past their expiry that no verify spent (a verify spends its own).
    Rows deleted by table."""
    return {"webauthn_challenges": await delete_in_batches(pool, PURGE)}


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The purge, now and every ``SERVICE_HOUSEKEEPING_INTERVAL_SECONDS``."""
    return background(webauthn_challenges_purge=every(
        app[SETTINGS].housekeeping_interval_seconds, functools.partial(purge, app[PG_POOL]),
        what="WebAuthn challenge purge", logger=log))
