"""Revocations: committed with the revoke, then announced to verifiers until Redis has them.

A revoke never waits on Redis. In the transaction that revokes a session (or an API key, for
``tenancy``) a row goes into the ``revocations`` outbox (migration 0005) and ``NOTIFY`` wakes the
announcer (:func:`announce`, run by ``tasks``). The announcer leases a batch of unannounced rows
(``claimed_until``; no transaction is held while it talks to Redis), puts them on Redis
(``common.revocations``: the set and channel of sessions; ``common.auth``: the channel of API
keys), then marks them announced; what failed is released and retried on the next pass, every
second. Announcing twice is harmless (``ZADD GT``; a second message drops a key already dropped).

Redis can lose what it was told: restarted without persistence, flushed, rolled back to an older
snapshot, or replaced by a replica that lagged. The sorted set ``<set>:announced``
(``common.revocations.announced_key``) scores the highest revocation id announced to this
Redis, written in the same ``MULTI`` as the set; when it is missing or behind PostgreSQL's, the
set is rebuilt from every session revocation whose ``until`` has not passed, and each is
published again for verifiers that mirror the set.
The rows outlive the sessions they name (deleting a user deletes its sessions) and are purged a
day after their ``until`` (for an API key, its revocation time: it matters until announced).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final, Literal

import asyncpg
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from common import revocations
from common.auth import revocation_channel as key_channel
from control_plane.sessions.schemas import SESSION_COLUMNS, Session

log = logging.getLogger("authio.sessions")

NOTIFY_CHANNEL: Final = "authio_revocations"
BATCH: Final = 500
LEASE: Final = "30 seconds"
"""How long an announcer holds the rows it claimed before another may take them (it releases
them at once when Redis fails; the lease covers an announcer that died)."""
HIGH_WATER: Final = "announced"
"""The member of ``announced_key`` whose score is the highest revocation id announced."""

_REVOKE: Final = """UPDATE sessions SET status = 'revoked', revoked_at = now(), revoke_reason = $2
WHERE {where} AND status = 'active' RETURNING {columns}, project_id, access_expires_at"""
_RECORD: Final = """
INSERT INTO revocations (kind, subject, project_id, until)
SELECT $1, s, $2, u FROM unnest($3::text[], $4::timestamptz[]) AS r(s, u)"""
_CLAIM: Final = f"""
UPDATE revocations SET claimed_until = now() + interval '{LEASE}'
WHERE id IN (SELECT id FROM revocations
             WHERE announced_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, kind, subject, until, created_at"""
_ANNOUNCED: Final = "UPDATE revocations SET announced_at = now() WHERE id = ANY($1)"
_RELEASE: Final = "UPDATE revocations SET claimed_until = NULL WHERE id = ANY($1)"
_HIGH_WATER: Final = "SELECT coalesce(max(id), 0) FROM revocations WHERE announced_at IS NOT NULL"
_LIVE_SESSIONS: Final = f"""
SELECT subject, until, created_at, ({_HIGH_WATER}) AS high_water FROM revocations
WHERE kind = 'session' AND until > now()"""
PURGE: Final = """
DELETE FROM revocations WHERE id IN (
    SELECT id FROM revocations
    WHERE announced_at IS NOT NULL AND until < now() - interval '1 day' LIMIT $1)"""


async def _record(conn: asyncpg.Connection, kind: Literal["session", "api_key"], project_id: str,
                  entries: Sequence[tuple[str, datetime]]) -> None:
    """Insert the revocations ``entries`` (subject, until) and wake the announcers, in ``conn``'s
    transaction (the ``NOTIFY`` is delivered at commit)."""
    if entries:
        await conn.execute(_RECORD, kind, project_id, [s for s, _ in entries],
                           [u for _, u in entries])
        await conn.execute("SELECT pg_notify($1, '')", NOTIFY_CHANNEL)


async def revoke_session(conn: asyncpg.Connection, session_id: str, *,
                         reason: str) -> Session | None:
    """Mark the session revoked and record its revocation for the announcer, in ``conn``'s
    transaction; None when it was not active."""
    row = await conn.fetchrow(_REVOKE.format(where="id = $1", columns=SESSION_COLUMNS),
                              session_id, reason)
    if row is None:
        return None
    values = dict(row)
    access_expires_at, project_id = values.pop("access_expires_at"), values.pop("project_id")
    await _record(conn, "session", project_id, [(session_id, revocations.until(access_expires_at))])
    return Session(**values)


async def revoke_user_sessions(conn: asyncpg.Connection, *, user_id: str, reason: str) -> int:
    """Mark every active session of ``user_id`` revoked and record the revocations, in ``conn``'s
    transaction. Returns how many."""
    rows = await conn.fetch(_REVOKE.format(where="user_id = $1", columns="id"), user_id, reason)
    if rows:
        await _record(conn, "session", rows[0]["project_id"],
                      [(r["id"], revocations.until(r["access_expires_at"])) for r in rows])
    return len(rows)


async def record_key_revocation(conn: asyncpg.Connection, *, project_id: str,
                                digest: str) -> None:
    """Record, in ``conn``'s transaction, that the API key of secret hash ``digest`` was revoked,
    for the announcer to tell every process's cache."""
    await _record(conn, "api_key", project_id, [(digest, datetime.now(UTC))])


# --- the announcer -----------------------------------------------------------------------------


def _add_to_set(pipe: Pipeline, prefix: str, sessions: dict[str, int], now: int) -> None:
    """Queue on ``pipe``: the ``sessions`` (id -> until, Unix seconds) into the set, never
    shortening a score (``GT``), past members dropped, and the set's lifetime extended to its
    latest ``until``, never shortened."""
    key = revocations.set_key(prefix)
    pipe.zadd(key, sessions, gt=True)
    pipe.zremrangebyscore(key, "-inf", now)
    ttl = max(sessions.values()) - now + 1
    pipe.expire(key, ttl, nx=True)  # a new set gets a lifetime ...
    pipe.expire(key, ttl, gt=True)  # ... and an existing one only ever a longer one


async def _needs_rebuild(pool: asyncpg.Pool, redis: Redis, prefix: str) -> bool:
    """Whether Redis has lost announced revocations: its high-water mark is missing or behind
    PostgreSQL's. PostgreSQL is read first: a revocation it shows announced was on Redis before
    that commit, so a concurrent announcer never makes this look behind."""
    announced = await pool.fetchval(_HIGH_WATER)
    seen = await redis.zscore(revocations.announced_key(prefix), HIGH_WATER)
    return seen is None or seen < announced


async def rebuild(pool: asyncpg.Pool, redis: Redis, prefix: str) -> int:
    """Put every session revocation whose ``until`` has not passed back into the set and publish
    each again, then raise the high-water mark to what PostgreSQL had announced. Returns how
    many sessions."""
    rows = await pool.fetch(_LIVE_SESSIONS)
    high_water = rows[0]["high_water"] if rows else await pool.fetchval(_HIGH_WATER)
    sessions = {r["subject"]: int(r["until"].timestamp()) for r in rows}
    async with redis.pipeline(transaction=True) as pipe:
        if sessions:
            _add_to_set(pipe, prefix, sessions, int(time.time()))
            for r in rows:
                pipe.publish(revocations.channel(prefix),
                             revocations.message(r["subject"], r["created_at"]))
        pipe.zadd(revocations.announced_key(prefix), {HIGH_WATER: high_water}, gt=True)
        await pipe.execute()
    return len(sessions)


async def announce(pool: asyncpg.Pool, redis: Redis, prefix: str) -> int:
    """One pass: rebuild the set if Redis lost revocations (:func:`rebuild`), then announce
    those not announced yet (oldest first, at most ``BATCH``) and mark them announced. Returns
    how many were announced. Raises what redis-py or asyncpg raise; the rows of a failed pass
    are released for the next one."""
    if await _needs_rebuild(pool, redis, prefix):
        count = await rebuild(pool, redis, prefix)
        log.info("revocation set rebuilt on Redis with %d live session revocations", count)
    rows = await pool.fetch(_CLAIM, BATCH)
    if not rows:
        return 0
    ids = [r["id"] for r in rows]
    try:
        async with redis.pipeline(transaction=True) as pipe:
            sessions = {r["subject"]: int(r["until"].timestamp())
                        for r in rows if r["kind"] == "session"}
            if sessions:
                _add_to_set(pipe, prefix, sessions, int(time.time()))
            for r in rows:
                if r["kind"] == "session":
                    pipe.publish(revocations.channel(prefix),
                                 revocations.message(r["subject"], r["created_at"]))
                else:
                    pipe.publish(key_channel(prefix), r["subject"])
            pipe.zadd(revocations.announced_key(prefix), {HIGH_WATER: max(ids)}, gt=True)
            await pipe.execute()
    except BaseException:
        with contextlib.suppress(Exception):
            await pool.execute(_RELEASE, ids)
        raise
    await pool.execute(_ANNOUNCED, ids)
    return len(rows)
