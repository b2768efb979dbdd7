"""Memberships: a user's place in an organization, with a role and a status (SPEC.md 3, 6, 7;
issue 4).

Under ``/v1/organizations/{org_id}/memberships``:

* ``POST`` (``organizations:write``) ``{"user_id", "role"?}``: ``role`` matches
  ``^[a-z][a-z0-9_-]{0,63}$`` (default ``member``); the user must be one of the project's
  (``user_not_found``); a second membership of the same user is ``already_a_member`` (409).
  Records ``membership.created``.
* ``GET`` (keyset pages in creation order, optional ``status`` filter ``active`` or
  ``suspended``) and ``GET /{membership_id}``.
* ``PATCH /{membership_id}`` ``{"role"?, "status"?}``: records ``membership.role_changed``
  (metadata ``old_role``, ``new_role``) and ``membership.status_changed`` (``old_status``,
  ``new_status``), each only when that value actually changes. Only an ``active`` membership
  lets a session select the organization (SPEC.md 3).
* ``DELETE /{membership_id}``: records ``membership.removed``.

``GET /v1/users/{user_id}/memberships`` lists one user's memberships with each organization's
``organization_name`` and ``organization_slug`` (what an organization picker shows).

Reads accept ``users:read`` or ``organizations:write``. Any mismatch of (project, organization,
membership) is ``membership_not_found``; an unknown organization on the collection routes is
``organization_not_found``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import asyncpg
from aiohttp import web
from pydantic import AfterValidator

from common.appkeys import PG_POOL
from common.errors import (
    AlreadyAMember,
    InvalidRequest,
    MembershipNotFound,
    OrganizationNotFound,
    UserNotFound,
)
from common.http import json_response
from common.ids import is_id, new_id
from common.schemas import PatchModel, RequestModel, parse_body
from control_plane import audit
from control_plane.appkeys import CURSOR_SECRET
from control_plane.organizations import READ_SCOPES, WRITE_SCOPE, get_organization
from control_plane.pagination import project_page_by_id
from control_plane.principal import authenticate
from control_plane.users import get_user

MEMBERSHIP_COLUMNS: Final = "id, organization_id, user_id, role, status, created_at, updated_at"
ROLE_RE: Final = re.compile(r"[a-z][a-z0-9_-]{0,63}")
DEFAULT_ROLE: Final = "member"
STATUSES: Final = ("active", "suspended")


def _role(value: str) -> str:
    if ROLE_RE.fullmatch(value) is None:
        raise ValueError("must be 1 to 64 characters: a lowercase letter, then lowercase "
                         "letters, digits, '_' or '-'")
    return value


Role = Annotated[str, AfterValidator(_role)]
"""A membership role name such as ``member``, ``admin`` or ``billing-admin``."""


class AddMembershipBody(RequestModel):
    user_id: str
    role: Role = DEFAULT_ROLE


class UpdateMembershipBody(PatchModel):
    role: Role | None = None
    status: Literal["active", "suspended"] | None = None


async def add_membership(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str, org_id: str, user_id: str,
    role: str,
) -> dict[str, Any]:
    """Make ``user_id`` a member of ``org_id`` with ``role`` (status ``active``) and record
    ``membership.created``, in the caller's transaction (a savepoint of it, so a refusal leaves
    the caller's transaction usable). Both rows are share-locked so neither can be deleted
    under us. Returns the membership (``MEMBERSHIP_COLUMNS``).

    Raises OrganizationNotFound, UserNotFound (either not in ``project_id``), AlreadyAMember.
    """
    async with conn.transaction():
        if not is_id(org_id, "org") or await conn.fetchval(
            "SELECT 1 FROM organizations WHERE id = $1 AND project_id = $2 FOR KEY SHARE",
            org_id, project_id,
        ) is None:
            raise OrganizationNotFound()
        if not is_id(user_id, "user") or await conn.fetchval(
            "SELECT 1 FROM users WHERE id = $1 AND project_id = $2 FOR KEY SHARE",
            user_id, project_id,
        ) is None:
            raise UserNotFound()
        row = await conn.fetchrow(
            f"""INSERT INTO memberships (id, project_id, organization_id, user_id, role)
                VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT (organization_id, user_id) DO NOTHING
                RETURNING {MEMBERSHIP_COLUMNS}""",
            new_id("mem"), project_id, org_id, user_id, role,
        )
        if row is None:
            existing = await conn.fetchval(
                "SELECT id FROM memberships WHERE organization_id = $1 AND user_id = $2",
                org_id, user_id,
            )
            raise AlreadyAMember(details={"membership_id": existing})
        membership = dict(row)
        await audit.record(
            conn, actor, action="membership.created", project_id=project_id,
            target_type="membership", target_id=membership["id"], user_id=user_id,
            description=f"Added user {user_id} to organization {org_id} as {role}",
            metadata={"organization_id": org_id, "role": role},
        )
    return membership


async def _locked_membership(conn: asyncpg.Connection, project_id: str, org_id: str,
                             membership_id: str) -> dict[str, Any]:
    if not is_id(membership_id, "mem"):
        raise MembershipNotFound()
    row = await conn.fetchrow(
        f"""SELECT {MEMBERSHIP_COLUMNS} FROM memberships
            WHERE id = $1 AND organization_id = $2 AND project_id = $3 FOR UPDATE""",
        membership_id, org_id, project_id,
    )
    if row is None:
        raise MembershipNotFound()
    return dict(row)


async def get_membership(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, org_id: str,
                         membership_id: str) -> dict[str, Any]:
    """The membership. Raises MembershipNotFound unless it is ``org_id``'s in ``project_id``."""
    if not is_id(membership_id, "mem"):
        raise MembershipNotFound()
    row = await conn.fetchrow(
        f"""SELECT {MEMBERSHIP_COLUMNS} FROM memberships
            WHERE id = $1 AND organization_id = $2 AND project_id = $3""",
        membership_id, org_id, project_id,
    )
    if row is None:
        raise MembershipNotFound()
    return dict(row)


