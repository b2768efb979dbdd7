"""Organizations through HTTP: slug rule, slug uniqueness per project, show, update, delete, events
in the transaction of the change (SPEC.md 2, 4, 6, 7; issue 4)."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from tests.fixtures.database import events
from tests.fixtures.identity import create_user
from tests.fixtures.service import ULID, Api, Project, Response, assert_error, assert_invalid_field, scoped
from tests.organizations.helpers import create_org, slug

ORG_FIELDS = {"id", "name", "slug", "metadata", "created_at", "updated_at"}


async def patch(api: Api, org_id: str, body: Any) -> Response:
    return await api.request("PATCH", f"/v1/organizations/{org_id}", json=body)


async def org_count(db: asyncpg.Pool, project_id: str) -> int:
    return int(await db.fetchval("SELECT count(*) FROM organizations WHERE project_id = $1",
                                 project_id))


# --- create -----------------------------------------------------------------------------------


async def test_create_returns_the_organization_and_records_the_event(
    project: Project, db: asyncpg.Pool
) -> None:
    r = await project.api.post("/v1/organizations", {"name": "  Acme Inc  ", "slug": "acme-inc",
                                                     "metadata": {"tier": "gold"}})
    assert r.status == 201, r.body
    org = r.body
    assert set(org) == ORG_FIELDS | {"request_id"}
    assert re.fullmatch(rf"org_{ULID}", org["id"])
    assert org["name"] == "Acme Inc" and org["slug"] == "acme-inc"
    assert org["metadata"] == {"tier": "gold"}
    created = await events(db, project.id, "organization.created")
    assert len(created) == 1
    assert created[0]["target_type"] == "organization" and created[0]["target_id"] == org["id"]
    assert created[0]["metadata"]["slug"] == "acme-inc"
    assert created[0]["api_key_id"] == project.key_id


@pytest.mark.parametrize("good", ["a", "0", "acme", "acme-inc", "a1-b2-c3", "x" * 63,
                                  "2024-team"])
async def test_valid_slugs(project: Project, good: str) -> None:
    org = await create_org(project.api, org_slug=good)
    assert org["slug"] == good


@pytest.mark.parametrize("bad", ["", "Acme", "acme_inc", "-acme", "acme-", "ac--me", "acme inc",
                                 "ácme", "acme.inc", "x" * 64, " acme", "acme\n"])
async def test_invalid_slug_is_invalid_slug_and_creates_nothing(
    project: Project, db: asyncpg.Pool, bad: str
) -> None:
    r = await project.api.post("/v1/organizations", {"name": "Acme", "slug": bad})
    assert_error(r, 422, "invalid_slug")
    assert await org_count(db, project.id) == 0
    assert await events(db, project.id, "organization.created") == []


@pytest.mark.parametrize(("payload", "field"), [
    ({"slug": "acme"}, "name"),
    ({"name": "", "slug": "acme"}, "name"),
    ({"name": "   ", "slug": "acme"}, "name"),
    ({"name": "Acme"}, "slug"),
    ({"name": "Acme", "slug": 5}, "slug"),
    ({"name": "Acme", "slug": None}, "slug"),
    ({"name": "Acme", "slug": "acme", "metadata": [1]}, "metadata"),
    ({"name": "Acme", "slug": "acme", "metadata": {"x": "y" * 17_000}}, "metadata"),
    ({"name": "Acme", "slug": "acme", "domain": "acme.com"}, "domain"),
])
async def test_invalid_body_is_invalid_request(
    project: Project, db: asyncpg.Pool, payload: dict[str, Any], field: str
) -> None:
    r = await project.api.post("/v1/organizations", payload)
    assert_error(r, 400, "invalid_request")
    assert field in [f["field"] for f in r.body["error"]["details"]["fields"]], r.body
    assert await org_count(db, project.id) == 0


async def test_duplicate_slug_is_slug_in_use_and_leaves_no_event(
    project: Project, db: asyncpg.Pool
) -> None:
    first = await create_org(project.api, org_slug="taken")
    r = await project.api.post("/v1/organizations", {"name": "Other", "slug": "taken"})
    assert_error(r, 409, "slug_in_use")
    assert await org_count(db, project.id) == 1
    created = await events(db, project.id, "organization.created")
    assert [e["target_id"] for e in created] == [first["id"]]


async def test_concurrent_creations_with_one_slug_make_one_organization(
    project: Project, db: asyncpg.Pool
) -> None:
    results = await asyncio.gather(*(project.api.post("/v1/organizations",
                                                      {"name": f"n{i}", "slug": "race"})
                                     for i in range(6)))
    assert sorted(r.status for r in results) == [201] + [409] * 5, [r.body for r in results]
    assert await org_count(db, project.id) == 1
    assert len(await events(db, project.id, "organization.created")) == 1


async def test_the_same_slug_in_another_project_is_fine(
    project: Project, new_project: Callable[..., Any]
) -> None:
    other = await new_project("orgs-other")
    a = await create_org(project.api, org_slug="shared")
    b = await create_org(other.api, org_slug="shared")
    assert a["id"] != b["id"]


# --- list, show -------------------------------------------------------------------------------


async def test_list_pages_in_creation_order_and_only_the_callers_project(
    project: Project, new_project: Callable[..., Any]
) -> None:
    other = await new_project("orgs-list-other")
    await create_org(other.api)
    created = [await create_org(project.api, name=f"Org {i}") for i in range(3)]
    first = await project.api.get("/v1/organizations?limit=2")
    assert first.status == 200, first.body
    assert first.body["has_more"] is True and len(first.body["data"]) == 2
    second = await project.api.get(f"/v1/organizations?limit=2&cursor={first.body['next_cursor']}")
    assert second.body["has_more"] is False and second.body["next_cursor"] is None
    seen = [o["id"] for o in first.body["data"] + second.body["data"]]
    assert seen == [o["id"] for o in created]
    assert all(set(o) == ORG_FIELDS for o in first.body["data"])
    # A cursor of another listing is refused.
    await create_user(project.api)
    await create_user(project.api)
    users_page = await project.api.get("/v1/users?limit=1")
    assert_error(await project.api.get(f"/v1/organizations?cursor={users_page.body['next_cursor']}"),
                 400, "invalid_request")


async def test_show_and_not_found(project: Project, new_project: Callable[..., Any]) -> None:
    org = await create_org(project.api, metadata={"k": [1, 2]})
    r = await project.api.get(f"/v1/organizations/{org['id']}")
    assert r.status == 200, r.body
    assert {k: r.body[k] for k in ORG_FIELDS} == {k: org[k] for k in ORG_FIELDS}
    other = await new_project("orgs-show-other")
    theirs = await create_org(other.api)
    for org_id in (theirs["id"], "org_" + "0" * 26, "acme", "user_" + "0" * 26):
        assert_error(await project.api.get(f"/v1/organizations/{org_id}"), 404,
                     "organization_not_found")
        assert_error(await patch(project.api, org_id, {"name": "x"}), 404, "organization_not_found")
        assert_error(await project.api.delete(f"/v1/organizations/{org_id}"), 404,
                     "organization_not_found")
    assert (await other.api.get(f"/v1/organizations/{theirs['id']}")).body["name"] == "Acme"


@pytest.mark.parametrize(("metadata", "field"), [
    ({"a": {"b": "\u0000"}}, "metadata.a.b"),
    ({"k\u0000": True}, "metadata"),
])
async def test_a_nul_in_metadata_is_invalid_request_naming_it(
    project: Project, db: asyncpg.Pool, metadata: dict[str, Any], field: str
) -> None:
    """PostgreSQL's jsonb cannot hold NUL: it reached the insert and answered 500."""
    r = await project.api.post("/v1/organizations", {"name": "Acme", "slug": slug(),
                                                     "metadata": metadata})
    assert_invalid_field(r, field)
    assert await org_count(db, project.id) == 0
    org = await create_org(project.api)
    assert_invalid_field(await patch(project.api, org["id"], {"metadata": metadata}), field)
    assert (await project.api.get(f"/v1/organizations/{org['id']}")).body["metadata"] == {}


