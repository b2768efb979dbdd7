"""Invitations to an organization, accepted through the invited person's magic link (SPEC.md 6,
7; issue 4).

Under ``/v1/organizations/{org_id}/invitations``:

* ``POST`` (``organizations:write``) ``{"email", "role"?}``: ``invalid_email`` (422) for a bad
  address; ``already_a_member`` (409) when a user with that email has a membership of the
  organization, active or suspended (a suspended one is reactivated with ``PATCH
  .../memberships/{id} {"status": "active"}``, not by an invitation);
  ``invitation_pending`` (409) while a pending, unexpired invitation for that email exists (an
  expired one is marked revoked and replaced). The invitation expires after
  ``SERVICE_INVITATION_TTL_SECONDS`` (default 7 days); its link is queued by email and
  ``invitation.created`` recorded in the same transaction. 201 with the invitation.
* ``GET`` (keyset pages in creation order, optional ``status`` filter) and
  ``GET /{invitation_id}``.
* ``POST /{invitation_id}/revoke``: a pending, unexpired invitation becomes ``revoked``
  (``invitation.revoked``); any other is ``invitation_not_pending`` (409).

The invitation JSON is ``id, organization_id, email, role, status, expires_at, created_at,
accepted_at, revoked_at``; ``status`` is ``pending``, ``accepted``, ``revoked`` or ``expired``
(a pending invitation past ``expires_at``; derived, never stored).

``accept`` is called by the magic-link verification (``control_plane.signin``) once the invited
person proved control of the address. Unknown, malformed and other organizations' or projects'
invitation ids are ``invitation_not_found``; an unknown organization on the collection routes is
``organization_not_found``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.errors import (
    AlreadyAMember,
    InvalidRequest,
    InvitationNotFound,
    InvitationNotPending,
    InvitationPending,
    OrganizationNotFound,
    UserNotFound,
)
from common.http import json_response
from common.ids import is_id, new_id
from common.schemas import RequestModel, parse_body
from common.settings import Settings
from control_plane import audit, magic_links, users
from control_plane.appkeys import CURSOR_SECRET, KMS
from control_plane.destinations import normalize_email
from control_plane.kms import LocalKms
from control_plane.memberships import DEFAULT_ROLE, MEMBERSHIP_COLUMNS, Role, add_membership
from control_plane.organizations import READ_SCOPES, WRITE_SCOPE, get_organization
from control_plane.pagination import project_page_by_id
from control_plane.principal import authenticate

INVITATION_COLUMNS: Final = (
    "id, organization_id, email, role, "
    "CASE WHEN status = 'pending' AND expires_at <= now() THEN 'expired' ELSE status END AS status, "
    "expires_at, created_at, accepted_at, revoked_at"
)
STATUSES: Final = ("pending", "accepted", "revoked", "expired")
_STATUS_WHERE: Final = {
    "pending": "status = 'pending' AND expires_at > now()",
    "expired": "status = 'pending' AND expires_at <= now()",
    "accepted": "status = 'accepted'",
    "revoked": "status = 'revoked'",
}
_PENDING_CONSTRAINT: Final = "invitations_pending_email"


class CreateInvitationBody(RequestModel):
    email: str  # checked by normalize_email: a bad address is invalid_email (422)
    role: Role = DEFAULT_ROLE


async def create_invitation(
    conn: asyncpg.Connection, actor: audit.Actor, kms: LocalKms, settings: Settings, *,
    project_id: str, org_id: str, body: CreateInvitationBody,
) -> dict[str, Any]:
    """Invite ``body.email`` to ``org_id`` with ``body.role``; queue the invitation link and
    record ``invitation.created`` in the same transaction. An expired pending invitation for the
    address is marked revoked (``invitation.revoked``, reason ``expired``) and replaced.

    Raises InvalidEmail, OrganizationNotFound, AlreadyAMember (the address is a user with any
    membership of the organization, active or suspended), InvitationPending.
    """
    email = normalize_email(body.email)
    async with conn.transaction():
        org_name = await conn.fetchval(
            "SELECT name FROM organizations WHERE id = $1 AND project_id = $2 FOR KEY SHARE",
            org_id, project_id,
        ) if is_id(org_id, "org") else None
        if org_name is None:
            raise OrganizationNotFound()
        user = await users.find_by_email(conn, project_id, email)
        user_id: str | None = user["id"] if user is not None else None
        if user_id is not None:
            membership = await conn.fetchrow(
                "SELECT id, status FROM memberships WHERE organization_id = $1 AND user_id = $2",
                org_id, user_id,
            )
            if membership is not None:
                raise _already_a_member(org_id, membership["id"], membership["status"], user_id)
        pending = await conn.fetchrow(
            """SELECT id, expires_at > now() AS live FROM invitations
               WHERE organization_id = $1 AND lower(email) = lower($2) AND status = 'pending'
               FOR UPDATE""",
            org_id, email,
        )
        invitation_id = new_id("inv")
        if pending is not None:
            if pending["live"]:
                raise InvitationPending(details={"invitation_id": pending["id"]})
            await conn.execute(
                """UPDATE invitations SET status = 'revoked', revoked_at = now(), updated_at = now()
                   WHERE id = $1""",
                pending["id"],
            )
            await audit.record(
                conn, actor, action="invitation.revoked", project_id=project_id,
                target_type="invitation", target_id=pending["id"], user_id=user_id,
                description=f"Replaced the expired invitation of {email} to organization {org_id}",
                metadata={"organization_id": org_id, "user_email": email, "reason": "expired",
                          "replaced_by": invitation_id},
            )
        try:
            row = await conn.fetchrow(
                f"""INSERT INTO invitations (id, project_id, organization_id, email, role,
                                             expires_at, created_by)
                    VALUES ($1, $2, $3, $4, $5, now() + $6::interval, $7)
                    RETURNING {INVITATION_COLUMNS}""",
                invitation_id, project_id, org_id, email, body.role,
                timedelta(seconds=settings.invitation_ttl_seconds), actor.id,
            )
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == _PENDING_CONSTRAINT:  # a concurrent invitation won
                raise InvitationPending() from None
            raise
        assert row is not None
        await magic_links.issue_link(
            conn, kms, settings, project_id=project_id, purpose="invitation", channel="email",
            destination=email, ttl_seconds=settings.invitation_ttl_seconds,
            invitation_id=invitation_id, organization_name=org_name, user_id=user_id,
        )
        await audit.record(
            conn, actor, action="invitation.created", project_id=project_id,
            target_type="invitation", target_id=invitation_id, user_id=user_id,
            description=f"Invited {email} to organization {org_id} as {body.role}",
            metadata={"organization_id": org_id, "user_email": email, "role": body.role},
        )
    return dict(row)


def _already_a_member(org_id: str, membership_id: str, status: str,
                      user_id: str) -> AlreadyAMember:
    if status == "active":
        message = "A user with that email is already an active member of the organization."
    else:
        message = (f"A user with that email is already a {status} member of the organization; "
                   f"reactivate the membership with PATCH /v1/organizations/{org_id}/memberships/"
                   f"{membership_id} {{\"status\": \"active\"}} instead of inviting them.")
    return AlreadyAMember(message, details={"membership_id": membership_id,
                                            "membership_status": status, "user_id": user_id})


async def get_invitation(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, org_id: str,
                         invitation_id: str) -> dict[str, Any]:
    """The invitation. Raises InvitationNotFound unless it is ``org_id``'s in ``project_id``."""
    if not is_id(invitation_id, "inv"):
        raise InvitationNotFound()
    row = await conn.fetchrow(
        f"""SELECT {INVITATION_COLUMNS} FROM invitations
            WHERE id = $1 AND organization_id = $2 AND project_id = $3""",
        invitation_id, org_id, project_id,
    )
    if row is None:
        raise InvitationNotFound()
    return dict(row)