async def update_membership(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str, org_id: str,
    membership_id: str, body: UpdateMembershipBody,
) -> dict[str, Any]:
    """Change the role and/or status; each actual change records its event
    (``membership.role_changed``, ``membership.status_changed``). Raises MembershipNotFound."""
    async with conn.transaction():
        current = await _locked_membership(conn, project_id, org_id, membership_id)
        role = body.role if body.role is not None else current["role"]
        status = body.status if body.status is not None else current["status"]
        if role == current["role"] and status == current["status"]:
            return current
        row = await conn.fetchrow(
            f"""UPDATE memberships SET role = $2, status = $3, updated_at = now()
                WHERE id = $1 RETURNING {MEMBERSHIP_COLUMNS}""",
            membership_id, role, status,
        )
        assert row is not None
        user_id = current["user_id"]
        if role != current["role"]:
            await audit.record(
                conn, actor, action="membership.role_changed", project_id=project_id,
                target_type="membership", target_id=membership_id, user_id=user_id,
                description=f"Changed the role of user {user_id} in organization {org_id} "
                            f"from {current['role']} to {role}",
                metadata={"organization_id": org_id, "old_role": current["role"],
                          "new_role": role},
            )
        if status != current["status"]:
            await audit.record(
                conn, actor, action="membership.status_changed", project_id=project_id,
                target_type="membership", target_id=membership_id, user_id=user_id,
                description=f"Changed the membership status of user {user_id} in organization "
                            f"{org_id} from {current['status']} to {status}",
                metadata={"organization_id": org_id, "old_status": current["status"],
                          "new_status": status},
            )
    return dict(row)


async def remove_membership(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str, org_id: str,
    membership_id: str,
) -> None:
    """Delete the membership and record ``membership.removed``. Raises MembershipNotFound."""
    async with conn.transaction():
        current = await _locked_membership(conn, project_id, org_id, membership_id)
        await conn.execute("DELETE FROM memberships WHERE id = $1", membership_id)
        await audit.record(
            conn, actor, action="membership.removed", project_id=project_id,
            target_type="membership", target_id=membership_id, user_id=current["user_id"],
            description=f"Removed user {current['user_id']} from organization {org_id}",
            metadata={"organization_id": org_id, "role": current["role"],
                      "status": current["status"]},
        )


def _status_filter(query: Any) -> str | None:
    status: str | None = query.get("status")
    if status is not None and status not in STATUSES:
        raise InvalidRequest.field("status", f"must be one of {', '.join(STATUSES)}")
    return status


