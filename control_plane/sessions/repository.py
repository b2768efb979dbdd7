"""Sessions SQL: the sign-in statement, refresh, organization changes, the current session, and
the purge of ended sessions (tables ``sessions`` and ``refresh_tokens``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

import asyncpg

from common.db import Params, Statement
from control_plane.audit import service as audit
from control_plane.risk import service as risk
from control_plane.sessions.revocation import PURGE as REVOCATIONS_PURGE
from control_plane.sessions.schemas import SESSION_COLUMNS, Session
from control_plane.users.schemas import USER_FIELDS, User

USER_COLUMNS: Final = ", ".join(USER_FIELDS)
KEEP_GENERATIONS: Final = 100

Head = Callable[[Params], str]
"""CTEs that start a sign-in statement: they define ``u``, the user's row (``USER_COLUMNS``),
and may define more, which the statement's ``gate`` then names."""


def user_update(p: Params, *, condition: str = "") -> str:
    """The CTE ``u`` of a sign-in of an existing user: ``last_sign_in_at`` set when
    ``signing_in`` (not for a sign-in the risk engine refused), and the channel the sign-in
    proved (``verified_email``, ``verified_sms``) marked verified; ``condition`` further limits
    it (``AND ...``)."""
    return f"""u AS (
    UPDATE users SET last_sign_in_at = CASE WHEN {p['signing_in']} THEN now() ELSE last_sign_in_at END,
           email_verified = email_verified OR {p['verified_email']},
           phone_verified = phone_verified OR {p['verified_sms']}
    WHERE id = {p['user_id']} {condition} RETURNING {USER_COLUMNS})"""


@functools.cache
def sign_in_statement(head: Head = user_update, gate: str = "") -> Statement:
    """The statement that signs a user in: ``head`` (the user's row ``u``), then the
    organization picked, the session, its first refresh token and the audit event (merged with
    the organization picked), answering the session, the role and the user's fields (prefixed
    ``user_``). With ``gate`` (``", t"``), the session is inserted only if the CTEs it names
    yield rows, else the statement writes nothing of its own and answers no row.

    Parameters: ``session_id``, ``project_id``, ``user_id``, ``organization_id`` (the one to
    select, or null: the user's only active one), ``auth_method``, ``ip``, ``user_agent``,
    ``session_ttl`` (interval), ``access_expires`` (Unix seconds), ``refresh_hash``,
    ``verified_email``, ``verified_sms``, ``signing_in`` (true), the event's
    (``audit.event_params``), the risk engine's (``risk.allowed_values``), and the head's.
    Assembled once per head: a sign-in is a hot path.
    """
    p = Params()
    head_sql = head(p)
    user_fields = ", ".join(f"u.{f} AS user_{f}" for f in USER_FIELDS)
    sql = f"""
WITH {head_sql},
m AS (
    SELECT organization_id, role FROM memberships
    WHERE user_id = {p['user_id']} AND status = 'active'
      AND ({p['organization_id']}::text IS NULL OR organization_id = {p['organization_id']})
    LIMIT 2
), pick AS (
    SELECT CASE WHEN count(*) = 1 THEN min(organization_id) END AS organization_id,
           CASE WHEN count(*) = 1 THEN min(role) END AS role
    FROM m
), s AS (
    INSERT INTO sessions (id, project_id, user_id, organization_id, auth_method, ip, user_agent,
                          expires_at, access_expires_at)
    SELECT {p['session_id']}, {p['project_id']}, {p['user_id']}, pick.organization_id,
           {p['auth_method']}, {p['ip']}, {p['user_agent']},
           now() + {p['session_ttl']}::interval, to_timestamp({p['access_expires']})
    FROM pick, u{gate}
    RETURNING {SESSION_COLUMNS}
), r AS (
    INSERT INTO refresh_tokens (token_hash, session_id, generation)
    SELECT {p['refresh_hash']}, s.id, 1 FROM s
), e AS (
    {audit.insert_from("s", p, more_metadata="jsonb_build_object('organization_id', s.organization_id)")}
), {risk.allowed_ctes(p)}
SELECT s.*, pick.role, {user_fields} FROM s, pick, u
"""
    return Statement(sql, p)


