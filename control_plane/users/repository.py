"""Users SQL (table ``users``; unique per project on ``lower(email)`` and on ``phone_number``)."""

from __future__ import annotations

from typing import Any, Final

import asyncpg

from common.db import Params, Statement
from control_plane.audit import service as audit
from control_plane.magic_links import service as magic_links
from control_plane.users.schemas import USER_FIELDS, User

COLUMNS: Final = ", ".join(USER_FIELDS)
EMAIL_CONSTRAINT: Final = "users_project_email"
PHONE_CONSTRAINT: Final = "users_project_phone"


def user(row: asyncpg.Record) -> User:
    return User(**row)


async def find_by_email(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        email: str) -> User | None:
    """The project's user with ``email`` compared case-insensitively."""
    row = await conn.fetchrow(
        f"SELECT {COLUMNS} FROM users WHERE project_id = $1 AND lower(email) = lower($2)",
        project_id, email,
    )
    return user(row) if row is not None else None


async def find(conn: asyncpg.Connection | asyncpg.Pool, user_id: str, *,
               project_id: str | None = None, for_update: bool = False) -> User | None:
    """The user ``user_id`` (of ``project_id`` when given); its row locked for the caller's
    transaction with ``for_update``."""
    row = await conn.fetchrow(
        f"SELECT {COLUMNS} FROM users WHERE id = $1 AND ($2::text IS NULL OR project_id = $2)"
        + (" FOR UPDATE" if for_update else ""),
        user_id, project_id,
    )
    return user(row) if row is not None else None


def create_from(p: Params) -> str:
    """The CTEs of :data:`CREATE` writing the user (``u``: the new user's row, none when the
    project has a user with that email), its enrollment link and message and its
    ``user.created`` (``user_event``), from the parameters of ``service.create_params``: for a
    statement of another domain that goes on from ``u`` (SCIM's provisioning)."""
    columns = ("id", "project_id", "email", "email_verified", "phone_number", "name", "metadata")
    return f"""u AS (
    INSERT INTO users ({", ".join(columns)}) VALUES ({", ".join(p[c] for c in columns)})
    ON CONFLICT (project_id, lower(email)) WHERE email IS NOT NULL DO NOTHING
    RETURNING {COLUMNS}, project_id
), {magic_links.enrollment_from("u", p)},
user_event AS ({audit.insert_from("u", p, name="user_event")})"""


def _create_statement() -> Statement:
    p = Params()
    sql = f"""WITH {create_from(p)}
SELECT true AS created, {COLUMNS} FROM u
UNION ALL
SELECT false, {COLUMNS} FROM users
WHERE project_id = {p["project_id"]} AND lower(email) = lower({p["email"]})
  AND NOT EXISTS (SELECT FROM u)"""
    return Statement(sql, p)


CREATE: Final = _create_statement()
"""A user, its enrollment link and message (``magic_links.enrollment_params``) and its
``user.created`` (``audit.event_params(..., name="user_event")``) in one statement, so in
one round trip and atomic without a transaction of its own. When the project already has a
user with that email, nothing is written and the statement answers that user instead (as
the statement's snapshot saw it: a user committed by a concurrent creation after the snapshot
is neither written over nor seen, so there is no row at all)."""


async def create(conn: asyncpg.Connection,
                 values: dict[str, object]) -> tuple[User, bool] | None:
    """Run :data:`CREATE` with ``values`` by parameter name: the new user and True, the
    existing user with that email and False, or None when a concurrent creation of the email
    committed meanwhile (look again). Raises asyncpg.UniqueViolationError for a phone number
    in use."""
    row = await conn.fetchrow(CREATE.sql, *CREATE.params.bind(values))
    if row is None:
        return None
    return User(*row[1:]), row["created"]


async def update(conn: asyncpg.Connection, project_id: str, user_id: str,
                 changes: dict[str, Any]) -> User:
    """Set the ``changes`` (column names of ``USER_FIELDS``) and ``updated_at``. Raises
    asyncpg.UniqueViolationError, asyncpg.CheckViolationError (no contact left)."""
    p = Params()
    assignments = ", ".join(f"{name} = {p(value)}" for name, value in changes.items())
    row = await conn.fetchrow(
        f"""UPDATE users SET {assignments}, updated_at = now()
            WHERE id = {p(user_id)} AND project_id = {p(project_id)} RETURNING {COLUMNS}""",
        *p.values,
    )
    assert row is not None
    return user(row)


def update_from(p: Params, names: list[str]) -> str:
    """The CTEs (``user_update``, ``user_update_event``) setting the columns ``names`` (of
    ``USER_FIELDS``) and ``updated_at`` of one user and recording its ``user.updated``, from the
    parameters of ``service.update_params``: what :func:`update` and the event's insert write,
    in another domain's statement. Raises asyncpg.UniqueViolationError."""
    assignments = ", ".join(f"{name} = {p['user_set_' + name]}" for name in names)
    return f"""user_update AS (
    UPDATE users SET {assignments}, updated_at = now()
    WHERE id = {p["user_id"]} AND project_id = {p["user_project_id"]} RETURNING id, updated_at
), user_update_event AS ({audit.insert_from("user_update", p, name="user_update_event")})"""


async def delete(conn: asyncpg.Connection, user_id: str) -> None:
    """Delete the user; memberships, sessions, refresh and magic-link tokens cascade."""
    await conn.execute("DELETE FROM users WHERE id = $1", user_id)


async def count(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> int:
    total: int = await conn.fetchval("SELECT count(*) FROM users WHERE project_id = $1", project_id)
    return total