async def test_metadata_nested_too_deep_is_invalid_request(project: Project) -> None:
    """Past 254 levels the size check could not serialize it (orjson's limit): a 500."""
    deep = b"[" * 299 + b"]" * 299
    r = await project.api.post("/v1/organizations", data=b'{"name": "Acme", "slug": "%s", '
                               b'"metadata": {"a": %s}}' % (slug().encode(), deep))
    assert_invalid_field(r, "metadata", "must nest at most 32 levels")


async def test_a_control_character_in_a_path_id_is_invalid_request_naming_it(
    project: Project
) -> None:
    org = await create_org(project.api)
    base = f"/v1/organizations/{org['id']}"
    for method, path, field in [
        ("GET", "/v1/organizations/%00", "org_id"),
        ("DELETE", "/v1/organizations/org_%00", "org_id"),
        ("GET", "/v1/organizations/%00/memberships", "org_id"),
        ("GET", f"{base}/memberships/mem_%00", "membership_id"),
        ("DELETE", f"{base}/memberships/%01", "membership_id"),
        ("GET", f"{base}/invitations/inv_%00", "invitation_id"),
        ("POST", f"{base}/invitations/%00/revoke", "invitation_id"),
    ]:
        r = await project.api.request(method, path)
        assert_invalid_field(r, field, "must not contain control characters")