@functools.cache
def refusal_statement(head: Head = user_update, gate: str = "") -> Statement:
    """The statement of a sign-in the risk engine refused (``challenge`` or ``block``): ``head``
    as a sign-in runs it (a link is used up, a passkey's counter moves, a first sign-in's user
    is created: the proof was good), then, when the head and ``gate`` yield rows, the decision,
    the step-up challenge of a ``challenge`` and the events (``risk.refused_ctes``), and no
    session. Answers ``risk.REFUSED_SELECT``'s row, or none when the gate failed (nothing of
    its own written)."""
    p = Params()
    sql = f"WITH {head(p)},\n{risk.refused_ctes(p, gate)}\n{risk.REFUSED_SELECT}"
    return Statement(sql, p)


def session_of(row: asyncpg.Record, role: str | None) -> Session:
    """The session of a row holding ``SESSION_COLUMNS``; ``role`` only while an organization is
    selected."""
    values = {k: row[k] for k in SESSION_COLUMNS.split(", ")}
    return Session(**values, role=role if values["organization_id"] else None)


def user_of(row: asyncpg.Record, prefix: str = "") -> User:
    """The user of a row holding its fields (each prefixed ``prefix``)."""
    return User(**{f: row[prefix + f] for f in USER_FIELDS})


async def find_user(conn: asyncpg.Connection, user_id: str) -> User | None:
    row = await conn.fetchrow(f"SELECT {USER_COLUMNS} FROM users WHERE id = $1", user_id)
    return user_of(row) if row is not None else None


async def find_session(conn: asyncpg.Connection, session_id: str, *,
                       for_update: bool = False) -> asyncpg.Record | None:
    """The session's ``SESSION_COLUMNS``, ``project_id`` and ``expired``."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""SELECT {SESSION_COLUMNS}, project_id, now() > expires_at AS expired FROM sessions
            WHERE id = $1 {"FOR UPDATE" if for_update else ""}""",
        session_id,
    )
    return row


async def active_role(conn: asyncpg.Connection, user_id: str, org_id: str, *,
                      project_id: str | None = None) -> str | None:
    """The user's role in the organization while the membership is active (and the
    organization is of ``project_id``, when given); else None."""
    role: str | None = await conn.fetchval(
        """SELECT m.role FROM memberships m JOIN organizations o ON o.id = m.organization_id
           WHERE m.user_id = $1 AND m.organization_id = $2 AND m.status = 'active'
             AND ($3::text IS NULL OR o.project_id = $3)""",
        user_id, org_id, project_id,
    )
    return role


async def select_organization(conn: asyncpg.Connection, session_id: str, org_id: str,
                              access_expires: int) -> asyncpg.Record:
    """Set the session's organization; the latest access token's expiry never goes back."""
    row = await conn.fetchrow(
        f"""UPDATE sessions SET organization_id = $2,
                   access_expires_at = greatest(access_expires_at, to_timestamp($3))
            WHERE id = $1 RETURNING {SESSION_COLUMNS}""",
        session_id, org_id, access_expires,
    )
    assert row is not None
    return row


REFRESH: Final = "SELECT * FROM authio_refresh_session($1, $2, $3, to_timestamp($4))"
"""The rotation in one call of the plpgsql function (migration 0005's, outcomes ``unknown``,
``revoked``, ``expired``, ``reused``, ``rotated``, ``replayed``): it locks the session, then
reads the token's state (see ``service.refresh``). Arguments: the presented token's digest, its
successor's digest, the grace (interval), the new access token's expiry (Unix seconds)."""

PURGES: Final = {
    # Sessions a day past their end: expired, or revoked with no access token of theirs still
    # valid (the Redis revocation set covers those until then); refresh tokens go with them.
    "sessions": """
        DELETE FROM sessions WHERE id IN (
            SELECT id FROM sessions
            WHERE expires_at < now() - interval '1 day'
               OR (status = 'revoked' AND access_expires_at < now() - interval '1 day') LIMIT $1)""",
    # Refresh generations more than KEEP_GENERATIONS behind a live session's newest: a token
    # that old presented again is then merely unknown (refused) rather than recognised as reuse
    # (refused, and the session revoked).
    # Revocations a day past their ``until``: no token of theirs verifies any more.
    "revocations": REVOCATIONS_PURGE,
    "refresh_tokens": f"""
        DELETE FROM refresh_tokens WHERE token_hash IN (
            SELECT t.token_hash FROM refresh_tokens t
            JOIN (SELECT session_id, max(generation) AS latest FROM refresh_tokens
                  GROUP BY session_id HAVING max(generation) > {KEEP_GENERATIONS}) s
              ON s.session_id = t.session_id
            WHERE t.generation <= s.latest - {KEEP_GENERATIONS} LIMIT $1)""",
}
