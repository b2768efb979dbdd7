"""The purge of tuple-write outcomes a day old (``Idempotency-Key`` replays last 24 hours)."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager

from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.runtime import background, every
from control_plane.authz import service

log = logging.getLogger("authio.authz")


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The purge, now and every ``SERVICE_HOUSEKEEPING_INTERVAL_SECONDS``."""
    return background(tuple_writes_purge=every(
        app[SETTINGS].housekeeping_interval_seconds,
        functools.partial(service.purge_writes, app[PG_POOL]),
        what="tuple-write purge", logger=log))
