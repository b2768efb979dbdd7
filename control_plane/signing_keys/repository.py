"""The SQL of signing keys (table ``signing_keys``; one ``active`` key per project by the partial
unique index ``signing_keys_one_active``). Every change to a project's keys holds the project's
row lock (:func:`lock_project`), so several control-plane processes never rotate twice, and
announces itself on ``common.jwks.CHANNEL`` in the same transaction (``pg_notify`` is delivered
at commit), so the engine reloads that project's keys at once."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final, Literal

import asyncpg

from common import jwks
from common.access_tokens import Alg
from control_plane.signing_keys.crypto import NewKey
from control_plane.signing_keys.schemas import SigningKey

LIST_COLUMNS: Final = "kid, alg, status, created_at, activated_at, retired_at, publish_until"
_ACTIVE: Final = ("SELECT kid, alg, private_sealed FROM signing_keys "
                  "WHERE project_id = $1 AND status = 'active'")
_PUBLISHED: Final = """
SELECT public_jwk, status FROM signing_keys
WHERE project_id = $1 AND (status IN ('active', 'pending') OR publish_until > now())
ORDER BY status = 'active' DESC, created_at DESC, kid DESC"""


_NOTIFY: Final = "SELECT pg_notify($1, $2)"


async def notify_changed(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> None:
    """Announce that ``project_id``'s keys changed (``common.jwks``), delivered when ``conn``'s
    transaction commits."""
    await conn.execute(_NOTIFY, jwks.CHANNEL, jwks.payload(project_id))


def signing_key(row: asyncpg.Record) -> SigningKey:
    return SigningKey(**row)


async def insert(conn: asyncpg.Connection, project_id: str, key: NewKey,
                 status: Literal["pending", "active"], *, unless_active: bool = False) -> bool:
    """Store ``key`` with ``status`` (an active key is stamped ``activated_at``). With
    ``unless_active``, a project that already has an active key keeps it and nothing is stored
    (the partial unique index decides, race-free). Returns whether the key was stored."""
    conflict = "ON CONFLICT (project_id) WHERE status = 'active' DO NOTHING" if unless_active else ""
    kid = await conn.fetchval(
        f"""INSERT INTO signing_keys (kid, project_id, alg, public_jwk, private_sealed, status,
                                      activated_at)
            VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $6 = 'active' THEN now() END)
            {conflict} RETURNING kid""",
        key.kid, project_id, key.alg, key.public_jwk, key.private_sealed, status,
    )
    if kid is not None:
        await notify_changed(conn, project_id)
    return kid is not None


async def active_key(conn: asyncpg.Connection | asyncpg.Pool,
                     project_id: str) -> asyncpg.Record | None:
    """The project's active key: ``kid``, ``alg``, ``private_sealed``."""
    row: asyncpg.Record | None = await conn.fetchrow(_ACTIVE, project_id)
    return row


async def published(conn: asyncpg.Connection | asyncpg.Pool,
                    project_id: str) -> list[asyncpg.Record]:
    """``public_jwk`` and ``status`` of the project's published keys, active first, then newest
    first."""
    rows: list[asyncpg.Record] = await conn.fetch(_PUBLISHED, project_id)
    return rows


async def project_alg(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, *,
                      lock: bool = False) -> Alg | None:
    """The project's ``signing_alg`` (None: no such project); ``lock`` takes the project's row
    lock for the caller's transaction, which serializes every key change of the project."""
    alg: Alg | None = await conn.fetchval(
        "SELECT signing_alg FROM projects WHERE id = $1" + (" FOR UPDATE" if lock else ""),
        project_id)
    return alg


async def set_project_alg(conn: asyncpg.Connection, project_id: str, alg: Alg) -> None:
    await conn.execute("UPDATE projects SET signing_alg = $2 WHERE id = $1", project_id, alg)


async def pending_key(conn: asyncpg.Connection, project_id: str) -> asyncpg.Record | None:
    """The project's pending key: ``kid`` and ``alg``."""
    row: asyncpg.Record | None = await conn.fetchrow(
        "SELECT kid, alg FROM signing_keys WHERE project_id = $1 AND status = 'pending'",
        project_id)
    return row


async def delete_key(conn: asyncpg.Connection, kid: str) -> None:
    await conn.execute("""WITH k AS (DELETE FROM signing_keys WHERE kid = $1 RETURNING project_id)
                          SELECT pg_notify($2, project_id) FROM k""", kid, jwks.CHANNEL)


async def retire_active(conn: asyncpg.Connection, project_id: str,
                        overlap: timedelta) -> asyncpg.Record | None:
    """Retire the project's active key, published ``overlap`` longer; its ``kid`` and ``alg``."""
    row: asyncpg.Record | None = await conn.fetchrow(
        """UPDATE signing_keys SET status = 'retired', retired_at = now(), publish_until = now() + $2
           WHERE project_id = $1 AND status = 'active' RETURNING kid, alg""",
        project_id, overlap,
    )
    if row is not None:
        await notify_changed(conn, project_id)
    return row


async def activate(conn: asyncpg.Connection, kid: str) -> None:
    await conn.execute(
        """WITH k AS (UPDATE signing_keys SET status = 'active', activated_at = now()
                      WHERE kid = $1 RETURNING project_id)
           SELECT pg_notify($2, project_id) FROM k""", kid, jwks.CHANNEL)


async def get_key(conn: asyncpg.Connection, kid: str) -> SigningKey:
    row = await conn.fetchrow(f"SELECT {LIST_COLUMNS} FROM signing_keys WHERE kid = $1", kid)
    assert row is not None
    return signing_key(row)


async def live_keys(conn: asyncpg.Connection, project_id: str) -> dict[str, asyncpg.Record]:
    """The project's active and pending keys by status: ``kid``, ``alg``, ``status``,
    ``active_for`` and ``published_for`` (intervals)."""
    rows = await conn.fetch(
        """SELECT kid, alg, status, now() - activated_at AS active_for,
                  now() - created_at AS published_for
           FROM signing_keys WHERE project_id = $1 AND status IN ('active', 'pending')""",
        project_id,
    )
    return {r["status"]: r for r in rows}


async def projects_due(conn: asyncpg.Connection | asyncpg.Pool,
                       active_for_seconds: float) -> list[str]:
    """Projects whose active key has been active at least ``active_for_seconds``."""
    rows = await conn.fetch(
        """SELECT project_id FROM signing_keys
           WHERE status = 'active' AND activated_at <= now() - make_interval(secs => $1)""",
        active_for_seconds,
    )
    return [r["project_id"] for r in rows]


async def delete_expired(conn: asyncpg.Connection | asyncpg.Pool, *, now: datetime | None = None,
                         project_id: str | None = None) -> list[str]:
    """Delete retired keys whose ``publish_until`` has passed (at ``now``, default the database
    clock), of one project or all, and announces each project concerned. Returns the deleted
    ``kid``s."""
    rows = await conn.fetch(
        """WITH d AS (
             DELETE FROM signing_keys
             WHERE status = 'retired' AND publish_until < coalesce($1::timestamptz, now())
               AND ($2::text IS NULL OR project_id = $2)
             RETURNING kid, project_id)
           SELECT kid, pg_notify($3, project_id) FROM d""",
        now, project_id, jwks.CHANNEL,
    )
    return [r["kid"] for r in rows]