async def revoke_invitation(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str, org_id: str,
    invitation_id: str,
) -> dict[str, Any]:
    """Revoke a pending, unexpired invitation (its link stops working) and record
    ``invitation.revoked``. Raises InvitationNotFound, InvitationNotPending."""
    async with conn.transaction():
        if not is_id(invitation_id, "inv"):
            raise InvitationNotFound()
        row = await conn.fetchrow(
            f"""SELECT {INVITATION_COLUMNS} FROM invitations
                WHERE id = $1 AND organization_id = $2 AND project_id = $3 FOR UPDATE""",
            invitation_id, org_id, project_id,
        )
        if row is None:
            raise InvitationNotFound()
        if row["status"] != "pending":
            raise InvitationNotPending(details={"status": row["status"]})
        updated = await conn.fetchrow(
            f"""UPDATE invitations SET status = 'revoked', revoked_at = now(), updated_at = now()
                WHERE id = $1 RETURNING {INVITATION_COLUMNS}""",
            invitation_id,
        )
        assert updated is not None
        await audit.record(
            conn, actor, action="invitation.revoked", project_id=project_id,
            target_type="invitation", target_id=invitation_id,
            description=f"Revoked the invitation of {row['email']} to organization {org_id}",
            metadata={"organization_id": org_id, "user_email": row["email"], "reason": "revoked"},
        )
    return dict(updated)


