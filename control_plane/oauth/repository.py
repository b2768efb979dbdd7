"""The SQL of OAuth: ``oauth_providers`` (a project's providers, the client secret sealed),
``oauth_states`` (started authorizations, single use) and ``oauth_identities``
(``(project, provider, subject) -> user``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

import asyncpg

from common.ids import new_id

PROVIDER_COLUMNS: Final = ("name, kind, client_id, client_secret_sealed, redirect_uris, scopes, "
                           "issuer, created_at, updated_at")


async def upsert_provider(conn: asyncpg.Connection, *, project_id: str, name: str, kind: str,
                          client_id: str, client_secret_sealed: bytes, redirect_uris: list[str],
                          scopes: list[str], issuer: str | None) -> tuple[asyncpg.Record, bool]:
    """Store the configuration of ``name`` in the project, replacing any; (the row, whether it
    was created)."""
    row = await conn.fetchrow(
        f"""INSERT INTO oauth_providers (project_id, name, kind, client_id, client_secret_sealed,
                                         redirect_uris, scopes, issuer)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
            ON CONFLICT (project_id, name) DO UPDATE SET
                kind = excluded.kind, client_id = excluded.client_id,
                client_secret_sealed = excluded.client_secret_sealed,
                redirect_uris = excluded.redirect_uris, scopes = excluded.scopes,
                issuer = excluded.issuer, updated_at = now()
            RETURNING {PROVIDER_COLUMNS}, (xmax = 0) AS created""",
        project_id, name, kind, client_id, client_secret_sealed, redirect_uris, scopes, issuer)
    assert row is not None
    return row, bool(row["created"])


async def find_provider(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        name: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {PROVIDER_COLUMNS} FROM oauth_providers WHERE project_id = $1 AND name = $2",
        project_id, name)
    return row


async def delete_provider(conn: asyncpg.Connection, project_id: str, name: str) -> bool:
    deleted = await conn.fetchval(
        "DELETE FROM oauth_providers WHERE project_id = $1 AND name = $2 RETURNING 1",
        project_id, name)
    return deleted is not None


async def insert_state(conn: asyncpg.Connection | asyncpg.Pool, *, state_hash: bytes,
                       project_id: str, provider: str, redirect_uri: str, code_verifier: str,
                       nonce: str, browser_hash: bytes, ttl: timedelta) -> None:
    """Remember a started authorization for ``ttl``; purges a few states long expired in the
    same statement (the callback deletes the ones it uses)."""
    await conn.execute(
        """WITH purged AS (
               DELETE FROM oauth_states WHERE state_hash IN (
                   SELECT state_hash FROM oauth_states
                   WHERE expires_at < now() - interval '1 hour' LIMIT 100))
           INSERT INTO oauth_states (state_hash, project_id, provider, redirect_uri,
                                     code_verifier, nonce, browser_hash, expires_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8)""",
        state_hash, project_id, provider, redirect_uri, code_verifier, nonce, browser_hash, ttl)


async def take_state(conn: asyncpg.Connection | asyncpg.Pool,
                     state_hash: bytes) -> asyncpg.Record | None:
    """Delete the authorization ``state_hash`` and answer it (``expired`` says whether it was
    past its time): whatever follows, a state is used once."""
    row: asyncpg.Record | None = await conn.fetchrow(
        """DELETE FROM oauth_states WHERE state_hash = $1
           RETURNING project_id, provider, redirect_uri, code_verifier, nonce, browser_hash,
                     expires_at < now() AS expired""",
        state_hash)
    return row


async def identity_user(conn: asyncpg.Connection, project_id: str, provider: str,
                        issuer: str, subject: str) -> str | None:
    """The user of the identity, its ``last_used_at`` stamped, or None."""
    user_id = await conn.fetchval(
        """UPDATE oauth_identities SET last_used_at = now()
           WHERE project_id = $1 AND provider = $2 AND issuer = $3 AND subject = $4
           RETURNING user_id""",
        project_id, provider, issuer, subject)
    return str(user_id) if user_id is not None else None


async def link_identity(conn: asyncpg.Connection, *, project_id: str, provider: str,
                        issuer: str, subject: str, user_id: str, email: str | None) -> str:
    """Link the identity to ``user_id``; the user it links to (another, when a concurrent
    sign-in linked it first)."""
    linked = await conn.fetchval(
        """INSERT INTO oauth_identities (project_id, provider, issuer, subject, user_id, email)
           VALUES ($1, $2, $3, $4, $5, $6)
           ON CONFLICT (project_id, provider, issuer, subject) DO UPDATE SET last_used_at = now()
           RETURNING user_id""",
        project_id, provider, issuer, subject, user_id, email)
    return str(linked)


async def user_by_email(conn: asyncpg.Connection, project_id: str,
                        email: str) -> asyncpg.Record | None:
    """``id``, ``email``, ``email_verified`` of the project's user with ``email`` (compared
    case-insensitively), its row locked."""
    row: asyncpg.Record | None = await conn.fetchrow(
        """SELECT id, email, email_verified FROM users
           WHERE project_id = $1 AND lower(email) = lower($2) FOR UPDATE""",
        project_id, email)
    return row


async def user_email(conn: asyncpg.Connection, user_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        "SELECT id, email, email_verified FROM users WHERE id = $1", user_id)
    return row


async def create_user(conn: asyncpg.Connection, *, project_id: str, email: str,
                      email_verified: bool, name: str) -> str | None:
    """A new user's id, or None when the project already has a user with ``email`` (a
    concurrent sign-in created it)."""
    user_id = await conn.fetchval(
        """INSERT INTO users (id, project_id, email, email_verified, name)
           VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING id""",
        new_id("user"), project_id, email, email_verified, name)
    return str(user_id) if user_id is not None else None
