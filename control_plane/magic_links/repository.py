"""Magic-link SQL (table ``magic_link_tokens``: a token is stored as its SHA-256 digest only),
including the CTEs that make a sign-in statement conditional on the link
(``sessions.service.start_session`` runs them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

import asyncpg

from common.db import Params, Statement
from control_plane.audit import service as audit
from control_plane.risk import service as risk
from control_plane.sessions import service as sessions
from control_plane.users.schemas import USER_FIELDS

_USER_COLUMNS: Final = ", ".join(USER_FIELDS)


async def insert_token(conn: asyncpg.Connection, *, token_hash: bytes, project_id: str,
                       purpose: str, channel: str, destination: str, user_id: str | None,
                       invitation_id: str | None, ttl: timedelta,
                       step_up_id: str | None = None) -> str:
    """Store a token and return its project's name (for the message), in one round trip."""
    name: str = await conn.fetchval(
        """INSERT INTO magic_link_tokens (token_hash, project_id, purpose, channel, destination,
                                          user_id, invitation_id, expires_at, step_up_id)
           VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8::interval, $9)
           RETURNING (SELECT name FROM projects WHERE id = $2)""",
        token_hash, project_id, purpose, channel, destination, user_id, invitation_id, ttl,
        step_up_id,
    )
    return name


def enrollment_token_from(source: str, p: Params) -> str:
    """SQL storing an enrollment token (``link_token_hash``, lasting ``link_ttl``) for each user
    row of ``source`` (columns ``id``, ``project_id``, ``email``)."""
    return f"""INSERT INTO magic_link_tokens (token_hash, project_id, purpose, channel, destination,
                                      user_id, expires_at)
SELECT {p['link_token_hash']}, project_id, 'enrollment', 'email', email, id,
       now() + {p['link_ttl']}::interval FROM {source}"""


async def user_id_by_destination(conn: asyncpg.Connection, project_id: str, channel: str,
                                 destination: str) -> str | None:
    """The id of the project's user with that email (case-insensitively) or phone number."""
    column = "lower(email) = lower($2)" if channel == "email" else "phone_number = $2"
    user_id: str | None = await conn.fetchval(
        f"SELECT id FROM users WHERE project_id = $1 AND {column}", project_id, destination)
    return user_id


# The user a token's destination names (the token as ``t``).
_FOUND_USER: Final = """LEFT JOIN LATERAL (
    SELECT id FROM users
    WHERE t.channel = 'email' AND project_id = t.project_id AND lower(email) = lower(t.destination)
    UNION ALL
    SELECT id FROM users
    WHERE t.channel = 'sms' AND project_id = t.project_id AND phone_number = t.destination
) found ON true"""

def _lookup(*, scored: bool) -> Statement:
    p = Params()
    history = risk.history_join(p, project="t.project_id", user="found.id") if scored else ""
    sql = f"""
SELECT t.project_id, t.purpose, t.channel, t.destination, t.user_id, found.id AS found_user_id
       {", h.*" if scored else ""}
FROM magic_link_tokens t {_FOUND_USER}
{history}
WHERE t.token_hash = {p['token_hash']} AND t.consumed_at IS NULL AND t.expires_at > now()
  AND ({p['named_project']}::text IS NULL OR t.project_id = {p['named_project']})
  AND t.purpose IN ('signin', 'enrollment', 'recovery')
"""
    return Statement(sql, p)


LOOKUPS: Final = {scored: _lookup(scored=scored) for scored in (True, False)}
"""The fast path's read, without a lock: a usable sign-in, enrollment or recovery link (not an
invitation's or a step-up's) of hash ``token_hash`` (of project ``named_project`` when named),
with the user it names and, when the sign-in is scored (``True``), what the risk engine will
score it against (``risk.history_join``, parameters ``risk_*``)."""

CONSUME: Final = f"""
WITH t AS (
    UPDATE magic_link_tokens SET consumed_at = now()
    WHERE token_hash = $1 AND consumed_at IS NULL AND expires_at > now()
      AND ($2::text IS NULL OR project_id = $2)
    RETURNING project_id, purpose, channel, destination, user_id, invitation_id, step_up_id
)
SELECT t.*, found.id AS found_user_id FROM t {_FOUND_USER}
"""
"""The general path: the token is used up and its user looked up in one statement."""

LOCK_USER: Final = f"""
SELECT 1 FROM users WHERE id = (
    SELECT found.id FROM magic_link_tokens t {_FOUND_USER} WHERE t.token_hash = $1 LIMIT 1)
FOR NO KEY UPDATE"""
"""The general path locks the user the link names (if any) before the link: DELETE
/v1/users locks the user, then its links through the foreign key, so the same order cannot
deadlock."""

