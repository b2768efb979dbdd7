"""Import workers: device authorizations expired for more than a day are deleted (a request
nobody approved leaves nothing behind), every :data:`PURGE_SECONDS`."""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Final

from aiohttp import web

from common.appkeys import PG_POOL
from common.runtime import background, every
from control_plane.imports import repository

log = logging.getLogger("authio.imports")

PURGE_SECONDS: Final = 3600.0
KEEP_EXPIRED: Final = timedelta(days=1)
"""How long an expired device authorization stays (its poll answers ``expired_token``)."""


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The purge, every :data:`PURGE_SECONDS`."""
    return background(device_authorization_purge=every(
        PURGE_SECONDS, functools.partial(repository.purge, app[PG_POOL], older_than=KEEP_EXPIRED),
        what="device authorization purge", logger=log))
