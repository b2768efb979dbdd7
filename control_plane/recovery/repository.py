"""Recovery SQL (table ``recovery_requests``, migration 0017)."""

from __future__ import annotations

from typing import Final

import asyncpg

COLUMNS: Final = ("id, user_id, channel, destination, reason, status, decision_note, decided_by, "
                  "decided_at, message_id, created_at")


async def insert(conn: asyncpg.Connection, *, request_id: str, project_id: str, user_id: str,
                 channel: str, destination: str, reason: str | None) -> asyncpg.Record:
    """A pending request. The caller holds the user's row locked and checked ``pending_of``
    (the unique index ``recovery_requests_one_pending`` stands behind that)."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""INSERT INTO recovery_requests (id, project_id, user_id, channel, destination, reason)
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING {COLUMNS}""",
        request_id, project_id, user_id, channel, destination, reason)
    return row


async def pending_of(conn: asyncpg.Connection, user_id: str) -> str | None:
    """The id of the user's pending request, if any."""
    found: str | None = await conn.fetchval(
        "SELECT id FROM recovery_requests WHERE user_id = $1 AND status = 'pending'", user_id)
    return found


async def find(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, request_id: str, *,
               lock: bool = False) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {COLUMNS} FROM recovery_requests WHERE id = $1 AND project_id = $2"
        + (" FOR UPDATE" if lock else ""), request_id, project_id)
    return row


async def decide(conn: asyncpg.Connection, request_id: str, *, status: str, note: str | None,
                 decided_by: str | None, message_id: str | None) -> asyncpg.Record:
    row: asyncpg.Record = await conn.fetchrow(
        f"""UPDATE recovery_requests
            SET status = $2, decision_note = $3, decided_by = $4, decided_at = now(),
                message_id = $5
            WHERE id = $1 RETURNING {COLUMNS}""",
        request_id, status, note, decided_by, message_id)
    return row
