"""Organizations SQL: ``organizations`` (slug unique per project), ``memberships`` (one per user
and organization) and ``invitations`` (one pending per organization and email)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

import asyncpg

from common.db import Params
from common.ids import new_id
from control_plane.audit import service as audit
from control_plane.organizations.schemas import Invitation, Membership, Organization, UserMembership

ORG_COLUMNS: Final = "id, name, slug, metadata, created_at, updated_at"
MEMBERSHIP_COLUMNS: Final = "id, organization_id, user_id, role, status, created_at, updated_at"
USER_MEMBERSHIP_COLUMNS: Final = (
    ", ".join(f"m.{c.strip()}" for c in MEMBERSHIP_COLUMNS.split(","))
    + ", o.name AS organization_name, o.slug AS organization_slug"
)
INVITATION_COLUMNS: Final = (
    "id, organization_id, email, role, "
    "CASE WHEN status = 'pending' AND expires_at <= now() THEN 'expired' ELSE status END AS status, "
    "expires_at, created_at, accepted_at, revoked_at"
)
INVITATION_STATUS_WHERE: Final = {
    "pending": "status = 'pending' AND expires_at > now()",
    "expired": "status = 'pending' AND expires_at <= now()",
    "accepted": "status = 'accepted'",
    "revoked": "status = 'revoked'",
}
SLUG_CONSTRAINT: Final = "organizations_project_id_slug_key"
PENDING_INVITATION_CONSTRAINT: Final = "invitations_pending_email"


def organization(row: asyncpg.Record) -> Organization:
    return Organization(**row)


def membership(row: asyncpg.Record) -> Membership:
    return Membership(**row)


def user_membership(row: asyncpg.Record) -> UserMembership:
    return UserMembership(**row)


def invitation(row: asyncpg.Record) -> Invitation:
    return Invitation(**row)


# --- organizations -----------------------------------------------------------------------------


async def find_organization(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, org_id: str,
                            *, for_update: bool = False) -> Organization | None:
    row = await conn.fetchrow(
        f"SELECT {ORG_COLUMNS} FROM organizations WHERE id = $1 AND project_id = $2"
        + (" FOR UPDATE" if for_update else ""),
        org_id, project_id,
    )
    return organization(row) if row is not None else None


async def share_lock_organization(conn: asyncpg.Connection, project_id: str,
                                  org_id: str) -> str | None:
    """The organization's name, its row share-locked (it cannot be deleted under us)."""
    name: str | None = await conn.fetchval(
        "SELECT name FROM organizations WHERE id = $1 AND project_id = $2 FOR KEY SHARE",
        org_id, project_id,
    )
    return name


async def insert_organization(conn: asyncpg.Connection, *, project_id: str, name: str, slug: str,
                              metadata: dict[str, Any]) -> Organization:
    """Raises asyncpg.UniqueViolationError for a slug in use."""
    row = await conn.fetchrow(
        f"""INSERT INTO organizations (id, project_id, name, slug, metadata)
            VALUES ($1, $2, $3, $4, $5) RETURNING {ORG_COLUMNS}""",
        new_id("org"), project_id, name, slug, metadata,
    )
    assert row is not None
    return organization(row)


async def update_organization(conn: asyncpg.Connection, project_id: str, org_id: str,
                              changes: dict[str, Any]) -> Organization:
    """Raises asyncpg.UniqueViolationError for a slug in use."""
    p = Params()
    assignments = ", ".join(f"{name} = {p(value)}" for name, value in changes.items())
    row = await conn.fetchrow(
        f"""UPDATE organizations SET {assignments}, updated_at = now()
            WHERE id = {p(org_id)} AND project_id = {p(project_id)} RETURNING {ORG_COLUMNS}""",
        *p.values,
    )
    assert row is not None
    return organization(row)


async def delete_organization(conn: asyncpg.Connection, org_id: str) -> int:
    """Delete the organization (memberships and invitations cascade); returns how many
    memberships it had. Hold its row lock: then no membership can be added meanwhile."""
    members: int = await conn.fetchval(
        "SELECT count(*) FROM memberships WHERE organization_id = $1", org_id)
    await conn.execute("DELETE FROM organizations WHERE id = $1", org_id)
    return members


# --- memberships -------------------------------------------------------------------------------


async def share_lock_user(conn: asyncpg.Connection, project_id: str, user_id: str) -> bool:
    """Whether the project has the user, its row share-locked (it cannot be deleted under us)."""
    found = await conn.fetchval(
        "SELECT 1 FROM users WHERE id = $1 AND project_id = $2 FOR KEY SHARE", user_id, project_id)
    return found is not None


async def user_exists(conn: asyncpg.Connection, project_id: str, user_id: str) -> bool:
    found = await conn.fetchval("SELECT 1 FROM users WHERE id = $1 AND project_id = $2",
                                user_id, project_id)
    return found is not None


async def insert_membership(conn: asyncpg.Connection, *, project_id: str, org_id: str,
                            user_id: str, role: str) -> Membership | None:
    """Insert an active membership, or nothing when the user already has one there (None)."""
    row = await conn.fetchrow(
        f"""INSERT INTO memberships (id, project_id, organization_id, user_id, role)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (organization_id, user_id) DO NOTHING
            RETURNING {MEMBERSHIP_COLUMNS}""",
        new_id("mem"), project_id, org_id, user_id, role,
    )
    return membership(row) if row is not None else None


