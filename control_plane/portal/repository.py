"""Admin portal SQL (tables ``portal_links`` and ``organization_domains``, migration 0020)."""

from __future__ import annotations

from typing import Final

import asyncpg

LINK_COLUMNS: Final = "id, organization_id, intent, expires_at, created_at"
DOMAIN_COLUMNS: Final = "domain, challenge, verified_at, checked_at, created_at"
VERIFIED_CONSTRAINT: Final = "organization_domains_verified"
"""A domain is verified by one organization of a project at most."""


async def insert_link(conn: asyncpg.Connection, *, link_id: str, project_id: str,
                      organization_id: str, intent: str, token_hash: bytes, ttl_seconds: int,
                      created_by: str | None) -> asyncpg.Record:
    """A new link, usable for ``ttl_seconds`` from now (the database's clock, which judges its
    use). Raises asyncpg.ForeignKeyViolationError when the organization is gone."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""INSERT INTO portal_links (id, project_id, organization_id, intent, token_hash,
                                      expires_at, created_by)
            VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6), $7)
            RETURNING {LINK_COLUMNS}""",
        link_id, project_id, organization_id, intent, token_hash, ttl_seconds, created_by)
    return row


OPEN: Final = """
WITH opened AS (
    UPDATE portal_links
    SET consumed_at = now(), session_hash = $2,
        session_expires_at = now() + make_interval(secs => $3)
    WHERE token_hash = $1 AND consumed_at IS NULL AND expires_at > now()
    RETURNING id, project_id, organization_id, intent, session_expires_at
)
SELECT opened.*, o.name AS organization_name
FROM opened JOIN organizations o ON o.id = opened.organization_id"""
"""Consume the link of token digest ``$1`` and start its session (digest ``$2``, lasting ``$3``
seconds), in one statement: of two openings at once, exactly one finds the link unconsumed.
No row: the token is unknown, used up or expired (:data:`REFUSED` says which)."""

REFUSED: Final = "SELECT consumed_at IS NOT NULL AS consumed FROM portal_links WHERE token_hash = $1"
"""Why the link of token digest ``$1`` could not be opened: used up (``consumed``) or expired;
no row when no link has that token (never made, or purged a day after it ended)."""

SESSION: Final = """
SELECT l.id, l.project_id, l.organization_id, l.intent, l.session_expires_at,
       o.name AS organization_name
FROM portal_links l JOIN organizations o ON o.id = l.organization_id
WHERE l.session_hash = $1 AND l.session_expires_at > now()"""
"""The live portal session of token digest ``$1``, with its link and organization."""

PURGE: Final = """
DELETE FROM portal_links WHERE id IN (
    SELECT id FROM portal_links
    WHERE coalesce(session_expires_at, expires_at) < now() - interval '1 day' LIMIT $1)"""
"""Links whose token (never opened) or session ended over a day ago, in batches of ``$1``."""


async def domains_of(conn: asyncpg.Connection | asyncpg.Pool,
                     organization_id: str) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT {DOMAIN_COLUMNS} FROM organization_domains WHERE organization_id = $1 "
        "ORDER BY created_at, domain", organization_id)
    return rows


async def claim_domain(conn: asyncpg.Connection, *, organization_id: str, project_id: str,
                       domain: str, challenge: str) -> tuple[asyncpg.Record, bool]:
    """The organization's row of ``domain``, made with ``challenge`` unless it existed; and
    whether it was made now."""
    row = await conn.fetchrow(
        f"""INSERT INTO organization_domains (organization_id, domain, project_id, challenge)
            VALUES ($1, $2, $3, $4) ON CONFLICT (organization_id, domain) DO NOTHING
            RETURNING {DOMAIN_COLUMNS}""",
        organization_id, domain, project_id, challenge)
    if row is not None:
        return row, True
    existing: asyncpg.Record = await conn.fetchrow(
        f"SELECT {DOMAIN_COLUMNS} FROM organization_domains "
        "WHERE organization_id = $1 AND domain = $2", organization_id, domain)
    return existing, False


async def verified_elsewhere(conn: asyncpg.Connection, *, project_id: str, organization_id: str,
                             domain: str) -> bool:
    """Whether another organization of the project verified ``domain``."""
    found: bool = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM organization_domains
                          WHERE project_id = $1 AND domain = $2 AND verified_at IS NOT NULL
                            AND organization_id <> $3)""",
        project_id, domain, organization_id)
    return found


async def find_domain(conn: asyncpg.Connection, organization_id: str,
                      domain: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {DOMAIN_COLUMNS} FROM organization_domains "
        "WHERE organization_id = $1 AND domain = $2", organization_id, domain)
    return row


async def mark_checked(conn: asyncpg.Connection, organization_id: str, domain: str, *,
                       verified: bool) -> asyncpg.Record | None:
    """Record a verification attempt; ``verified`` sets ``verified_at`` (kept when it was set).
    None when the claim is gone (with its organization).
    Raises asyncpg.UniqueViolationError (:data:`VERIFIED_CONSTRAINT`) when another organization
    of the project verified the domain first."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""UPDATE organization_domains
            SET checked_at = now(),
                verified_at = CASE WHEN $3 THEN coalesce(verified_at, now()) ELSE verified_at END
            WHERE organization_id = $1 AND domain = $2 RETURNING {DOMAIN_COLUMNS}""",
        organization_id, domain, verified)
    return row

