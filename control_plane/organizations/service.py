"""Organization, membership and invitation rules (SPEC.md 2 slug rule, 3, 4, 6, 7).

* Organizations: a slug another organization of the project holds is ``slug_in_use`` (the
  unique constraint decides, so concurrent creations cannot both win); deleting one removes its
  memberships and invitations, and sessions that had it selected lose their organization
  context.
* Memberships: one per user and organization (``already_a_member``); role and status changes
  each record their own event, only when the value changes.
* Invitations: an address that is a user with any membership of the organization is
  ``already_a_member``; a live pending invitation is ``invitation_pending`` (an expired one is
  marked revoked and replaced); the link is queued and ``invitation.created`` recorded in the
  same transaction. ``accept_invitation`` runs when the invited person redeems the link.

Listeners (:func:`on_membership_change`): a domain that derives something from memberships and
that this one cannot import (``scim`` imports it: its directory groups' tuples) is told, in the
change's transaction, of every status change, removal, organization deletion and user deletion
(``users.on_removal``), before rows are deleted, so that it follows them atomically.

Unknown, malformed and other projects' ids are ``*_not_found``; an unknown organization on a
collection is ``organization_not_found``. Every change records its event in its transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Final

import asyncpg

from common.errors import (
    AlreadyAMember,
    InvitationNotFound,
    InvitationNotPending,
    InvitationPending,
    MembershipNotFound,
    OrganizationNotFound,
    SlugInUse,
    UserNotFound,
)
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.magic_links import service as magic_links
from control_plane.organizations import repository
from control_plane.organizations.repository import PENDING_INVITATION_CONSTRAINT, SLUG_CONSTRAINT
from control_plane.organizations.schemas import (
    CreateInvitation,
    CreateOrganization,
    Invitation,
    InvitationsQuery,
    Membership,
    MembershipChange,
    MembershipsQuery,
    Organization,
    UpdateMembership,
    UpdateOrganization,
    UserMembership,
)
from control_plane.users import service as users
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, PageQuery, page_by_id


def _project(actor: Actor) -> str:
    assert actor.project_id is not None
    return actor.project_id


# --- listeners ---------------------------------------------------------------------------------

MembershipListener = Callable[[asyncpg.Connection, Actor, MembershipChange], Awaitable[None]]
"""``listener(conn, actor, change)``, awaited in the change's transaction."""
_LISTENERS: Final[list[MembershipListener]] = []


def on_membership_change(listener: MembershipListener) -> None:
    """Tell ``listener`` of every change of :class:`MembershipChange` (a membership's status
    changed, a membership removed, an organization or a user deleted), in the change's
    transaction, after the membership row is locked (or the organization's, or the user's) and
    before anything is deleted. A listener that raises rolls the change back. Registered at app
    setup; registering one again changes nothing."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)
    users.on_removal(_user_removed)


async def _tell(conn: asyncpg.Connection, actor: Actor, change: MembershipChange) -> None:
    for listener in _LISTENERS:
        await listener(conn, actor, change)


async def _user_removed(conn: asyncpg.Connection, actor: Actor, user_id: str) -> None:
    """The user is being deleted: each of its memberships (locked) is removed."""
    for row in await repository.lock_user_memberships(conn, user_id):
        await _tell(conn, actor, MembershipChange(row["organization_id"], user_id,
                                                  row["status"], None))


# --- organizations -----------------------------------------------------------------------------


async def find_organization(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, org_id: str,
                            *, for_update: bool = False) -> Organization:
    """The organization, its row locked for the caller's transaction with ``for_update``.
    Raises OrganizationNotFound when the id is malformed, unknown or another project's."""
    org = await repository.find_organization(conn, project_id, org_id, for_update=for_update) \
        if is_id(org_id, "org") else None
    if org is None:
        raise OrganizationNotFound()
    return org