async def list_memberships(pool: asyncpg.Pool, project_id: str, org_id: str, query: Any, *,
                           secret: bytes) -> dict[str, Any]:
    """A page of the organization's memberships in creation order, optionally only those with
    ``status``. Raises OrganizationNotFound, InvalidRequest."""
    status = _status_filter(query)
    await get_organization(pool, project_id, org_id)
    return await project_page_by_id(
        pool, query, table="memberships", columns=MEMBERSHIP_COLUMNS, project_id=project_id,
        secret=secret, kind=f"memberships:{org_id}",
        where="organization_id = $2" + (" AND status = $3" if status is not None else ""),
        args=(org_id, status) if status is not None else (org_id,),
    )


_USER_MEMBERSHIP_COLUMNS: Final = (
    ", ".join(f"m.{c.strip()}" for c in MEMBERSHIP_COLUMNS.split(","))
    + ", o.name AS organization_name, o.slug AS organization_slug"
)


async def list_user_memberships(pool: asyncpg.Pool, project_id: str, user_id: str, query: Any, *,
                                secret: bytes) -> dict[str, Any]:
    """A page of the user's memberships in creation order, each with ``organization_name`` and
    ``organization_slug``; optional ``status`` filter. Raises UserNotFound, InvalidRequest."""
    status = _status_filter(query)
    await get_user(pool, project_id, user_id)
    return await project_page_by_id(
        pool, query, table="memberships m JOIN organizations o ON o.id = m.organization_id",
        alias="m", columns=_USER_MEMBERSHIP_COLUMNS, project_id=project_id, secret=secret,
        kind=f"user_memberships:{user_id}",
        where="m.user_id = $2" + (" AND m.status = $3" if status is not None else ""),
        args=(user_id, status) if status is not None else (user_id,),
    )


# --- handlers ---------------------------------------------------------------------------------


async def post_membership(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    body = await parse_body(request, AddMembershipBody)
    async with request.app[PG_POOL].acquire() as conn:
        membership = await add_membership(
            conn, audit.actor_from_request(request, principal), project_id=principal.project_id,
            org_id=request.match_info["org_id"], user_id=body.user_id, role=body.role,
        )
    return json_response(request, membership, status=201)


async def get_memberships(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    body = await list_memberships(request.app[PG_POOL], principal.project_id,
                                  request.match_info["org_id"], request.query,
                                  secret=request.app[CURSOR_SECRET])
    return json_response(request, body)


async def show_membership(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    membership = await get_membership(request.app[PG_POOL], principal.project_id,
                                      request.match_info["org_id"],
                                      request.match_info["membership_id"])
    return json_response(request, membership)


async def patch_membership(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    body = await parse_body(request, UpdateMembershipBody)
    async with request.app[PG_POOL].acquire() as conn:
        membership = await update_membership(
            conn, audit.actor_from_request(request, principal), project_id=principal.project_id,
            org_id=request.match_info["org_id"], membership_id=request.match_info["membership_id"],
            body=body,
        )
    return json_response(request, membership)


async def delete_membership(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    membership_id = request.match_info["membership_id"]
    async with request.app[PG_POOL].acquire() as conn:
        await remove_membership(conn, audit.actor_from_request(request, principal),
                                project_id=principal.project_id,
                                org_id=request.match_info["org_id"], membership_id=membership_id)
    return json_response(request, {"id": membership_id, "deleted": True})


async def get_user_memberships(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    body = await list_user_memberships(request.app[PG_POOL], principal.project_id,
                                       request.match_info["user_id"], request.query,
                                       secret=request.app[CURSOR_SECRET])
    return json_response(request, body)


def setup(app: web.Application) -> None:
    """Register the membership routes."""
    r = app.router
    base = "/v1/organizations/{org_id}/memberships"
    r.add_post(base, post_membership)
    r.add_get(base, get_memberships)
    r.add_get(base + "/{membership_id}", show_membership)
    r.add_patch(base + "/{membership_id}", patch_membership)
    r.add_delete(base + "/{membership_id}", delete_membership)
    r.add_get("/v1/users/{user_id}/memberships", get_user_memberships)