# --- update -----------------------------------------------------------------------------------


async def test_patch_changes_fields_with_one_event(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api, metadata={"a": 1})
    new_slug = slug()
    r = await patch(project.api, org["id"], {"name": "Renamed", "slug": new_slug,
                                              "metadata": {"b": 2}})
    assert r.status == 200, r.body
    assert r.body["name"] == "Renamed" and r.body["slug"] == new_slug
    assert r.body["metadata"] == {"b": 2}
    updated = await events(db, project.id, "organization.updated")
    assert len(updated) == 1 and updated[0]["target_id"] == org["id"]
    assert updated[0]["metadata"]["changed"] == ["metadata", "name", "slug"]
    assert updated[0]["metadata"]["old_slug"] == org["slug"]
    assert updated[0]["metadata"]["new_slug"] == new_slug
    # No change, no event.
    same = await patch(project.api, org["id"], {"name": "Renamed"})
    assert same.status == 200 and same.body["updated_at"] == r.body["updated_at"]
    assert len(await events(db, project.id, "organization.updated")) == 1


async def test_patch_slug_rules(project: Project, db: asyncpg.Pool) -> None:
    taken = await create_org(project.api)
    org = await create_org(project.api)
    assert_error(await patch(project.api, org["id"], {"slug": taken["slug"]}), 409, "slug_in_use")
    assert_error(await patch(project.api, org["id"], {"slug": "Bad Slug"}), 422, "invalid_slug")
    assert_error(await patch(project.api, org["id"], {}), 400, "invalid_request")
    assert_error(await patch(project.api, org["id"], {"slug": None}), 400, "invalid_request")
    assert_error(await patch(project.api, org["id"], {"slug": "Bad", "name": None}), 400,
                 "invalid_request")  # a misplaced null comes first
    assert_error(await patch(project.api, org["id"], {"owner": "x"}), 400, "invalid_request")
    assert (await project.api.get(f"/v1/organizations/{org['id']}")).body["slug"] == org["slug"]
    assert await events(db, project.id, "organization.updated") == []


# --- delete -----------------------------------------------------------------------------------


async def test_delete_removes_memberships_and_invitations(
    project: Project, db: asyncpg.Pool
) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    m = await project.api.post(f"/v1/organizations/{org['id']}/memberships", {"user_id": user["id"]})
    assert m.status == 201, m.body
    inv = await project.api.post(f"/v1/organizations/{org['id']}/invitations",
                                 {"email": f"inv-{secrets.token_hex(4)}@example.com"})
    assert inv.status == 201, inv.body
    r = await project.api.delete(f"/v1/organizations/{org['id']}")
    assert r.status == 200, r.body
    assert r.body["id"] == org["id"] and r.body["deleted"] is True
    assert_error(await project.api.get(f"/v1/organizations/{org['id']}"), 404,
                 "organization_not_found")
    assert await db.fetchval("SELECT count(*) FROM memberships WHERE organization_id = $1",
                             org["id"]) == 0
    assert await db.fetchval("SELECT count(*) FROM invitations WHERE organization_id = $1",
                             org["id"]) == 0
    deleted = await events(db, project.id, "organization.deleted")
    assert len(deleted) == 1 and deleted[0]["target_id"] == org["id"]
    assert deleted[0]["metadata"]["memberships_removed"] == 1
    # The user remains; the slug is free again.
    assert (await project.api.get(f"/v1/users/{user['id']}")).status == 200
    await create_org(project.api, org_slug=org["slug"])


# --- scopes -----------------------------------------------------------------------------------


async def test_scopes_are_enforced(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    reader = await scoped(project, "users:read")
    assert (await reader.get("/v1/organizations")).status == 200
    assert (await reader.get(f"/v1/organizations/{org['id']}")).status == 200
    assert_error(await reader.post("/v1/organizations", {"name": "n", "slug": slug()}), 403,
                 "insufficient_scope")
    assert_error(await patch(reader, org["id"], {"name": "x"}), 403, "insufficient_scope")
    assert_error(await reader.delete(f"/v1/organizations/{org['id']}"), 403, "insufficient_scope")
    writer = await scoped(project, "organizations:write")
    assert (await writer.get(f"/v1/organizations/{org['id']}")).status == 200
    assert (await writer.post("/v1/organizations", {"name": "n", "slug": slug()})).status == 201
    unrelated = await scoped(project, "users:write", "authz:write")
    assert_error(await unrelated.get("/v1/organizations"), 403, "insufficient_scope")
    assert_error(await unrelated.post("/v1/organizations", {"name": "n", "slug": slug()}), 403,
                 "insufficient_scope")
    assert await org_count(db, project.id) == 2