async def create_organization(conn: asyncpg.Connection, actor: Actor, *,
                              body: CreateOrganization) -> Organization:
    """Create the organization with ``organization.created``. Raises SlugInUse."""
    async with conn.transaction():
        try:
            org = await repository.insert_organization(
                conn, project_id=_project(actor), name=body.name, slug=body.slug,
                metadata=body.metadata or {})
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == SLUG_CONSTRAINT:
                raise SlugInUse(details={"slug": body.slug}) from None
            raise
        await audit.record(
            conn, actor, action="organization.created", target_type="organization",
            target_id=org.id, description=f"Created organization {body.name!r} ({body.slug})",
            metadata={"name": body.name, "slug": body.slug},
        )
    return org


async def update_organization(conn: asyncpg.Connection, actor: Actor, *, org_id: str,
                              body: UpdateOrganization) -> Organization:
    """Apply the fields present; ``organization.updated`` names the changed fields (and the
    old and new slug). Raises OrganizationNotFound, SlugInUse."""
    project_id = _project(actor)
    async with conn.transaction():
        org = await find_organization(conn, project_id, org_id, for_update=True)
        changes = {name: getattr(body, name) for name in sorted(body.model_fields_set)
                   if getattr(body, name) != getattr(org, name)}
        if not changes:
            return org
        try:
            updated = await repository.update_organization(conn, project_id, org_id, changes)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == SLUG_CONSTRAINT:
                raise SlugInUse(details={"slug": body.slug}) from None
            raise
        metadata: dict[str, Any] = {"changed": list(changes)}
        if "slug" in changes:
            metadata.update(old_slug=org.slug, new_slug=changes["slug"])
        await audit.record(
            conn, actor, action="organization.updated", target_type="organization",
            target_id=org_id, description=f"Updated organization {org_id} ({', '.join(changes)})",
            metadata=metadata,
        )
    return updated


async def remove_organization(conn: asyncpg.Connection, actor: Actor, *, org_id: str) -> None:
    """Delete the organization with ``organization.deleted`` (and how many memberships it had).
    Raises OrganizationNotFound."""
    async with conn.transaction():
        org = await find_organization(conn, _project(actor), org_id, for_update=True)
        await _tell(conn, actor, MembershipChange(org_id, None, None, None))
        members = await repository.delete_organization(conn, org_id)
        await audit.record(
            conn, actor, action="organization.deleted", target_type="organization",
            target_id=org_id, description=f"Deleted organization {org.name!r} ({org.slug})",
            metadata={"name": org.name, "slug": org.slug, "memberships_removed": members},
        )


async def list_organizations(pool: asyncpg.Pool, orgs: Listing,
                             query: PageQuery) -> Page[Organization]:
    """A page of the project's organizations in creation order."""
    return await page_by_id(pool, orgs, query, table="organizations",
                            columns=repository.ORG_COLUMNS, row=repository.organization)


# --- memberships -------------------------------------------------------------------------------


membership_from = repository.membership_from
"""SQL: the CTEs making a user created by the same statement a member, with its
``membership.created`` (``repository.membership_from``)."""


def membership_params(actor: Actor, *, org_id: str, user_id: str,
                      role: str) -> dict[str, object]:
    """The named parameters of :data:`membership_from` for ``user_id`` (the id the statement
    gives its new user): a new ``mem_`` id and the event :func:`add_membership` records."""
    membership_id = new_id("mem")
    return {
        "membership_id": membership_id, "membership_project_id": _project(actor),
        "membership_organization_id": org_id, "membership_role": role,
        **audit.event_params(
            actor, name="membership_event", action="membership.created",
            target_type="membership", target_id=membership_id, user_id=user_id,
            description=f"Added user {user_id} to organization {org_id} as {role}",
            metadata={"organization_id": org_id, "role": role}),
    }


