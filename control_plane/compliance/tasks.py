"""Compliance workers: data-subject deletions whose process died between anonymization batches
are resumed here (``service.anonymize``; SPEC.md 4 rule 2).

A deletion's batches run in the fulfil call itself, under a lease the batches extend
(``service.LEASE``). When the lease lapses (the process died, or the client went away and its
handler was cancelled), the next :func:`resume_pass` of any control-plane process takes the
lease and finishes the deletion: the same end state, since an event already scrubbed no longer
matches and scrubbing it again changes nothing. Looked at every :data:`RESUME_SECONDS`.
"""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractAsyncContextManager
from typing import Final

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL
from common.runtime import background, every
from control_plane.compliance import repository, service
from control_plane.web.actor import system_actor

log = logging.getLogger("authio.compliance")

RESUME_SECONDS: Final = 5.0
RESUME_BATCH: Final = 10
ACTOR: Final = system_actor("dsr-worker")


async def resume_pass(pool: asyncpg.Pool) -> int:
    """Finish every deletion whose lease lapsed; how many."""
    finished = 0
    for row in await pool.fetch(repository.LAPSED, RESUME_BATCH):
        taken = await repository.take_lease(pool, row["id"], service.LEASE)
        if taken is None:  # another process took it first
            continue
        log.warning("resuming data-subject deletion %s (its process stopped mid-way)", row["id"])
        await service.anonymize(pool, ACTOR, taken)
        finished += 1
    return finished


def workers(app: web.Application) -> AbstractAsyncContextManager[None]:
    """The resume pass, every :data:`RESUME_SECONDS`."""
    return background(dsr_resume=every(
        RESUME_SECONDS, functools.partial(resume_pass, app[PG_POOL]),
        what="data-subject deletion resume", logger=log, first_after=RESUME_SECONDS))
