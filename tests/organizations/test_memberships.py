"""Memberships through HTTP: add, list, show, change role and status, remove, a user's
organizations (SPEC.md 3, 6, 7; issue 4)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from tests.fixtures.database import events
from tests.fixtures.identity import create_user, email, latest_link, session_call, token_of, verify
from tests.fixtures.service import ULID, Project, assert_error, scoped
from tests.organizations.helpers import add, add_ok, create_org, patch_membership

MEMBERSHIP_FIELDS = {"id", "organization_id", "user_id", "role", "status", "created_at",
                     "updated_at"}


# --- add --------------------------------------------------------------------------------------


async def test_add_creates_an_active_membership_with_its_event(
    project: Project, db: asyncpg.Pool
) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    r = await add(project.api, org["id"], user["id"])
    assert r.status == 201, r.body
    m = r.body
    assert set(m) == MEMBERSHIP_FIELDS | {"request_id"}
    assert re.fullmatch(rf"mem_{ULID}", m["id"])
    assert (m["organization_id"], m["user_id"]) == (org["id"], user["id"])
    assert m["role"] == "member" and m["status"] == "active"
    created = await events(db, project.id, "membership.created")
    assert len(created) == 1
    e = created[0]
    assert (e["target_type"], e["target_id"], e["user_id"]) == ("membership", m["id"], user["id"])
    assert e["metadata"]["organization_id"] == org["id"] and e["metadata"]["role"] == "member"


@pytest.mark.parametrize("role", ["admin", "owner", "billing-admin", "read_only", "a",
                                  "r" + "x" * 63])
async def test_valid_roles(project: Project, role: str) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    assert (await add_ok(project.api, org["id"], user["id"], role=role))["role"] == role


@pytest.mark.parametrize(("body", "field"), [
    ({"role": "Admin"}, "role"),
    ({"role": "1admin"}, "role"),
    ({"role": ""}, "role"),
    ({"role": "r" + "x" * 64}, "role"),
    ({"role": "ad min"}, "role"),
    ({"role": None}, "role"),
    ({"status": "active"}, "status"),
])
async def test_invalid_add_is_invalid_request(
    project: Project, db: asyncpg.Pool, body: dict[str, Any], field: str
) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    r = await add(project.api, org["id"], user["id"], **body)
    assert_error(r, 400, "invalid_request")
    assert field in [f["field"] for f in r.body["error"]["details"]["fields"]], r.body
    assert await events(db, project.id, "membership.created") == []


async def test_missing_user_id_is_invalid_request(project: Project) -> None:
    org = await create_org(project.api)
    r = await project.api.post(f"/v1/organizations/{org['id']}/memberships", {"role": "admin"})
    assert_error(r, 400, "invalid_request")


async def test_user_and_org_must_be_the_projects(
    project: Project, new_project: Callable[..., Any], db: asyncpg.Pool
) -> None:
    other = await new_project("mem-other")
    their_user = await create_user(other.api)
    their_org = await create_org(other.api)
    org = await create_org(project.api)
    user = await create_user(project.api)
    for user_id in (their_user["id"], "user_" + "0" * 26, "bob"):
        assert_error(await add(project.api, org["id"], user_id), 404, "user_not_found")
    for org_id in (their_org["id"], "org_" + "0" * 26, "acme"):
        assert_error(await add(project.api, org_id, user["id"]), 404, "organization_not_found")
    assert_error(await add(other.api, their_org["id"], user["id"]), 404, "user_not_found")
    assert await events(db, project.id, "membership.created") == []
    assert await events(db, other.id, "membership.created") == []


async def test_second_membership_is_already_a_member(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    first = await add_ok(project.api, org["id"], user["id"])
    r = await add(project.api, org["id"], user["id"], role="admin")
    assert_error(r, 409, "already_a_member")
    assert r.body["error"]["details"]["membership_id"] == first["id"]
    results = await asyncio.gather(*(add(project.api, org["id"], user["id"]) for _ in range(4)))
    assert {r.status for r in results} == {409}
    assert len(await events(db, project.id, "membership.created")) == 1


# --- list, show -------------------------------------------------------------------------------


async def test_list_with_paging_and_status_filter(project: Project) -> None:
    org = await create_org(project.api)
    other_org = await create_org(project.api)
    members = [await add_ok(project.api, org["id"], (await create_user(project.api))["id"])
               for _ in range(3)]
    await add_ok(project.api, other_org["id"], members[0]["user_id"])
    assert (await patch_membership(project.api, org["id"], members[1]["id"],
                                   {"status": "suspended"})).status == 200
    base = f"/v1/organizations/{org['id']}/memberships"
    page1 = await project.api.get(base + "?limit=2")
    assert page1.status == 200, page1.body
    assert page1.body["has_more"] is True
    page2 = await project.api.get(base + f"?limit=2&cursor={page1.body['next_cursor']}")
    assert page2.body["has_more"] is False
    listed = page1.body["data"] + page2.body["data"]
    assert [m["id"] for m in listed] == [m["id"] for m in members]
    assert all(set(m) == MEMBERSHIP_FIELDS for m in listed)
    active = await project.api.get(base + "?status=active")
    assert [m["id"] for m in active.body["data"]] == [members[0]["id"], members[2]["id"]]
    suspended = await project.api.get(base + "?status=suspended")
    assert [m["id"] for m in suspended.body["data"]] == [members[1]["id"]]
    assert_error(await project.api.get(base + "?status=deleted"), 400, "invalid_request")
    # A cursor of another organization's listing is refused.
    assert_error(await project.api.get(
        f"/v1/organizations/{other_org['id']}/memberships?cursor={page1.body['next_cursor']}"),
        400, "invalid_request")
    assert_error(await project.api.get("/v1/organizations/org_" + "0" * 26 + "/memberships"),
                 404, "organization_not_found")


async def test_show_and_membership_not_found_for_any_mismatch(
    project: Project, new_project: Callable[..., Any]
) -> None:
    org = await create_org(project.api)
    org_b = await create_org(project.api)
    m = await add_ok(project.api, org["id"], (await create_user(project.api))["id"])
    r = await project.api.get(f"/v1/organizations/{org['id']}/memberships/{m['id']}")
    assert r.status == 200, r.body
    assert {k: r.body[k] for k in MEMBERSHIP_FIELDS} == {k: m[k] for k in MEMBERSHIP_FIELDS}
    other = await new_project("mem-show-other")
    their_org = await create_org(other.api)
    theirs = await add_ok(other.api, their_org["id"], (await create_user(other.api))["id"])
    cases = [(org_b["id"], m["id"]), ("org_" + "0" * 26, m["id"]), (org["id"], "mem_" + "0" * 26),
             (org["id"], "nope"), (their_org["id"], theirs["id"]), (org["id"], theirs["id"])]
    for org_id, mem_id in cases:
        path = f"/v1/organizations/{org_id}/memberships/{mem_id}"
        assert_error(await project.api.get(path), 404, "membership_not_found")
        assert_error(await patch_membership(project.api, org_id, mem_id, {"role": "admin"}), 404,
                     "membership_not_found")
        assert_error(await project.api.delete(path), 404, "membership_not_found")
    assert (await other.api.get(
        f"/v1/organizations/{their_org['id']}/memberships/{theirs['id']}")).body["role"] == "member"


# --- update, remove ---------------------------------------------------------------------------


async def test_role_and_status_changes_emit_events_only_when_they_change(
    project: Project, db: asyncpg.Pool
) -> None:
    org = await create_org(project.api)
    m = await add_ok(project.api, org["id"], (await create_user(project.api))["id"])
    r = await patch_membership(project.api, org["id"], m["id"], {"role": "admin"})
    assert r.status == 200, r.body
    assert r.body["role"] == "admin" and r.body["status"] == "active"
    role_events = await events(db, project.id, "membership.role_changed")
    assert len(role_events) == 1
    assert role_events[0]["target_id"] == m["id"] and role_events[0]["user_id"] == m["user_id"]
    assert role_events[0]["metadata"]["old_role"] == "member"
    assert role_events[0]["metadata"]["new_role"] == "admin"
    assert await events(db, project.id, "membership.status_changed") == []
    # Same values again: nothing recorded.
    same = await patch_membership(project.api, org["id"], m["id"], {"role": "admin", "status": "active"})
    assert same.status == 200 and same.body["updated_at"] == r.body["updated_at"]
    assert len(await events(db, project.id, "membership.role_changed")) == 1
    # Both at once: one event each.
    both = await patch_membership(project.api, org["id"], m["id"], {"role": "owner", "status": "suspended"})
    assert both.body["role"] == "owner" and both.body["status"] == "suspended"
    role_events = await events(db, project.id, "membership.role_changed")
    status_events = await events(db, project.id, "membership.status_changed")
    assert len(role_events) == 2 and role_events[1]["metadata"]["old_role"] == "admin"
    assert len(status_events) == 1
    assert status_events[0]["metadata"]["old_status"] == "active"
    assert status_events[0]["metadata"]["new_status"] == "suspended"
    back = await patch_membership(project.api, org["id"], m["id"], {"status": "active"})
    assert back.body["status"] == "active"
    assert len(await events(db, project.id, "membership.status_changed")) == 2


@pytest.mark.parametrize("body", [{}, {"status": "banned"}, {"status": None}, {"role": "Admin"},
                                  {"role": None}, {"user_id": "user_x"}])
async def test_invalid_patch_is_invalid_request(project: Project, body: dict[str, Any]) -> None:
    org = await create_org(project.api)
    m = await add_ok(project.api, org["id"], (await create_user(project.api))["id"])
    assert_error(await patch_membership(project.api, org["id"], m["id"], body), 400, "invalid_request")


async def test_remove(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    m = await add_ok(project.api, org["id"], user["id"], role="admin")
    path = f"/v1/organizations/{org['id']}/memberships/{m['id']}"
    r = await project.api.delete(path)
    assert r.status == 200, r.body
    assert r.body == {"id": m["id"], "deleted": True, "request_id": r.body["request_id"]}
    assert_error(await project.api.get(path), 404, "membership_not_found")
    removed = await events(db, project.id, "membership.removed")
    assert len(removed) == 1
    assert removed[0]["target_id"] == m["id"] and removed[0]["user_id"] == user["id"]
    assert removed[0]["metadata"]["role"] == "admin"
    assert_error(await project.api.delete(path), 404, "membership_not_found")
    # The user can be added again.
    await add_ok(project.api, org["id"], user["id"])


async def test_suspended_membership_cannot_be_selected(project: Project) -> None:
    address = email()
    user = await create_user(project.api, address)
    org_a, org_b = await create_org(project.api), await create_org(project.api)
    await add_ok(project.api, org_a["id"], user["id"])
    mb = await add_ok(project.api, org_b["id"], user["id"])
    assert (await patch_membership(project.api, org_b["id"], mb["id"], {"status": "suspended"})).status == 200
    signed = await verify(project.api, project, token_of(await latest_link(project, address)))
    assert signed.status == 200, signed.body
    access = signed.body["access_token"]
    # One active membership left: that organization is selected.
    assert signed.body["session"]["organization_id"] == org_a["id"]
    r = await session_call(project.api, "POST", "/v1/sessions/switch-org", access,
                           {"organization_id": org_b["id"]})
    assert_error(r, 403, "not_a_member")


# --- a user's memberships ---------------------------------------------------------------------


async def test_user_memberships_carry_organization_name_and_slug(
    project: Project, new_project: Callable[..., Any]
) -> None:
    user = await create_user(project.api)
    orgs = [await create_org(project.api, name=f"Org {i}") for i in range(3)]
    made = [await add_ok(project.api, o["id"], user["id"], role=r)
            for o, r in zip(orgs, ["admin", "member", "owner"], strict=True)]
    await add_ok(project.api, orgs[0]["id"], (await create_user(project.api))["id"])
    r = await project.api.get(f"/v1/users/{user['id']}/memberships")
    assert r.status == 200, r.body
    assert [m["id"] for m in r.body["data"]] == [m["id"] for m in made]
    for m, o in zip(r.body["data"], orgs, strict=True):
        assert set(m) == MEMBERSHIP_FIELDS | {"organization_name", "organization_slug"}
        assert m["organization_id"] == o["id"]
        assert (m["organization_name"], m["organization_slug"]) == (o["name"], o["slug"])
    paged = await project.api.get(f"/v1/users/{user['id']}/memberships?limit=2")
    assert len(paged.body["data"]) == 2 and paged.body["has_more"] is True
    assert (await patch_membership(project.api, orgs[1]["id"], made[1]["id"],
                                   {"status": "suspended"})).status == 200
    active = await project.api.get(f"/v1/users/{user['id']}/memberships?status=active")
    assert [m["id"] for m in active.body["data"]] == [made[0]["id"], made[2]["id"]]
    other = await new_project("mem-user-other")
    assert_error(await other.api.get(f"/v1/users/{user['id']}/memberships"), 404, "user_not_found")
    assert_error(await project.api.get("/v1/users/user_" + "0" * 26 + "/memberships"), 404,
                 "user_not_found")


# --- scopes -----------------------------------------------------------------------------------


async def test_scopes_are_enforced(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    m = await add_ok(project.api, org["id"], user["id"])
    reader = await scoped(project, "users:read")
    base = f"/v1/organizations/{org['id']}/memberships"
    assert (await reader.get(base)).status == 200
    assert (await reader.get(f"{base}/{m['id']}")).status == 200
    assert (await reader.get(f"/v1/users/{user['id']}/memberships")).status == 200
    assert_error(await add(reader, org["id"], (await create_user(project.api))["id"]), 403,
                 "insufficient_scope")
    assert_error(await patch_membership(reader, org["id"], m["id"], {"role": "admin"}), 403,
                 "insufficient_scope")
    assert_error(await reader.delete(f"{base}/{m['id']}"), 403, "insufficient_scope")
    unrelated = await scoped(project, "authz:check")
    assert_error(await unrelated.get(base), 403, "insufficient_scope")
    assert_error(await unrelated.get(f"/v1/users/{user['id']}/memberships"), 403,
                 "insufficient_scope")
    assert len(await events(db, project.id, "membership.created")) == 1
    assert await events(db, project.id, "membership.role_changed") == []


async def test_user_memberships_page_with_a_status_filter_and_their_own_cursors(
    project: Project,
) -> None:
    user, other_user = await create_user(project.api), await create_user(project.api)
    orgs = [await create_org(project.api) for _ in range(4)]
    made = [await add_ok(project.api, o["id"], user["id"]) for o in orgs]
    theirs = await add_ok(project.api, orgs[0]["id"], other_user["id"])
    assert (await patch_membership(project.api, orgs[1]["id"], made[1]["id"],
                                   {"status": "suspended"})).status == 200
    path = f"/v1/users/{user['id']}/memberships?status=active&limit=1"
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        r = await project.api.get(path + (f"&cursor={cursor}" if cursor else ""))
        assert r.status == 200, r.body
        seen += [m["id"] for m in r.body["data"]]
        if not r.body["has_more"]:
            break
        cursor = r.body["next_cursor"]
    assert seen == [made[0]["id"], made[2]["id"], made[3]["id"]]
    assert all(m["id"] != theirs["id"] for m in r.body["data"])
    # A cursor of this user's listing is refused by another user's and by an organization's.
    first = await project.api.get(f"/v1/users/{user['id']}/memberships?limit=1")
    for elsewhere in (f"/v1/users/{other_user['id']}/memberships",
                      f"/v1/organizations/{orgs[0]['id']}/memberships"):
        assert_error(await project.api.get(f"{elsewhere}?cursor={first.body['next_cursor']}"), 400,
                     "invalid_request")
