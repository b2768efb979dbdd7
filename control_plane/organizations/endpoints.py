"""Organization, membership and invitation routes. Reads accept ``users:read`` or
``organizations:write``; writes need ``organizations:write``."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import (
    AlreadyAMember,
    InvalidEmail,
    InvalidSlug,
    InvitationNotFound,
    InvitationNotPending,
    InvitationPending,
    MembershipNotFound,
    OrganizationNotFound,
    SlugInUse,
    UserNotFound,
)
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, KMS
from control_plane.organizations import service
from control_plane.organizations.schemas import (
    AddMembership,
    CreateInvitation,
    CreateOrganization,
    Invitation,
    InvitationsQuery,
    Membership,
    MembershipsQuery,
    Organization,
    UpdateMembership,
    UpdateOrganization,
    UserMembership,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page, PageQuery
from control_plane.web.schemas import Deleted

routes = RouteTable("organizations", "Organizations, their memberships and invitations.")
READ: Final = auth.ApiKey("users:read", "organizations:write")
WRITE: Final = auth.ApiKey("organizations:write")
MEMBERSHIPS: Final = "/v1/organizations/{org_id}/memberships"
INVITATIONS: Final = "/v1/organizations/{org_id}/invitations"


def _listing(call: Call, kind: str) -> Listing:
    return Listing(kind, call.project_id, call.app[CURSOR_SECRET])


# --- organizations -----------------------------------------------------------------------------


@endpoint(routes, "POST", "/v1/organizations", auth=WRITE, errors=[InvalidSlug, SlugInUse],
          replies=[Reply(201, "The organization.", Organization)])
async def post_organizations(call: Call, body: CreateOrganization) -> web.Response:
    """Create an organization; its slug must be unique in the project."""
    async with call.connection() as conn:
        org = await service.create_organization(conn, call.actor, body=body)
    return call.reply(org, status=201)


@endpoint(routes, "GET", "/v1/organizations", auth=READ,
          replies=[Reply(200, "A page of organizations in creation order.", Page[Organization])])
async def get_organizations(call: Call, query: PageQuery) -> web.Response:
    """List the project's organizations."""
    page = await service.list_organizations(call.pool, _listing(call, "organizations"), query)
    return call.reply(page)


@endpoint(routes, "GET", "/v1/organizations/{org_id}", auth=READ, errors=[OrganizationNotFound],
          replies=[Reply(200, "The organization.", Organization)])
async def get_organization(call: Call) -> web.Response:
    """Show an organization."""
    org = await service.find_organization(call.pool, call.project_id, call.path("org_id"))
    return call.reply(org)


@endpoint(routes, "PATCH", "/v1/organizations/{org_id}", auth=WRITE,
          errors=[OrganizationNotFound, InvalidSlug, SlugInUse],
          replies=[Reply(200, "The organization as changed.", Organization)])
async def patch_organization(call: Call, body: UpdateOrganization) -> web.Response:
    """Change an organization's name, slug or metadata (replaced whole)."""
    async with call.connection() as conn:
        org = await service.update_organization(conn, call.actor, org_id=call.path("org_id"),
                                                body=body)
    return call.reply(org)


@endpoint(routes, "DELETE", "/v1/organizations/{org_id}", auth=WRITE,
          errors=[OrganizationNotFound], replies=[Reply(200, "Deleted.", Deleted)])
async def delete_organization(call: Call) -> web.Response:
    """Delete an organization with its memberships and invitations.

    Sessions that had it selected keep running without an organization."""
    org_id = call.path("org_id")
    async with call.connection() as conn:
        await service.remove_organization(conn, call.actor, org_id=org_id)
    return call.reply(Deleted(org_id))


# --- memberships -------------------------------------------------------------------------------


@endpoint(routes, "POST", MEMBERSHIPS, auth=WRITE,
          errors=[OrganizationNotFound, UserNotFound, AlreadyAMember],
          replies=[Reply(201, "The membership (active).", Membership)])
async def post_memberships(call: Call, body: AddMembership) -> web.Response:
    """Add a user of the project to the organization with a role (default ``member``)."""
    async with call.connection() as conn:
        membership = await service.add_membership(conn, call.actor, org_id=call.path("org_id"),
                                                  user_id=body.user_id, role=body.role)
    return call.reply(membership, status=201)


@endpoint(routes, "GET", MEMBERSHIPS, auth=READ, errors=[OrganizationNotFound],
          replies=[Reply(200, "A page of memberships in creation order.", Page[Membership])])
