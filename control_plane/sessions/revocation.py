"""Revoking sessions: the rows in PostgreSQL (the source of truth), then the revocation set in
Redis for verifiers at the edge (``common.revocations``: the contract)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Final

import asyncpg
from redis.asyncio import Redis

from common import revocations
from common.revocations import Revoked
from control_plane.sessions.schemas import SESSION_COLUMNS, Session

log = logging.getLogger("authio.sessions")

_REVOKE: Final = """UPDATE sessions SET status = 'revoked', revoked_at = now(), revoke_reason = $2
WHERE {where} AND status = 'active' RETURNING {columns}, access_expires_at"""


async def revoke_session(conn: asyncpg.Connection, session_id: str, *,
                         reason: str) -> tuple[Session, Revoked] | None:
    """Mark the session revoked in ``conn``'s transaction: (the session, the Revoked to publish
    after commit), or None when it was not active."""
    row = await conn.fetchrow(_REVOKE.format(where="id = $1", columns=SESSION_COLUMNS),
                              session_id, reason)
    if row is None:
        return None
    values = dict(row)
    access_expires_at = values.pop("access_expires_at")
    return Session(**values), revocations.revoked(session_id, access_expires_at)


async def revoke_user_sessions(conn: asyncpg.Connection, *, user_id: str,
                               reason: str) -> list[Revoked]:
    """Mark every active session of ``user_id`` revoked, in ``conn``'s transaction; publish the
    result with ``publish_revocations`` after commit."""
    rows = await conn.fetch(_REVOKE.format(where="user_id = $1", columns="id"), user_id, reason)
    return [revocations.revoked(r["id"], r["access_expires_at"]) for r in rows]


async def publish_revocations(redis: Redis, prefix: str, revoked: Sequence[Revoked]) -> None:
    """Add ``revoked`` to the Redis revocation set and publish each id.

    PostgreSQL stays the source of truth: a Redis failure is logged, not raised, since the
    revocation already committed and the control plane refuses the session either way.
    """
    if not revoked:
        return
    now = int(time.time())
    key = revocations.set_key(prefix)
    try:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {r.session_id: r.until for r in revoked}, gt=True)
            pipe.zremrangebyscore(key, "-inf", now)
            ttl = max(r.until for r in revoked) - now + 1
            pipe.expire(key, ttl, nx=True)  # a new set gets a lifetime ...
            pipe.expire(key, ttl, gt=True)  # ... and an existing one only ever a longer one
            for r in revoked:
                pipe.publish(revocations.channel(prefix), r.session_id)
            await pipe.execute()
    except Exception:
        log.exception("could not publish session revocations",
                      extra={"sessions": [r.session_id for r in revoked]})
