"""Dashboard operators' SQL (table ``operators``, migration 0019)."""

from __future__ import annotations

from typing import Final

import asyncpg

COLUMNS: Final = "id, tenant_id, email, name, user_id, created_at"
EMAIL_CONSTRAINT: Final = "operators_tenant_email"


async def insert(conn: asyncpg.Connection, *, operator_id: str, tenant_id: str, project_id: str,
                 user_id: str, email: str, name: str) -> asyncpg.Record:
    """A new operator. Raises asyncpg.UniqueViolationError (``EMAIL_CONSTRAINT``) when the
    tenant has an operator of that address already, in any case."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""INSERT INTO operators (id, tenant_id, project_id, user_id, email, name)
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING {COLUMNS}""",
        operator_id, tenant_id, project_id, user_id, email, name)
    return row


async def by_email(conn: asyncpg.Connection, tenant_id: str, email: str) -> str | None:
    """The id of the tenant's operator of ``email`` (compared case-insensitively), if any."""
    found: str | None = await conn.fetchval(
        "SELECT id FROM operators WHERE tenant_id = $1 AND lower(email) = lower($2)",
        tenant_id, email)
    return found


async def find(conn: asyncpg.Connection, tenant_id: str, operator_id: str, *,
               lock: bool = False) -> asyncpg.Record | None:
    """The tenant's operator, with its operator project (``project_id``)."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {COLUMNS}, project_id FROM operators WHERE id = $1 AND tenant_id = $2"
        + (" FOR UPDATE" if lock else ""), operator_id, tenant_id)
    return row


async def of_user(conn: asyncpg.Connection, project_id: str, user_id: str) -> asyncpg.Record | None:
    """The operator that the user ``user_id`` of the operator project ``project_id`` is."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {COLUMNS} FROM operators WHERE user_id = $1 AND project_id = $2",
        user_id, project_id)
    return row


async def everywhere(pool: asyncpg.Pool | asyncpg.Connection, email: str) -> list[asyncpg.Record]:
    """Every operator of ``email`` (case-insensitively), in any tenant: where a console sign-in
    link for that address goes (``project_id``, ``email`` as the operator was added, and the
    operator's ``user_id``)."""
    rows: list[asyncpg.Record] = await pool.fetch(
        "SELECT project_id, email, user_id FROM operators WHERE lower(email) = lower($1) ORDER BY id",
        email)
    return rows


async def by_user(conn: asyncpg.Connection | asyncpg.Pool, user_id: str) -> asyncpg.Record | None:
    """The operator whose user (in its tenant's operator project) is ``user_id``, whatever the
    project, with that project (``project_id``): a user id names one user of one project."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {COLUMNS}, project_id FROM operators WHERE user_id = $1", user_id)
    return row
