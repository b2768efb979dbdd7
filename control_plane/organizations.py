"""Organizations of a project (SPEC.md 2 slug rule, 4, 6, 7; issue 4).

* ``POST /v1/organizations`` (``organizations:write``): ``name`` (display name), ``slug``
  (required; lowercase letters and digits with single hyphens between, at most 63 characters,
  else ``invalid_slug`` 422), optional ``metadata`` (JSON object, at most 16 KiB serialized).
  A slug another organization of the project holds is ``slug_in_use`` (409; the unique
  constraint decides, so concurrent creations cannot both win); other projects may reuse it.
* ``GET /v1/organizations`` (keyset pages in creation order), ``GET/PATCH/DELETE
  /v1/organizations/{org_id}`` (PATCH ``name``, ``slug``, ``metadata``; DELETE removes the
  organization with its memberships and invitations; sessions that had it selected lose their
  organization context).

Reads accept ``users:read`` or ``organizations:write``. Events ``organization.created``,
``organization.updated`` (names of the changed fields) and ``organization.deleted`` are written
in the transaction of the change. Unknown, malformed and other projects' ids are all
``organization_not_found``.
"""

from __future__ import annotations

import re
from typing import Any, Final

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL
from common.errors import InvalidSlug, OrganizationNotFound, SlugInUse
from common.http import json_response
from common.ids import is_id, new_id
from common.schemas import DisplayName, PatchModel, RequestModel, parse_body
from control_plane import audit
from control_plane.appkeys import CURSOR_SECRET
from control_plane.pagination import project_page_by_id
from control_plane.principal import authenticate
from control_plane.users import Metadata

ORG_COLUMNS: Final = "id, name, slug, metadata, created_at, updated_at"
READ_SCOPES: Final = ("users:read", "organizations:write")
WRITE_SCOPE: Final = "organizations:write"
SLUG_RE: Final = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
MAX_SLUG_LENGTH: Final = 63
_SLUG_CONSTRAINT: Final = "organizations_project_id_slug_key"


def check_slug(slug: str) -> str:
    """``slug`` when it is lowercase alphanumeric with single hyphens between and at most 63
    characters (SPEC.md 2). Raises InvalidSlug (422) naming the rule."""
    if len(slug) > MAX_SLUG_LENGTH or SLUG_RE.fullmatch(slug) is None:
        raise InvalidSlug(
            details={"slug": slug[:100], "rule": "^[a-z0-9]+(?:-[a-z0-9]+)*$",
                     "max_length": MAX_SLUG_LENGTH})
    return slug


class CreateOrganizationBody(RequestModel):
    name: DisplayName
    slug: str  # checked by check_slug: a bad slug is invalid_slug, not invalid_request
    metadata: Metadata | None = None


class UpdateOrganizationBody(PatchModel):
    name: DisplayName | None = None
    slug: str | None = None
    metadata: Metadata | None = None


async def get_organization(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                           org_id: str, *, for_update: bool = False) -> dict[str, Any]:
    """The organization's fields (``ORG_COLUMNS``), its row locked for the caller's transaction
    with ``for_update``. Raises OrganizationNotFound when the id is malformed, unknown or another
    project's."""
    if not is_id(org_id, "org"):
        raise OrganizationNotFound()
    row = await conn.fetchrow(
        f"SELECT {ORG_COLUMNS} FROM organizations WHERE id = $1 AND project_id = $2"
        + (" FOR UPDATE" if for_update else ""),
        org_id, project_id,
    )
    if row is None:
        raise OrganizationNotFound()
    return dict(row)


async def create_organization(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str,
    body: CreateOrganizationBody,
) -> dict[str, Any]:
    """Insert the organization with its ``organization.created`` event.
    Raises InvalidSlug, SlugInUse."""
    slug = check_slug(body.slug)
    async with conn.transaction():
        try:
            row = await conn.fetchrow(
                f"""INSERT INTO organizations (id, project_id, name, slug, metadata)
                    VALUES ($1, $2, $3, $4, $5) RETURNING {ORG_COLUMNS}""",
                new_id("org"), project_id, body.name, slug, body.metadata or {},
            )
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == _SLUG_CONSTRAINT:
                raise SlugInUse(details={"slug": slug}) from None
            raise
        assert row is not None
        org = dict(row)
        await audit.record(
            conn, actor, action="organization.created", project_id=project_id,
            target_type="organization", target_id=org["id"],
            description=f"Created organization {body.name!r} ({slug})",
            metadata={"name": body.name, "slug": slug},
        )
    return org