def membership_from(source: str, p: Params) -> str:
    """SQL (CTEs ``membership`` and ``membership_event``) making each user row of ``source`` (a
    CTE of the same statement, column ``id``) an active member of the organization, with its
    ``membership.created``, from the parameters of ``service.membership_params``: what
    ``service.add_membership`` writes for a user the statement itself created (no membership
    can exist yet; the organization's row is share-locked by the foreign key's check, which
    fails the whole statement when the organization is gone)."""
    return f"""membership AS (
    INSERT INTO memberships (id, project_id, organization_id, user_id, role)
    SELECT {p["membership_id"]}::text, {p["membership_project_id"]}::text,
           {p["membership_organization_id"]}::text, {source}.id, {p["membership_role"]}::text
    FROM {source}
    RETURNING {MEMBERSHIP_COLUMNS}
), membership_event AS ({audit.insert_from("membership", p, name="membership_event")})"""


async def membership_of(conn: asyncpg.Connection, org_id: str, user_id: str, *,
                        for_update: bool = False) -> Membership | None:
    """The user's membership of the organization."""
    row = await conn.fetchrow(
        f"""SELECT {MEMBERSHIP_COLUMNS} FROM memberships
            WHERE organization_id = $1 AND user_id = $2""" + (" FOR UPDATE" if for_update else ""),
        org_id, user_id,
    )
    return membership(row) if row is not None else None


async def find_membership(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, org_id: str,
                          membership_id: str, *, for_update: bool = False) -> Membership | None:
    row = await conn.fetchrow(
        f"""SELECT {MEMBERSHIP_COLUMNS} FROM memberships
            WHERE id = $1 AND organization_id = $2 AND project_id = $3"""
        + (" FOR UPDATE" if for_update else ""),
        membership_id, org_id, project_id,
    )
    return membership(row) if row is not None else None


async def set_membership(conn: asyncpg.Connection, membership_id: str, *, role: str,
                         status: str) -> Membership:
    row = await conn.fetchrow(
        f"""UPDATE memberships SET role = $2, status = $3, updated_at = now()
            WHERE id = $1 RETURNING {MEMBERSHIP_COLUMNS}""",
        membership_id, role, status,
    )
    assert row is not None
    return membership(row)


async def lock_user_memberships(conn: asyncpg.Connection, user_id: str) -> list[asyncpg.Record]:
    """``organization_id`` and ``status`` of each of the user's memberships, locked, in id
    order."""
    rows: list[asyncpg.Record] = await conn.fetch(
        """SELECT organization_id, status FROM memberships WHERE user_id = $1 ORDER BY id
           FOR UPDATE""", user_id)
    return rows


async def delete_membership(conn: asyncpg.Connection, membership_id: str) -> None:
    await conn.execute("DELETE FROM memberships WHERE id = $1", membership_id)


# --- invitations -------------------------------------------------------------------------------


async def pending_invitation(conn: asyncpg.Connection, org_id: str,
                             email: str) -> asyncpg.Record | None:
    """The pending invitation of ``email`` to the organization, locked: ``id`` and ``live``
    (not expired yet)."""
    row: asyncpg.Record | None = await conn.fetchrow(
        """SELECT id, expires_at > now() AS live FROM invitations
           WHERE organization_id = $1 AND lower(email) = lower($2) AND status = 'pending'
           FOR UPDATE""",
        org_id, email,
    )
    return row


async def mark_invitation_revoked(conn: asyncpg.Connection, invitation_id: str) -> Invitation:
    row = await conn.fetchrow(
        f"""UPDATE invitations SET status = 'revoked', revoked_at = now(), updated_at = now()
            WHERE id = $1 RETURNING {INVITATION_COLUMNS}""",
        invitation_id,
    )
    assert row is not None
    return invitation(row)


async def insert_invitation(conn: asyncpg.Connection, *, invitation_id: str, project_id: str,
                            org_id: str, email: str, role: str, ttl: timedelta,
                            created_by: str | None) -> Invitation:
    """Raises asyncpg.UniqueViolationError when a pending invitation of the email exists."""
    row = await conn.fetchrow(
        f"""INSERT INTO invitations (id, project_id, organization_id, email, role, expires_at,
                                     created_by)
            VALUES ($1, $2, $3, $4, $5, now() + $6::interval, $7)
            RETURNING {INVITATION_COLUMNS}""",
        invitation_id, project_id, org_id, email, role, ttl, created_by,
    )
    assert row is not None
    return invitation(row)


async def find_invitation(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, org_id: str,
                          invitation_id: str, *, for_update: bool = False) -> Invitation | None:
    row = await conn.fetchrow(
        f"""SELECT {INVITATION_COLUMNS} FROM invitations
            WHERE id = $1 AND organization_id = $2 AND project_id = $3"""
        + (" FOR UPDATE" if for_update else ""),
        invitation_id, org_id, project_id,
    )
    return invitation(row) if row is not None else None


async def lock_invitation_for_acceptance(conn: asyncpg.Connection, project_id: str,
                                         invitation_id: str) -> asyncpg.Record | None:
    """``organization_id``, ``email``, ``role``, ``status`` and ``live`` of the invitation,
    locked."""
    row: asyncpg.Record | None = await conn.fetchrow(
        """SELECT organization_id, email, role, status, expires_at > now() AS live
           FROM invitations WHERE id = $1 AND project_id = $2 FOR UPDATE""",
        invitation_id, project_id,
    )
    return row


async def mark_invitation_accepted(conn: asyncpg.Connection, invitation_id: str,
                                   user_id: str) -> None:
    await conn.execute(
        """UPDATE invitations SET status = 'accepted', accepted_at = now(),
                  accepted_user_id = $2, updated_at = now()
           WHERE id = $1""",
        invitation_id, user_id,
    )