STATE: Final = f"""
SELECT t.project_id, coalesce(t.user_id, found.id) AS user_id, t.purpose, t.channel,
       CASE WHEN t.consumed_at IS NOT NULL THEN 'consumed'
            WHEN t.expires_at <= now() THEN 'expired' END AS state
FROM magic_link_tokens t {_FOUND_USER} WHERE t.token_hash = $1"""
"""Why a token could not be used: ``consumed`` or ``expired`` (or no row: unknown), and whose
it is: the user it was sent to, else the user of its destination (a first sign-in's link names
nobody when sent; its replays are that user's failed attempts)."""


def _use_token(p: Params, condition: str) -> str:
    """The CTE ``t``: the link used up only if still usable, still the lookup's, and
    ``condition``."""
    return f"""t AS (
    UPDATE magic_link_tokens SET consumed_at = now()
    WHERE token_hash = {p['token_hash']} AND consumed_at IS NULL AND expires_at > now()
      AND project_id = {p['project_id']} AND purpose IN ('signin', 'enrollment', 'recovery')
      AND {condition}
    RETURNING 1)"""


def known_user_head(p: Params) -> str:
    """Sign-in head of a link whose destination is a user's: the user is locked before the link
    (as ``LOCK_USER``), and a concurrent change of its address is seen (the lock re-reads the
    row): a link proves the address it was sent to, nothing else. Gate ``", t"``."""
    user_id = p["user_id"]
    token = _use_token(p, f"""(user_id IS NULL OR user_id = {user_id}) AND EXISTS (
        SELECT 1 FROM users x WHERE x.id = {user_id} AND (
            (channel = 'email' AND lower(x.email) = lower(destination))
            OR (channel = 'sms' AND x.phone_number = destination))
        FOR NO KEY UPDATE OF x)""")
    return f"{token}, {sessions.user_update(p, condition='AND EXISTS (SELECT 1 FROM t)')}"


def new_user_head(p: Params) -> str:
    """Sign-in head of a first sign-in: creates the user (verified: the link proved the
    destination) with ``user.created`` (parameters ``user_event_*``), only while the link is
    usable (locked first, so it stays so); a concurrent creation of the same user wins, and
    this one writes nothing. Parameters ``email``, ``phone_number``. Gate ``", t"``."""
    return f"""u AS (
    INSERT INTO users (id, project_id, email, email_verified, phone_number, phone_verified,
                       last_sign_in_at)
    SELECT {p['user_id']}, {p['project_id']}, {p['email']}, {p['verified_email']},
           {p['phone_number']}, {p['verified_sms']}, CASE WHEN {p['signing_in']} THEN now() END
    WHERE EXISTS (
        SELECT 1 FROM magic_link_tokens
        WHERE token_hash = {p['token_hash']} AND consumed_at IS NULL AND expires_at > now()
          AND project_id = {p['project_id']} AND user_id IS NULL
        FOR NO KEY UPDATE)
    ON CONFLICT DO NOTHING
    RETURNING {_USER_COLUMNS}
), {_use_token(p, "user_id IS NULL AND EXISTS (SELECT 1 FROM u)")},
uc AS ({audit.insert_from("u", p, name="user_event")})"""


def step_up_head(p: Params) -> str:
    """Sign-in head of a step-up link, whose token the general path used up already: the
    step-up challenge ``su_id`` used up (``risk.step_up_cte``), then the user's row. Gate
    ``", su"``."""
    return f"{risk.step_up_cte(p)}, {sessions.user_update(p, condition='AND EXISTS (SELECT 1 FROM su)')}"


def _create_user_statement() -> tuple[str, Params]:
    p = Params()
    sql = f"""WITH u AS (
        INSERT INTO users (id, project_id, email, email_verified, phone_number, phone_verified)
        VALUES ({p['user_id']}, {p['project_id']}, {p['email']}, {p['email_verified']},
                {p['phone_number']}, {p['phone_verified']})
        ON CONFLICT DO NOTHING RETURNING id
    ), e AS ({audit.insert_from("u", p, name="user_event")})
    SELECT id FROM u"""
    return sql, p


CREATE_USER: Final = _create_user_statement()
"""The general path's creation of a user on first sign-in, with ``user.created`` in the same
statement; no row when the user exists (a concurrent creation won)."""

PURGE: Final = """
DELETE FROM magic_link_tokens WHERE token_hash IN (
    SELECT token_hash FROM magic_link_tokens
    WHERE expires_at < now() - interval '1 day' LIMIT $1)"""
"""Tokens a day past their expiry (until then a late click still hears "expired" rather than
"not valid"), in batches of ``$1``."""
