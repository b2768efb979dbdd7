"""Passkeys SQL (tables ``webauthn_settings``, ``passkeys``, ``webauthn_challenges``) and the head
of the passkey sign-in statement."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

import asyncpg
from webauthn.helpers import bytes_to_base64url

from common.db import Params
from control_plane.passkeys.schemas import Passkey, WebAuthnSettings
from control_plane.risk import service as risk
from control_plane.sessions import service as sessions

COLUMNS: Final = ("id, user_id, credential_id, name, transports, aaguid, sign_count, "
                  "backup_eligible, backup_state, created_at, last_used_at")


def passkey_of(row: asyncpg.Record) -> Passkey:
    values = dict(row)
    values["credential_id"] = bytes_to_base64url(values["credential_id"])
    values["aaguid"] = str(values["aaguid"])
    return Passkey(**{k: values[k] for k in Passkey.__dataclass_fields__})


# --- settings -----------------------------------------------------------------------------------


async def settings_of(conn: asyncpg.Connection | asyncpg.Pool,
                      project_id: str) -> WebAuthnSettings | None:
    row = await conn.fetchrow(
        "SELECT rp_id, rp_name, origins, user_verification FROM webauthn_settings "
        "WHERE project_id = $1", project_id)
    return WebAuthnSettings(**row) if row is not None else None


async def put_settings(conn: asyncpg.Connection, project_id: str, s: WebAuthnSettings) -> None:
    await conn.execute(
        """INSERT INTO webauthn_settings (project_id, rp_id, rp_name, origins, user_verification)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (project_id) DO UPDATE SET rp_id = $2, rp_name = $3, origins = $4,
               user_verification = $5, updated_at = now()""",
        project_id, s.rp_id, s.rp_name, s.origins, s.user_verification)


async def delete_settings(conn: asyncpg.Connection, project_id: str) -> bool:
    status = await conn.execute("DELETE FROM webauthn_settings WHERE project_id = $1", project_id)
    return bool(status != "DELETE 0")


# --- challenges ---------------------------------------------------------------------------------


async def insert_challenge(conn: asyncpg.Connection | asyncpg.Pool, *, digest: bytes,
                           project_id: str | None, ceremony: str, user_id: str | None, name: str | None,
                           user_verification: str, ttl: timedelta) -> None:
    await conn.execute(
        """INSERT INTO webauthn_challenges (challenge_hash, project_id, ceremony, user_id, name,
                                            user_verification, expires_at)
           VALUES ($1, $2, $3, $4, $5, $6, now() + $7::interval)""",
        digest, project_id, ceremony, user_id, name, user_verification, ttl)


SPEND_CHALLENGE: Final = """
DELETE FROM webauthn_challenges WHERE challenge_hash = $1
RETURNING project_id, ceremony, user_id, name, user_verification, expires_at <= now() AS expired"""
"""Spend the challenge of digest ``$1`` (single use, whatever the verify's outcome)."""

SPEND_OPEN_CHALLENGE: Final = """
DELETE FROM webauthn_challenges WHERE challenge_hash = $1 AND project_id IS NULL"""
"""Spend the challenge of digest ``$1`` if it is one of no project (migration 0021)."""

READ_FOR_LOGIN: Final = """
SELECT c.project_id, c.ceremony, c.user_id, c.user_verification, c.expires_at <= now() AS expired,
       c.step_up_id, w.rp_id, w.origins, k.id AS passkey_id, k.user_id AS passkey_user_id, k.public_key,
       k.sign_count
FROM webauthn_challenges c
LEFT JOIN webauthn_settings w ON w.project_id = $2
LEFT JOIN passkeys k ON k.project_id = $2 AND k.credential_id = $3
WHERE c.challenge_hash = $1"""
"""A login verify's one read: the challenge of digest ``$1``, the project ``$2``'s relying party
and its credential ``$3``. No row: the challenge is unknown (or spent). The challenge is spent by
the sign-in statement (:func:`passkey_head`) or by :data:`SPEND_CHALLENGE` on a refusal."""

ISSUE_LOGIN_CHALLENGE: Final = """
WITH w AS (SELECT rp_id, user_verification FROM webauthn_settings WHERE project_id = $4),
i AS (
    INSERT INTO webauthn_challenges (challenge_hash, project_id, ceremony, user_id,
                                     user_verification, expires_at, step_up_id)
    SELECT $1, $4, 'authentication', $2, w.user_verification, now() + $3::interval, $5 FROM w
)
SELECT rp_id, user_verification FROM w"""
"""Store the login challenge of digest ``$1`` (for user ``$2`` or anyone, ``$3`` to live) in the
project ``$4`` with the project's user verification, for the step-up challenge ``$5`` (or a
plain login: null), answering its relying-party id and user verification; no row when the
project has no relying party."""

PURGE: Final = """
DELETE FROM webauthn_challenges WHERE challenge_hash IN (
    SELECT challenge_hash FROM webauthn_challenges WHERE expires_at < now() LIMIT $1)"""
"""Challenges no verify spent, once expired, in batches of ``$1``."""


# --- passkeys -----------------------------------------------------------------------------------


async def credentials_of(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                         user_id: str) -> list[asyncpg.Record]:
    """(credential_id, transports) of the user's passkeys, oldest first."""
    return list(await conn.fetch(
        "SELECT credential_id, transports FROM passkeys WHERE project_id = $1 AND user_id = $2 "
        "ORDER BY id", project_id, user_id))


async def credentials_by_email(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                               email: str) -> tuple[str | None, list[asyncpg.Record]]:
    """The id of the project's user with ``email`` (None when none) and that user's
    (credential_id, transports), oldest first."""
    rows = await conn.fetch(
        """SELECT u.id AS user_id, k.credential_id, k.transports
           FROM users u LEFT JOIN passkeys k ON k.user_id = u.id
           WHERE u.project_id = $1 AND lower(u.email) = lower($2) ORDER BY k.id""",
        project_id, email)
    if not rows:
        return None, []
    return str(rows[0]["user_id"]), [r for r in rows if r["credential_id"] is not None]


async def insert_passkey(conn: asyncpg.Connection, values: dict[str, Any]) -> Passkey | None:
    """The passkey inserted; None when the project already has that credential id."""
    row = await conn.fetchrow(
        f"""INSERT INTO passkeys (id, project_id, user_id, credential_id, public_key, sign_count,
                                 transports, aaguid, backup_eligible, backup_state, name)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8::uuid, $9, $10, $11)
            ON CONFLICT ON CONSTRAINT passkeys_project_credential DO NOTHING
            RETURNING {COLUMNS}""",
        values["id"], values["project_id"], values["user_id"], values["credential_id"],
        values["public_key"], values["sign_count"], values["transports"], values["aaguid"],
        values["backup_eligible"], values["backup_state"], values["name"])
    return passkey_of(row) if row is not None else None


async def list_passkeys(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        user_id: str) -> list[Passkey]:
    rows = await conn.fetch(
        f"SELECT {COLUMNS} FROM passkeys WHERE project_id = $1 AND user_id = $2 ORDER BY id",
        project_id, user_id)
    return [passkey_of(r) for r in rows]


async def delete_passkey(conn: asyncpg.Connection, project_id: str, user_id: str,
                         passkey_id: str) -> Passkey | None:
    row = await conn.fetchrow(
        f"DELETE FROM passkeys WHERE id = $1 AND project_id = $2 AND user_id = $3 RETURNING {COLUMNS}",
        passkey_id, project_id, user_id)
    return passkey_of(row) if row is not None else None


async def user_exists(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                      user_id: str) -> bool:
    return await conn.fetchval(
        "SELECT 1 FROM users WHERE id = $1 AND project_id = $2", user_id, project_id) is not None


async def user_names(conn: asyncpg.Connection, project_id: str,
                     user_id: str) -> asyncpg.Record | None:
    """(email, phone_number, name) of the user, None when gone."""
    return await conn.fetchrow(
        "SELECT email, phone_number, name FROM users WHERE id = $1 AND project_id = $2",
        user_id, project_id)


def passkey_step_up_head(p: Params) -> str:
    """Sign-in head of a step-up by passkey: :func:`passkey_head`, then the step-up challenge
    ``su_id`` used up by it (``risk.step_up_cte``). Parameters those two take, ``su_method``
    ``passkey``. Gate ``", t, su"``."""
    return f"{passkey_head(p)}, {risk.step_up_cte(p, after='t')}"


def passkey_head(p: Params) -> str:
    """Sign-in head of a verified passkey assertion: the challenge is spent (deleted whatever
    else happens; a concurrent verify of the same challenge finds it gone), and only if this
    statement spent it, the credential's ``sign_count``, ``backup_state`` and ``last_used_at``
    are updated, while the credential still exists for this user and its counter has not moved
    past the one verified (a counting credential's count must grow; a racing login with the
    same count loses); then the user's row. Parameters ``challenge_hash``, ``passkey_id``,
    ``sign_count``, ``backup_state``. Gate ``", t"``."""
    return f"""c AS (
    DELETE FROM webauthn_challenges
    WHERE challenge_hash = {p['challenge_hash']} AND expires_at > now()
    RETURNING 1
), t AS (
    UPDATE passkeys SET sign_count = {p['sign_count']}, backup_state = {p['backup_state']},
                        last_used_at = now()
    WHERE id = {p['passkey_id']} AND user_id = {p['user_id']}
      AND ({p['sign_count']}::bigint = 0 OR sign_count < {p['sign_count']}::bigint)
      AND EXISTS (SELECT 1 FROM c)
    RETURNING id
), {sessions.user_update(p, condition='AND EXISTS (SELECT 1 FROM t)')}"""