async def add_membership(conn: asyncpg.Connection, actor: Actor, *, org_id: str, user_id: str,
                         role: str) -> Membership:
    """Make ``user_id`` an active member of ``org_id`` with ``role`` and record
    ``membership.created``, in the caller's transaction (a savepoint of it, so a refusal leaves
    the caller's transaction usable). Both rows are share-locked so neither can be deleted
    under us. Raises OrganizationNotFound, UserNotFound, AlreadyAMember."""
    project_id = _project(actor)
    async with conn.transaction():
        if not is_id(org_id, "org") or await repository.share_lock_organization(
                conn, project_id, org_id) is None:
            raise OrganizationNotFound()
        if not is_id(user_id, "user") or not await repository.share_lock_user(
                conn, project_id, user_id):
            raise UserNotFound()
        membership = await repository.insert_membership(
            conn, project_id=project_id, org_id=org_id, user_id=user_id, role=role)
        if membership is None:
            existing = await repository.membership_of(conn, org_id, user_id)
            raise AlreadyAMember(details={"membership_id": existing.id if existing else None})
        await audit.record(
            conn, actor, action="membership.created", target_type="membership",
            target_id=membership.id, user_id=user_id,
            description=f"Added user {user_id} to organization {org_id} as {role}",
            metadata={"organization_id": org_id, "role": role},
        )
    return membership


async def find_membership(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, org_id: str,
                          membership_id: str, *, for_update: bool = False) -> Membership:
    """The membership. Raises MembershipNotFound unless it is ``org_id``'s in ``project_id``."""
    membership = await repository.find_membership(
        conn, project_id, org_id, membership_id, for_update=for_update,
    ) if is_id(membership_id, "mem") else None
    if membership is None:
        raise MembershipNotFound()
    return membership


async def update_membership(conn: asyncpg.Connection, actor: Actor, *, org_id: str,
                            membership_id: str, body: UpdateMembership) -> Membership:
    """Change the role and/or status; each actual change records its event
    (``membership.role_changed``, ``membership.status_changed``). Raises MembershipNotFound."""
    async with conn.transaction():
        current = await find_membership(conn, _project(actor), org_id, membership_id,
                                        for_update=True)
        role = body.role if body.role is not None else current.role
        status = body.status if body.status is not None else current.status
        if role == current.role and status == current.status:
            return current
        updated = await repository.set_membership(conn, membership_id, role=role, status=status)
        user_id = current.user_id
        if status != current.status:
            await _tell(conn, actor, MembershipChange(org_id, user_id, current.status, status))
        if role != current.role:
            await audit.record(
                conn, actor, action="membership.role_changed", target_type="membership",
                target_id=membership_id, user_id=user_id,
                description=f"Changed the role of user {user_id} in organization {org_id} "
                            f"from {current.role} to {role}",
                metadata={"organization_id": org_id, "old_role": current.role, "new_role": role},
            )
        if status != current.status:
            await audit.record(
                conn, actor, action="membership.status_changed", target_type="membership",
                target_id=membership_id, user_id=user_id,
                description=f"Changed the membership status of user {user_id} in organization "
                            f"{org_id} from {current.status} to {status}",
                metadata={"organization_id": org_id, "old_status": current.status,
                          "new_status": status},
            )
    return updated


async def remove_membership(conn: asyncpg.Connection, actor: Actor, *, org_id: str,
                            membership_id: str) -> None:
    """Delete the membership with ``membership.removed``. Raises MembershipNotFound."""
    async with conn.transaction():
        current = await find_membership(conn, _project(actor), org_id, membership_id,
                                        for_update=True)
        await _tell(conn, actor, MembershipChange(org_id, current.user_id, current.status, None))
        await repository.delete_membership(conn, membership_id)
        await audit.record(
            conn, actor, action="membership.removed", target_type="membership",
            target_id=membership_id, user_id=current.user_id,
            description=f"Removed user {current.user_id} from organization {org_id}",
            metadata={"organization_id": org_id, "role": current.role, "status": current.status},
        )


async def list_memberships(pool: asyncpg.Pool, memberships: Listing, org_id: str,
                           query: MembershipsQuery) -> Page[Membership]:
    """A page of the organization's memberships in creation order, optionally only those with
    ``query.status``. Raises OrganizationNotFound, InvalidRequest (cursor)."""
    await find_organization(pool, memberships.project_id, org_id)
    status = query.status
    return await page_by_id(
        pool, memberships, query, table="memberships", columns=repository.MEMBERSHIP_COLUMNS,
        row=repository.membership,
        where=lambda p: f"organization_id = {p(org_id)}"
                        + (f" AND status = {p(status)}" if status is not None else ""),
    )


