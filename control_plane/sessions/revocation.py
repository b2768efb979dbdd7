"""Revocations: committed with the revoke, then announced to verifiers until Redis has them.

A revoke never waits on Redis. In the transaction that revokes a session (or an API key, for
``tenancy``) a row goes into the ``revocations`` outbox (migration 0005) and ``NOTIFY`` wakes the
announcer (:func:`announce`, run by ``tasks``), which puts it on Redis (``common.revocations``:
the set and channel of sessions; ``common.auth``: the channel of API keys), marks it announced,
and retries whatever failed on its next pass, every second. A Redis that comes back empty
(restarted without persistence, flushed) is noticed by the missing ``built`` key, and the set is
rebuilt from every session revocation whose ``until`` has not passed, so nothing that trusts the
set forgets a revoked session. The rows outlive the sessions they name (deleting a user deletes
its sessions) and are purged a day after their ``until``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

import asyncpg
from redis.asyncio import Redis

from common import revocations
from common.auth import revocation_channel as key_channel
from control_plane.sessions.schemas import SESSION_COLUMNS, Session

log = logging.getLogger("authio.sessions")

NOTIFY_CHANNEL: Final = "authio_revocations"
BATCH: Final = 500
KEY_RETENTION: Final = "1 day"
"""How long an API-key revocation row is kept once announced (caches forget a key within
seconds; the row is the record that it was announced)."""

_REVOKE: Final = """UPDATE sessions SET status = 'revoked', revoked_at = now(), revoke_reason = $2
WHERE {where} AND status = 'active' RETURNING {columns}, project_id, access_expires_at"""
_RECORD: Final = """
INSERT INTO revocations (kind, subject, project_id, until)
SELECT $1, s, $2, u FROM unnest($3::text[], $4::timestamptz[]) AS r(s, u)"""
_CLAIM: Final = """
SELECT id, kind, subject, until FROM revocations WHERE announced_at IS NULL
ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"""
_LIVE_SESSIONS: Final = """
SELECT subject, until FROM revocations WHERE kind = 'session' AND until > now()"""
PURGE: Final = """
DELETE FROM revocations WHERE id IN (
    SELECT id FROM revocations
    WHERE announced_at IS NOT NULL AND until < now() - interval '1 day' LIMIT $1)"""


async def _record(conn: asyncpg.Connection, kind: Literal["session", "api_key"], project_id: str,
                  entries: Sequence[tuple[str, datetime]]) -> None:
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
    await conn.execute(
        f"""INSERT INTO revocations (kind, subject, project_id, until)
            VALUES ('api_key', $1, $2, now() + interval '{KEY_RETENTION}')""",
        digest, project_id)
    await conn.execute("SELECT pg_notify($1, '')", NOTIFY_CHANNEL)


# --- the announcer -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Announced:
    """What one pass did: revocations announced, and whether the set was rebuilt first."""

    count: int
    rebuilt: bool


async def rebuild(pool: asyncpg.Pool, redis: Redis, prefix: str) -> int:
    """Put every session revocation whose ``until`` has not passed back into the set (``ZADD
    GT``: nothing already there loses time), then the marker. Returns how many."""
    rows = await pool.fetch(_LIVE_SESSIONS)
    now = int(time.time())
    key = revocations.set_key(prefix)
    async with redis.pipeline(transaction=True) as pipe:
        if rows:
            pipe.zadd(key, {r["subject"]: int(r["until"].timestamp()) for r in rows}, gt=True)
            ttl = max(int(r["until"].timestamp()) for r in rows) - now + 1
            pipe.expire(key, ttl, nx=True)
            pipe.expire(key, ttl, gt=True)
        pipe.set(revocations.built_key(prefix), now)
        await pipe.execute()
    return len(rows)


async def announce(pool: asyncpg.Pool, redis: Redis, prefix: str) -> Announced:
    """One pass: rebuild the set if Redis lost it, then announce the revocations not announced
    yet (oldest first, at most ``BATCH``), marking them announced once Redis has them. Raises
    what redis-py or asyncpg raise; the next pass retries."""
    rebuilt = False
    if not await redis.exists(revocations.built_key(prefix)):
        count = await rebuild(pool, redis, prefix)
        log.info("revocation set (re)built with %d live session revocations", count)
        rebuilt = True
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(_CLAIM, BATCH)
        if not rows:
            return Announced(0, rebuilt)
        sessions = {r["subject"]: int(r["until"].timestamp()) for r in rows if r["kind"] == "session"}
        now = int(time.time())
        key = revocations.set_key(prefix)
        async with redis.pipeline(transaction=True) as pipe:
            if sessions:
                pipe.zadd(key, sessions, gt=True)
                pipe.zremrangebyscore(key, "-inf", now)
                ttl = max(sessions.values()) - now + 1
                pipe.expire(key, ttl, nx=True)  # a new set gets a lifetime ...
                pipe.expire(key, ttl, gt=True)  # ... and an existing one only ever a longer one
            for r in rows:
                channel = (revocations.channel(prefix) if r["kind"] == "session"
                           else key_channel(prefix))
                pipe.publish(channel, r["subject"])
            await pipe.execute()
        await conn.execute("UPDATE revocations SET announced_at = now() WHERE id = ANY($1)",
                           [r["id"] for r in rows])
    return Announced(len(rows), rebuilt)
