"""The session domain's workers: the revocation announcer, and the purge of ended sessions."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from contextlib import AbstractAsyncContextManager
from typing import Final

import asyncpg
from aiohttp import web
from redis.asyncio import Redis

from common.appkeys import PG_POOL, REDIS, SETTINGS
from common.db import delete_in_batches, listen_forever
from common.runtime import background, every, stop_tasks
from common.settings import Settings
from control_plane.sessions.repository import PURGES
from control_plane.sessions.revocation import BATCH, NOTIFY_CHANNEL, announce

log = logging.getLogger("authio.sessions")

ANNOUNCE_POLL_SECONDS: Final = 1.0
"""How often the announcer looks without being woken: a revocation whose announcement failed
is retried, and a Redis that lost the set is noticed, within this time."""
LISTEN_APPLICATION_NAME: Final = "authio-revocations-listen"


async def purge(pool: asyncpg.Pool) -> dict[str, int]:
    """Delete sessions a day past their end (expired, or revoked with no access token of theirs
    still valid) with their refresh tokens, revocations a day past their ``until``, and refresh
    generations more than ``repository.KEEP_GENERATIONS`` behind a live session's newest. Rows
    deleted by table."""
    return {table: await delete_in_batches(pool, sql) for table, sql in PURGES.items()}


async def run_announcer(pool: asyncpg.Pool, redis: Redis, settings: Settings) -> None:
    """Announce committed revocations on Redis until cancelled (``revocation.announce``): woken
    at once by the revoke's ``NOTIFY``, else every ``ANNOUNCE_POLL_SECONDS``; a pass that fails
    (Redis or PostgreSQL away) is logged and the next one retries, so a revocation reaches Redis
    as soon as Redis is back, and a set Redis lost is rebuilt."""
    wake = asyncio.Event()
    listener = asyncio.create_task(listen_forever(
        settings.database_url, NOTIFY_CHANNEL, wake, application_name=LISTEN_APPLICATION_NAME,
        logger=log), name="revocations-listen")
    failing = False
    try:
        while True:
            wake.clear()  # before the pass: a NOTIFY during it wakes the next wait
            try:
                done = await announce(pool, redis, settings.redis_prefix)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:
                    log.warning("could not announce revocations (%s: %s); retrying every %.0f s",
                                type(exc).__name__, exc, ANNOUNCE_POLL_SECONDS)
                failing = True
            else:
                if failing:
                    log.info("announcing revocations again")
                failing = False
                if done >= BATCH:
                    continue  # a full batch: more may be waiting
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ANNOUNCE_POLL_SECONDS):
                    await wake.wait()
    finally:
        await stop_tasks(listener)


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The revocation announcer, and the purge now and every
    ``SERVICE_HOUSEKEEPING_INTERVAL_SECONDS``."""
    pool, settings = app[PG_POOL], app[SETTINGS]
    return background(
        revocation_announcer=run_announcer(pool, app[REDIS], settings),
        sessions_purge=every(settings.housekeeping_interval_seconds,
                             functools.partial(purge, pool), what="session purge", logger=log),
    )