async def list_user_memberships(pool: asyncpg.Pool, memberships: Listing, user_id: str,
                                query: MembershipsQuery) -> Page[UserMembership]:
    """A page of the user's memberships in creation order, each with ``organization_name`` and
    ``organization_slug``; optionally only those with ``query.status``. Raises UserNotFound,
    InvalidRequest (cursor)."""
    await users.find_user(pool, memberships.project_id, user_id)
    status = query.status
    return await page_by_id(
        pool, memberships, query,
        table="memberships m JOIN organizations o ON o.id = m.organization_id", alias="m",
        columns=repository.USER_MEMBERSHIP_COLUMNS, row=repository.user_membership,
        where=lambda p: f"m.user_id = {p(user_id)}"
                        + (f" AND m.status = {p(status)}" if status is not None else ""),
    )


# --- invitations -------------------------------------------------------------------------------


def _already_a_member(org_id: str, membership: Membership) -> AlreadyAMember:
    if membership.status == "active":
        message = "A user with that email is already an active member of the organization."
    else:
        message = (f"A user with that email is already a {membership.status} member of the "
                   f"organization; reactivate the membership with PATCH /v1/organizations/{org_id}"
                   f"/memberships/{membership.id} {{\"status\": \"active\"}} instead of inviting them.")
    return AlreadyAMember(message, details={
        "membership_id": membership.id, "membership_status": membership.status,
        "user_id": membership.user_id})


async def create_invitation(conn: asyncpg.Connection, actor: Actor, *, org_id: str,
                            body: CreateInvitation, kms: LocalKms,
                            settings: Settings) -> Invitation:
    """Invite ``body.email`` to ``org_id`` with ``body.role``; queue the invitation link and
    record ``invitation.created`` in the same transaction. An expired pending invitation for the
    address is marked revoked (``invitation.revoked``, reason ``expired``) and replaced.

    Raises OrganizationNotFound, AlreadyAMember (the address is a user with any membership of
    the organization, active or suspended), InvitationPending.
    """
    project_id, email = _project(actor), body.email
    async with conn.transaction():
        org_name = await repository.share_lock_organization(conn, project_id, org_id) \
            if is_id(org_id, "org") else None
        if org_name is None:
            raise OrganizationNotFound()
        user = await users.find_by_email(conn, project_id, email)
        user_id = user.id if user is not None else None
        if user_id is not None:
            membership = await repository.membership_of(conn, org_id, user_id)
            if membership is not None:
                raise _already_a_member(org_id, membership)
        pending = await repository.pending_invitation(conn, org_id, email)
        invitation_id = new_id("inv")
        if pending is not None:
            if pending["live"]:
                raise InvitationPending(details={"invitation_id": pending["id"]})
            await repository.mark_invitation_revoked(conn, pending["id"])
            await audit.record(
                conn, actor, action="invitation.revoked", target_type="invitation",
                target_id=pending["id"], user_id=user_id,
                description=f"Replaced the expired invitation of {email} to organization {org_id}",
                metadata={"organization_id": org_id, "user_email": email, "reason": "expired",
                          "replaced_by": invitation_id},
            )
        try:
            invitation = await repository.insert_invitation(
                conn, invitation_id=invitation_id, project_id=project_id, org_id=org_id,
                email=email, role=body.role,
                ttl=timedelta(seconds=settings.invitation_ttl_seconds), created_by=actor.id)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == PENDING_INVITATION_CONSTRAINT:  # a concurrent one won
                raise InvitationPending() from None
            raise
        await magic_links.issue_link(
            conn, kms, settings, project_id=project_id, purpose="invitation", channel="email",
            destination=email, ttl_seconds=settings.invitation_ttl_seconds,
            invitation_id=invitation_id, organization_name=org_name, user_id=user_id,
        )
        await audit.record(
            conn, actor, action="invitation.created", target_type="invitation",
            target_id=invitation_id, user_id=user_id,
            description=f"Invited {email} to organization {org_id} as {body.role}",
            metadata={"organization_id": org_id, "user_email": email, "role": body.role},
        )
    return invitation