async def get_memberships(call: Call, query: MembershipsQuery) -> web.Response:
    """List the organization's memberships (``status`` filters)."""
    org_id = call.path("org_id")
    page = await service.list_memberships(call.pool, _listing(call, f"memberships:{org_id}"),
                                          org_id, query)
    return call.reply(page)


@endpoint(routes, "GET", MEMBERSHIPS + "/{membership_id}", auth=READ,
          errors=[MembershipNotFound], replies=[Reply(200, "The membership.", Membership)])
async def get_membership(call: Call) -> web.Response:
    """Show a membership."""
    membership = await service.find_membership(call.pool, call.project_id, call.path("org_id"),
                                               call.path("membership_id"))
    return call.reply(membership)


@endpoint(routes, "PATCH", MEMBERSHIPS + "/{membership_id}", auth=WRITE,
          errors=[MembershipNotFound],
          replies=[Reply(200, "The membership as changed.", Membership)])
async def patch_membership(call: Call, body: UpdateMembership) -> web.Response:
    """Change a membership's role or status (``active`` or ``suspended``)."""
    async with call.connection() as conn:
        membership = await service.update_membership(
            conn, call.actor, org_id=call.path("org_id"),
            membership_id=call.path("membership_id"), body=body)
    return call.reply(membership)


@endpoint(routes, "DELETE", MEMBERSHIPS + "/{membership_id}", auth=WRITE,
          errors=[MembershipNotFound], replies=[Reply(200, "Deleted.", Deleted)])
async def delete_membership(call: Call) -> web.Response:
    """Remove a user from the organization."""
    membership_id = call.path("membership_id")
    async with call.connection() as conn:
        await service.remove_membership(conn, call.actor, org_id=call.path("org_id"),
                                        membership_id=membership_id)
    return call.reply(Deleted(membership_id))


@endpoint(routes, "GET", "/v1/users/{user_id}/memberships", auth=READ, errors=[UserNotFound],
          replies=[Reply(200, "A page of the user's memberships.", Page[UserMembership])])
async def get_user_memberships(call: Call, query: MembershipsQuery) -> web.Response:
    """List one user's memberships with each organization's name and slug (an organization
    picker)."""
    user_id = call.path("user_id")
    page = await service.list_user_memberships(
        call.pool, _listing(call, f"user_memberships:{user_id}"), user_id, query)
    return call.reply(page)


# --- invitations -------------------------------------------------------------------------------


@endpoint(routes, "POST", INVITATIONS, auth=WRITE,
          errors=[InvalidEmail, OrganizationNotFound, AlreadyAMember, InvitationPending],
          replies=[Reply(201, "The invitation; its link is on its way.", Invitation)])
async def post_invitations(call: Call, body: CreateInvitation) -> web.Response:
    """Invite someone to the organization by email, with a role.

    The invitation expires after ``SERVICE_INVITATION_TTL_SECONDS`` (default 7 days); it is
    accepted by signing in through its link."""
    async with call.connection() as conn:
        invitation = await service.create_invitation(
            conn, call.actor, org_id=call.path("org_id"), body=body, kms=call.app[KMS],
            settings=call.settings)
    return call.reply(invitation, status=201)


@endpoint(routes, "GET", INVITATIONS, auth=READ, errors=[OrganizationNotFound],
          replies=[Reply(200, "A page of invitations in creation order.", Page[Invitation])])
async def get_invitations(call: Call, query: InvitationsQuery) -> web.Response:
    """List the organization's invitations (``status`` filters)."""
    org_id = call.path("org_id")
    page = await service.list_invitations(call.pool, _listing(call, f"invitations:{org_id}"),
                                          org_id, query)
    return call.reply(page)


@endpoint(routes, "GET", INVITATIONS + "/{invitation_id}", auth=READ,
          errors=[InvitationNotFound], replies=[Reply(200, "The invitation.", Invitation)])
async def get_invitation(call: Call) -> web.Response:
    """Show an invitation."""
    invitation = await service.find_invitation(call.pool, call.project_id, call.path("org_id"),
                                               call.path("invitation_id"))
    return call.reply(invitation)


@endpoint(routes, "POST", INVITATIONS + "/{invitation_id}/revoke", auth=WRITE,
          errors=[InvitationNotFound, InvitationNotPending],
          replies=[Reply(200, "The invitation, revoked.", Invitation)])
async def post_invitation_revoke(call: Call) -> web.Response:
    """Revoke a pending invitation: its link stops working."""
    async with call.connection() as conn:
        invitation = await service.revoke_invitation(
            conn, call.actor, org_id=call.path("org_id"),
            invitation_id=call.path("invitation_id"))
    return call.reply(invitation)