async def update_organization(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str, org_id: str,
    body: UpdateOrganizationBody,
) -> dict[str, Any]:
    """Apply the fields present in ``body`` (``metadata`` is replaced whole); records
    ``organization.updated`` with the changed field names when anything changed.
    Raises OrganizationNotFound, InvalidSlug, SlugInUse."""
    if body.slug is not None:
        check_slug(body.slug)
    async with conn.transaction():
        org = await get_organization(conn, project_id, org_id, for_update=True)
        changes = {name: getattr(body, name) for name in sorted(body.model_fields_set)
                   if getattr(body, name) != org[name]}
        if not changes:
            return org
        assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(changes, start=3))
        try:
            updated = await conn.fetchrow(
                f"""UPDATE organizations SET {assignments}, updated_at = now()
                    WHERE id = $1 AND project_id = $2 RETURNING {ORG_COLUMNS}""",
                org_id, project_id, *changes.values(),
            )
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == _SLUG_CONSTRAINT:
                raise SlugInUse(details={"slug": body.slug}) from None
            raise
        assert updated is not None
        metadata: dict[str, Any] = {"changed": list(changes)}
        if "slug" in changes:
            metadata.update(old_slug=org["slug"], new_slug=changes["slug"])
        await audit.record(
            conn, actor, action="organization.updated", project_id=project_id,
            target_type="organization", target_id=org_id,
            description=f"Updated organization {org_id} ({', '.join(changes)})",
            metadata=metadata,
        )
    return dict(updated)


async def delete_organization(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str, org_id: str,
) -> None:
    """Delete the organization; its memberships and invitations cascade, sessions that had it
    selected keep running without an organization. Records ``organization.deleted`` (with the
    number of memberships removed). Raises OrganizationNotFound."""
    async with conn.transaction():
        row = await get_organization(conn, project_id, org_id, for_update=True)
        # Under the row lock no membership can be added (its foreign key check waits on it).
        members = await conn.fetchval(
            "SELECT count(*) FROM memberships WHERE organization_id = $1", org_id)
        await conn.execute("DELETE FROM organizations WHERE id = $1", org_id)
        await audit.record(
            conn, actor, action="organization.deleted", project_id=project_id,
            target_type="organization", target_id=org_id,
            description=f"Deleted organization {row['name']!r} ({row['slug']})",
            metadata={"name": row["name"], "slug": row["slug"],
                      "memberships_removed": members},
        )


# --- handlers ---------------------------------------------------------------------------------


async def post_organization(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    body = await parse_body(request, CreateOrganizationBody)
    async with request.app[PG_POOL].acquire() as conn:
        org = await create_organization(conn, audit.actor_from_request(request, principal),
                                        project_id=principal.project_id, body=body)
    return json_response(request, org, status=201)


async def list_organizations(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    body = await project_page_by_id(request.app[PG_POOL], request.query, table="organizations",
                                    columns=ORG_COLUMNS, project_id=principal.project_id,
                                    secret=request.app[CURSOR_SECRET])
    return json_response(request, body)


async def show_organization(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    org = await get_organization(request.app[PG_POOL], principal.project_id,
                                 request.match_info["org_id"])
    return json_response(request, org)


async def patch_organization(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    body = await parse_body(request, UpdateOrganizationBody)
    async with request.app[PG_POOL].acquire() as conn:
        org = await update_organization(conn, audit.actor_from_request(request, principal),
                                        project_id=principal.project_id,
                                        org_id=request.match_info["org_id"], body=body)
    return json_response(request, org)


async def remove_organization(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    org_id = request.match_info["org_id"]
    async with request.app[PG_POOL].acquire() as conn:
        await delete_organization(conn, audit.actor_from_request(request, principal),
                                  project_id=principal.project_id, org_id=org_id)
    return json_response(request, {"id": org_id, "deleted": True})


def setup(app: web.Application) -> None:
    """Register the organization routes (memberships and invitations have their own modules)."""
    r = app.router
    r.add_post("/v1/organizations", post_organization)
    r.add_get("/v1/organizations", list_organizations)
    r.add_get("/v1/organizations/{org_id}", show_organization)
    r.add_patch("/v1/organizations/{org_id}", patch_organization)
    r.add_delete("/v1/organizations/{org_id}", remove_organization)