async def accept(conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str,
                 invitation_id: str, user_id: str) -> dict[str, Any]:
    """Accept the invitation for ``user_id``, who proved control of the invited address, in the
    caller's transaction (a savepoint of it). The invitation must be pending and unexpired. The
    user becomes a member with the invitation's role unless already a member of the organization
    (``create_invitation`` refuses members, but a membership may be added between the invitation
    and its acceptance: it is kept as it is, role and status). Records ``invitation.accepted`` (plus
    ``membership.created`` when a membership was made) and returns the membership
    (``MEMBERSHIP_COLUMNS``).

    Raises InvitationNotFound, InvitationNotPending, UserNotFound.
    """
    async with conn.transaction():
        row = await conn.fetchrow(
            """SELECT organization_id, email, role, status, expires_at > now() AS live
               FROM invitations WHERE id = $1 AND project_id = $2 FOR UPDATE""",
            invitation_id, project_id,
        ) if is_id(invitation_id, "inv") else None
        if row is None:
            raise InvitationNotFound()
        if row["status"] != "pending" or not row["live"]:
            status = row["status"] if row["status"] != "pending" else "expired"
            raise InvitationNotPending(details={"status": status})
        org_id = row["organization_id"]
        if not is_id(user_id, "user") or await conn.fetchval(
            "SELECT 1 FROM users WHERE id = $1 AND project_id = $2", user_id, project_id,
        ) is None:
            raise UserNotFound()
        existing = await conn.fetchrow(
            f"""SELECT {MEMBERSHIP_COLUMNS} FROM memberships
                WHERE organization_id = $1 AND user_id = $2 FOR UPDATE""",
            org_id, user_id,
        )
        if existing is not None:
            membership, created = dict(existing), False
        else:
            membership = await add_membership(conn, actor, project_id=project_id, org_id=org_id,
                                              user_id=user_id, role=row["role"])
            created = True
        await conn.execute(
            """UPDATE invitations SET status = 'accepted', accepted_at = now(),
                      accepted_user_id = $2, updated_at = now()
               WHERE id = $1""",
            invitation_id, user_id,
        )
        await audit.record(
            conn, actor, action="invitation.accepted", project_id=project_id,
            target_type="invitation", target_id=invitation_id, user_id=user_id,
            description=f"User {user_id} accepted the invitation to organization {org_id}",
            metadata={"organization_id": org_id, "user_email": row["email"],
                      "role": row["role"], "membership_id": membership["id"],
                      "membership_created": created},
        )
    return membership


async def list_invitations(pool: asyncpg.Pool, project_id: str, org_id: str, query: Any, *,
                           secret: bytes) -> dict[str, Any]:
    """A page of the organization's invitations in creation order, optionally only those with
    ``status`` (``pending``, ``accepted``, ``revoked``, ``expired``).
    Raises OrganizationNotFound, InvalidRequest."""
    status = query.get("status")
    if status is not None and status not in STATUSES:
        raise InvalidRequest.field("status", f"must be one of {', '.join(STATUSES)}")
    await get_organization(pool, project_id, org_id)
    return await project_page_by_id(
        pool, query, table="invitations", columns=INVITATION_COLUMNS, project_id=project_id,
        secret=secret, kind=f"invitations:{org_id}",
        where="organization_id = $2" + (f" AND {_STATUS_WHERE[status]}" if status else ""),
        args=(org_id,),
    )


# --- handlers ---------------------------------------------------------------------------------


async def post_invitation(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    body = await parse_body(request, CreateInvitationBody)
    async with request.app[PG_POOL].acquire() as conn:
        invitation = await create_invitation(
            conn, audit.actor_from_request(request, principal), request.app[KMS],
            request.app[SETTINGS], project_id=principal.project_id,
            org_id=request.match_info["org_id"], body=body,
        )
    return json_response(request, invitation, status=201)


async def get_invitations(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    body = await list_invitations(request.app[PG_POOL], principal.project_id,
                                  request.match_info["org_id"], request.query,
                                  secret=request.app[CURSOR_SECRET])
    return json_response(request, body)


async def show_invitation(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    invitation = await get_invitation(request.app[PG_POOL], principal.project_id,
                                      request.match_info["org_id"],
                                      request.match_info["invitation_id"])
    return json_response(request, invitation)


async def post_revoke(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    async with request.app[PG_POOL].acquire() as conn:
        invitation = await revoke_invitation(
            conn, audit.actor_from_request(request, principal), project_id=principal.project_id,
            org_id=request.match_info["org_id"], invitation_id=request.match_info["invitation_id"],
        )
    return json_response(request, invitation)


def setup(app: web.Application) -> None:
    """Register the invitation routes."""
    r = app.router
    base = "/v1/organizations/{org_id}/invitations"
    r.add_post(base, post_invitation)
    r.add_get(base, get_invitations)
    r.add_get(base + "/{invitation_id}", show_invitation)
    r.add_post(base + "/{invitation_id}/revoke", post_revoke)