async def find_invitation(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, org_id: str,
                          invitation_id: str, *, for_update: bool = False) -> Invitation:
    """The invitation. Raises InvitationNotFound unless it is ``org_id``'s in ``project_id``."""
    invitation = await repository.find_invitation(
        conn, project_id, org_id, invitation_id, for_update=for_update,
    ) if is_id(invitation_id, "inv") else None
    if invitation is None:
        raise InvitationNotFound()
    return invitation


async def revoke_invitation(conn: asyncpg.Connection, actor: Actor, *, org_id: str,
                            invitation_id: str) -> Invitation:
    """Revoke a pending, unexpired invitation (its link stops working) with
    ``invitation.revoked``. Raises InvitationNotFound, InvitationNotPending."""
    async with conn.transaction():
        current = await find_invitation(conn, _project(actor), org_id, invitation_id,
                                        for_update=True)
        if current.status != "pending":
            raise InvitationNotPending(details={"status": current.status})
        revoked = await repository.mark_invitation_revoked(conn, invitation_id)
        await audit.record(
            conn, actor, action="invitation.revoked", target_type="invitation",
            target_id=invitation_id,
            description=f"Revoked the invitation of {current.email} to organization {org_id}",
            metadata={"organization_id": org_id, "user_email": current.email,
                      "reason": "revoked"},
        )
    return revoked


async def accept_invitation(conn: asyncpg.Connection, actor: Actor, *, invitation_id: str,
                            user_id: str) -> Membership:
    """Accept the invitation for ``user_id``, who proved control of the invited address, in the
    caller's transaction (a savepoint of it). The invitation must be pending and unexpired. The
    user becomes a member with the invitation's role unless already a member (a membership may
    be added between the invitation and its acceptance: it is kept as it is, role and status).
    Records ``invitation.accepted`` (plus ``membership.created`` when a membership was made) and
    returns the membership.

    Raises InvitationNotFound, InvitationNotPending, UserNotFound.
    """
    project_id = _project(actor)
    async with conn.transaction():
        row = await repository.lock_invitation_for_acceptance(conn, project_id, invitation_id) \
            if is_id(invitation_id, "inv") else None
        if row is None:
            raise InvitationNotFound()
        if row["status"] != "pending" or not row["live"]:
            status = row["status"] if row["status"] != "pending" else "expired"
            raise InvitationNotPending(details={"status": status})
        org_id = row["organization_id"]
        if not is_id(user_id, "user") or not await repository.user_exists(conn, project_id,
                                                                           user_id):
            raise UserNotFound()
        existing = await repository.membership_of(conn, org_id, user_id, for_update=True)
        if existing is not None:
            membership, created = existing, False
        else:
            membership = await add_membership(conn, actor, org_id=org_id, user_id=user_id,
                                              role=row["role"])
            created = True
        await repository.mark_invitation_accepted(conn, invitation_id, user_id)
        await audit.record(
            conn, actor, action="invitation.accepted", target_type="invitation",
            target_id=invitation_id, user_id=user_id,
            description=f"User {user_id} accepted the invitation to organization {org_id}",
            metadata={"organization_id": org_id, "user_email": row["email"], "role": row["role"],
                      "membership_id": membership.id, "membership_created": created},
        )
    return membership


async def list_invitations(pool: asyncpg.Pool, invitations: Listing, org_id: str,
                           query: InvitationsQuery) -> Page[Invitation]:
    """A page of the organization's invitations in creation order, optionally only those with
    ``query.status``. Raises OrganizationNotFound, InvalidRequest (cursor)."""
    await find_organization(pool, invitations.project_id, org_id)
    status = query.status
    return await page_by_id(
        pool, invitations, query, table="invitations", columns=repository.INVITATION_COLUMNS,
        row=repository.invitation,
        where=lambda p: f"organization_id = {p(org_id)}"
                        + (f" AND {repository.INVITATION_STATUS_WHERE[status]}" if status else ""),
    )
