"""SCIM Groups (issue 23): a directory group of the organization's members, and, when the
organization's token names a store, the tuples ``group:<grp_ id>#member@user:<user_ id>`` of its
active members, so that a directory group grants what the engine checks."""

from __future__ import annotations

from typing import Any

import asyncpg

from tests.fixtures.database import events
from tests.fixtures.service import Project
from tests.scim.helpers import GROUP, Directory, assert_scim_error, directory, user_body


async def _users(d: Directory, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        r = await d.post("/Users", user_body())
        assert r.status == 201, r.body
        ids.append(r.body["id"])
    return ids


async def _check(project: Project, store: str, user_id: str) -> bool:
    """Whether ``user:<user_id>`` may view ``document:plan``, at the store's latest revision."""
    revision = (await project.api.get(f"/v1/stores/{store}")).body["revision"]
    r = await project.api.post(f"/v1/stores/{store}/check", {
        "tuple_key": {"object": "document:plan", "relation": "viewer", "user": f"user:{user_id}"},
        "consistency": {"at_least_revision": revision}})
    assert r.status == 200, r.body
    return bool(r.body["allowed"])


async def _tuples(project: Project, store: str) -> set[tuple[str, str]]:
    r = await project.api.get(f"/v1/stores/{store}/tuples?relation=member&limit=1000")
    return {(t["object"], t["user"]) for t in r.body["data"]}


async def test_group_membership_grants_what_the_engine_checks(project: Project,
                                                              db: asyncpg.Pool) -> None:
    store = (await project.api.post("/v1/stores", {"name": "directory"})).body["id"]
    d = await directory(project, store_id=store)
    anne, bob, carol = await _users(d, 3)
    r = await d.post("/Groups", {"schemas": [GROUP], "displayName": "Engineering",
                                 "members": [{"value": anne}, {"value": bob}]})
    assert r.status == 201, r.body
    group = r.body
    assert group["id"].startswith("grp_") and r.headers["Location"].endswith(f"/Groups/{group['id']}")
    assert sorted(m["value"] for m in group["members"]) == sorted([anne, bob])
    # The application grants the group: its members may view the document.
    r = await project.api.post(f"/v1/stores/{store}/write", {"writes": [
        {"object": "document:plan", "relation": "viewer", "user": f"group:{group['id']}#member"}]})
    assert r.status == 200, r.body
    assert [await _check(project, store, u) for u in (anne, bob, carol)] == [True, True, False]
    path = f"/Groups/{group['id']}"
    # Entra's add, and removal by a value filter path.
    r = await d.patch(path, {"op": "Add", "path": "members", "value": [{"value": carol}]})
    assert r.status == 200, r.body
    r = await d.patch(path, {"op": "remove", "path": f'members[value eq "{anne}"]'})
    assert r.status == 200 and sorted(m["value"] for m in r.body["members"]) == sorted([bob, carol])
    assert [await _check(project, store, u) for u in (anne, bob, carol)] == [False, True, True]
    # A deactivated member loses the group's grant, and has it again once active.
    assert (await d.patch(f"/Users/{bob}", {"op": "replace", "path": "active",
                                            "value": False})).status == 200
    assert not await _check(project, store, bob)
    assert (await d.patch(f"/Users/{bob}", {"op": "replace", "path": "active",
                                            "value": True})).status == 200
    assert await _check(project, store, bob)
    # A deprovisioned user leaves its groups.
    assert (await d.delete(f"/Users/{carol}")).status == 204
    assert not await _check(project, store, carol)
    r = await d.get(path)
    assert [m["value"] for m in r.body["members"]] == [bob]
    # Deleting the group takes its tuples away.
    assert (await d.delete(path)).status == 204
    assert_scim_error(await d.get(path), 404)
    assert not await _check(project, store, bob)
    assert await _tuples(project, store) == set()
    synced = [e["metadata"] for e in await events(db, project.id, "scim.group.synced")]
    assert [s["change"] for s in synced] == ["created", "updated", "updated", "deleted"]
    assert synced[0]["members_added"] == [anne, bob] and synced[0]["store_id"] == store
    assert synced[2]["members_removed"] == [anne] and synced[2]["fields"] == ["members"]
    written = await events(db, project.id, "authz.tuples.written")
    # The application's own write, and seven of the directory's, each its own revision.
    assert sorted(e["actor_type"] for e in written) == ["api_key"] + ["scim"] * 7


async def test_groups_without_a_store_crud_filters_and_refusals(project: Project) -> None:
    d = await directory(project)
    anne, bob = await _users(d, 2)
    r = await d.post("/Groups", {"schemas": [GROUP], "displayName": "Sales", "externalId": "s1"})
    assert r.status == 201 and r.body.get("members", []) == []
    sales = r.body["id"]
    r = await d.post("/Groups", {"schemas": [GROUP], "displayName": "Support",
                                 "members": [{"value": anne}]})
    support = r.body["id"]
    assert_scim_error(await d.post("/Groups", {"schemas": [GROUP], "displayName": "sales"}),
                      409, "uniqueness")
    assert_scim_error(await d.post("/Groups", {"schemas": [GROUP], "displayName": "X",
                                               "members": [{"value": "user_01hzzzzzzzzzzzzzzzzzzzzzzz"}]}),
                      400, "invalidValue")

    async def ids(query: str) -> list[str]:
        r = await d.get("/Groups?" + query)
        assert r.status == 200, r.body
        return [g["id"] for g in r.body["Resources"]]

    assert await ids('filter=displayName eq "SALES"') == [sales]
    assert await ids(f'filter=members.value eq "{anne}"') == [support]
    assert await ids(f'filter=members[value eq "{anne}"] or externalId eq "s1"') == [sales, support]
    r = await d.get("/Groups?excludedAttributes=members")
    assert all("members" not in g for g in r.body["Resources"]) and r.body["totalResults"] == 2
    # PUT replaces the whole list; Okta's replace without a path renames.
    r = await d.put(f"/Groups/{support}", {"schemas": [GROUP], "displayName": "Support",
                                          "members": [{"value": bob}]})
    assert r.status == 200 and [m["value"] for m in r.body["members"]] == [bob]
    r = await d.patch(f"/Groups/{support}", {"op": "replace",
                                             "value": {"id": support, "displayName": "Helpdesk"}})
    assert r.status == 200 and r.body["displayName"] == "Helpdesk"
    # Entra's removal: a remove whose value lists the members.
    r = await d.patch(f"/Groups/{support}", {"op": "Remove", "path": "members",
                                             "value": [{"$ref": None, "value": bob}]})
    assert r.status == 200 and r.body.get("members", []) == []
    # A member must be a user of the organization, by its id.
    other = await directory(project)
    [stranger] = await _users(other, 1)
    r = await d.patch(f"/Groups/{support}", {"op": "add", "path": "members",
                                             "value": [{"value": stranger}]})
    assert_scim_error(r, 400, "invalidValue")
    assert_scim_error(await other.get(f"/Groups/{support}"), 404)


def _entra_user(i: int) -> dict[str, Any]:
    """Microsoft's "Create User" request (Tutorial: Develop and plan provisioning for a SCIM
    endpoint, "User Operations"), with addresses of its own per run."""
    return {
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User",
                    "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"],
        "externalId": f"0a21f0f2-8d2a-4f8e-bf98-7363c4aed4e{i}",
        "userName": f"Test_User_ab6490ee-1e48-479e-a20b-2d77186b5dd{i}",
        "active": True,
        "emails": [{"primary": True, "type": "work",
                    "value": f"Test_User_fd0ea19b-0777-472c-9f96-4f70d2226f2{i}@testuser.com"}],
        "meta": {"resourceType": "User"},
        "name": {"formatted": "givenName familyName", "familyName": "familyName",
                 "givenName": "givenName"},
        "roles": [],
    }


async def test_microsoft_entra_request_sequence(project: Project) -> None:
    """Microsoft Entra ID's requests as its provisioning tutorial lists them, in order."""
    d = await directory(project)
    body = _entra_user(0)
    # Get user by query (zero results), then create.
    r = await d.get(f'/Users?filter=userName eq "{body["userName"]}"')
    assert r.status == 200 and r.body["totalResults"] == 0 and r.body["Resources"] == []
    r = await d.post("/Users", body)
    assert r.status == 201, r.body
    uid = r.body["id"]
    assert r.body["externalId"] == body["externalId"] and r.body["active"] is True
    r = await d.get(f"/Users/{uid}")
    assert r.status == 200 and r.body["userName"] == body["userName"]
    r = await d.get(f'/Users?filter=userName eq "{body["userName"]}"')
    assert [u["id"] for u in r.body["Resources"]] == [uid]
    # Update User [Multi-valued properties]
    r = await d.patch(f"/Users/{uid}",
                      {"op": "Replace", "path": 'emails[type eq "work"].value',
                       "value": "updatedEmail@microsoft.com"},
                      {"op": "Replace", "path": "name.familyName", "value": "updatedFamilyName"})
    assert r.status == 200, r.body
    assert r.body["emails"][0]["value"] == "updatedEmail@microsoft.com"
    assert r.body["name"]["familyName"] == "updatedFamilyName"
    # Update User [Single-valued properties]
    r = await d.patch(f"/Users/{uid}", {"op": "Replace", "path": "userName",
                                        "value": "5b50642d-79fc-4410-9e90-4c077cdd1a59@testuser.com"})
    assert r.status == 200 and r.body["userName"] == "5b50642d-79fc-4410-9e90-4c077cdd1a59@testuser.com"
    # Disable User (Entra sends the boolean as a string when its flag says so).
    r = await d.patch(f"/Users/{uid}", {"op": "Replace", "path": "active", "value": "False"})
    assert r.status == 200 and r.body["active"] is False
    # Groups: create (with Microsoft's own schema URN among the schemas), read without members.
    r = await d.post("/Groups", {
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group",
                    "http://schemas.microsoft.com/2006/11/ResourceManagement/ADSCIM/2.0/Group"],
        "externalId": "8aa1a0c0-c4c3-4bc0-b4a5-2ef676900159", "displayName": "displayName",
        "meta": {"resourceType": "Group"}})
    assert r.status == 201, r.body
    gid = r.body["id"]
    r = await d.get(f"/Groups/{gid}?excludedAttributes=members")
    assert r.status == 200 and "members" not in r.body and r.body["displayName"] == "displayName"
    r = await d.get('/Groups?excludedAttributes=members&filter=displayName eq "displayName"')
    assert [g["id"] for g in r.body["Resources"]] == [gid]
    r = await d.patch(f"/Groups/{gid}", {"op": "Replace", "path": "displayName",
                                         "value": "1879db59-3bdf-4490-ad68-ab880a269474updatedDisplayName"})
    assert r.status == 200 and r.body["displayName"].endswith("updatedDisplayName")
    r = await d.patch(f"/Groups/{gid}", {"op": "Add", "path": "members",
                                         "value": [{"$ref": None, "value": uid}]})
    assert r.status == 200 and [m["value"] for m in r.body["members"]] == [uid]
    r = await d.patch(f"/Groups/{gid}", {"op": "Remove", "path": "members",
                                         "value": [{"$ref": None, "value": uid}]})
    assert r.status == 200 and r.body.get("members", []) == []
    assert (await d.delete(f"/Groups/{gid}")).status == 204
    assert (await d.delete(f"/Users/{uid}")).status == 204
    assert_scim_error(await d.get(f"/Users/{uid}"), 404)


async def test_okta_request_sequence(project: Project) -> None:
    """Okta's requests as its "SCIM 2.0 protocol reference" shows them, in order (the examples'
    addresses at okta.local, a special-use domain no e-mail address may have, are at
    example.com here)."""
    d = await directory(project)
    r = await d.get('/Users?filter=userName eq "test.user@example.com"&startIndex=1&count=100')
    assert r.status == 200 and r.body["totalResults"] == 0
    r = await d.post("/Users", {
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
        "userName": "test.user@example.com", "name": {"givenName": "Test", "familyName": "User"},
        "emails": [{"primary": True, "value": "test.user@example.com", "type": "work"}],
        "displayName": "Test User", "locale": "en-US", "externalId": "00ujl29u0le5T6Aj10h7",
        "groups": [], "password": "1mz050nq", "active": True})
    assert r.status == 201, r.body
    uid = r.body["id"]
    assert "password" not in r.body and r.body["locale"] == "en-US"
    r = await d.get(f"/Users/{uid}")
    assert r.status == 200 and r.body["displayName"] == "Test User"
    # Update a user (PUT of the whole resource, as Okta sends it back).
    full = r.body | {"name": {"givenName": "Another", "familyName": "User"}}
    r = await d.put(f"/Users/{uid}", full)
    assert r.status == 200 and r.body["name"]["givenName"] == "Another"
    # Deactivate, then reactivate: a replace without a path.
    r = await d.patch(f"/Users/{uid}", {"op": "replace", "value": {"active": False}})
    assert r.status == 200 and r.body["active"] is False
    r = await d.patch(f"/Users/{uid}", {"op": "replace", "value": {"active": True}})
    assert r.status == 200 and r.body["active"] is True
    # Groups: create empty, rename with id in the value, add, remove by filter, replace members.
    r = await d.post("/Groups", {"schemas": [GROUP], "displayName": "Test SCIMv2", "members": []})
    assert r.status == 201, r.body
    gid = r.body["id"]
    r = await d.patch(f"/Groups/{gid}", {"op": "replace",
                                         "value": {"id": gid, "displayName": "Test SCIMv2 b"}})
    assert r.status == 200 and r.body["displayName"] == "Test SCIMv2 b"
    r = await d.patch(f"/Groups/{gid}", {"op": "add", "path": "members",
                                         "value": [{"value": uid, "display": "test.user@example.com"}]})
    assert r.status == 200 and [m["value"] for m in r.body["members"]] == [uid]
    r = await d.patch(f"/Groups/{gid}", {"op": "remove", "path": f'members[value eq "{uid}"]'})
    assert r.status == 200 and r.body.get("members", []) == []
    r = await d.patch(f"/Groups/{gid}", {"op": "replace", "path": "members",
                                         "value": [{"value": uid, "display": "test.user@example.com"}]})
    assert r.status == 200 and [m["value"] for m in r.body["members"]] == [uid]
    r = await d.get('/Groups?filter=displayName eq "Test SCIMv2 b"&startIndex=1&count=100')
    assert [g["id"] for g in r.body["Resources"]] == [gid]
    assert (await d.delete(f"/Groups/{gid}")).status == 204


async def test_group_tuples_follow_membership_changes_made_outside_scim(
        project: Project, db: asyncpg.Pool) -> None:
    """The rule holds however the membership changes: a member's tuples exist while it is in the
    group and its membership is active. Suspending, reactivating and removing the membership
    through ``/v1/organizations``, deleting the user through ``/v1/users`` and deleting the
    organization each change what the engine answers, in the change's own transaction."""
    store = (await project.api.post("/v1/stores", {"name": "directory"})).body["id"]
    d = await directory(project, store_id=store)
    anne, bob, carol, dave = await _users(d, 4)
    r = await d.post("/Groups", {"schemas": [GROUP], "displayName": "Engineering",
                                 "members": [{"value": u} for u in (anne, bob, carol, dave)]})
    assert r.status == 201, r.body
    group = r.body["id"]
    r = await project.api.post(f"/v1/stores/{store}/write", {"writes": [
        {"object": "document:plan", "relation": "viewer", "user": f"group:{group}#member"}]})
    assert r.status == 200, r.body
    assert [await _check(project, store, u) for u in (anne, bob, carol, dave)] == [True] * 4
    listed = await project.api.get(f"/v1/organizations/{d.org_id}/memberships?limit=100")
    membership = {m["user_id"]: m["id"] for m in listed.body["data"]}
    path = f"/v1/organizations/{d.org_id}/memberships"

    r = await project.api.request("PATCH", f"{path}/{membership[anne]}",
                                  json={"status": "suspended"})
    assert r.status == 200 and r.body["status"] == "suspended", r.body
    assert not await _check(project, store, anne)
    assert await _check(project, store, bob)
    # The directory still lists the suspended member in its group; it is shown inactive.
    assert (await d.get(f"/Users/{anne}")).body["active"] is False
    assert anne in [m["value"] for m in (await d.get(f"/Groups/{group}")).body["members"]]
    # A role change alone leaves the tuples as they are.
    r = await project.api.request("PATCH", f"{path}/{membership[bob]}", json={"role": "admin"})
    assert r.status == 200, r.body
    assert await _check(project, store, bob)

    r = await project.api.request("PATCH", f"{path}/{membership[anne]}", json={"status": "active"})
    assert r.status == 200, r.body
    assert await _check(project, store, anne)

    r = await project.api.request("DELETE", f"{path}/{membership[anne]}")
    assert r.status == 200, r.body
    assert not await _check(project, store, anne)
    assert anne not in [m["value"] for m in (await d.get(f"/Groups/{group}")).body["members"]]

    r = await project.api.request("DELETE", f"/v1/users/{carol}")
    assert r.status == 200, r.body
    assert not await _check(project, store, carol)

    # Each status change is a revision of its own; a suspended member's removal has no tuples
    # left to delete, and writes nothing.
    written = len(await events(db, project.id, "authz.tuples.written"))
    r = await project.api.request("PATCH", f"{path}/{membership[bob]}",
                                  json={"status": "suspended"})
    assert r.status == 200 and not await _check(project, store, bob)
    r = await project.api.request("PATCH", f"{path}/{membership[bob]}", json={"status": "active"})
    assert r.status == 200 and await _check(project, store, bob)
    r = await project.api.request("PATCH", f"{path}/{membership[dave]}",
                                  json={"status": "suspended"})
    assert r.status == 200 and not await _check(project, store, dave)
    assert (await project.api.request("DELETE", f"{path}/{membership[dave]}")).status == 200
    assert len(await events(db, project.id, "authz.tuples.written")) == written + 3

    r = await project.api.request("DELETE", f"/v1/organizations/{d.org_id}")
    assert r.status == 200, r.body
    assert not await _check(project, store, bob)
    assert await _tuples(project, store) == set()
    # Each change went through the store's change log with its audit event, by the API key.
    writes = [e for e in await events(db, project.id, "authz.tuples.written")
              if e["actor_type"] == "api_key"]
    deleted = [c["user"] for e in writes for c in e["metadata"]["changes"]
               if c["operation"] == "delete"]
    assert sorted(deleted) == sorted(f"user:{u}" for u in (anne, anne, carol, bob, dave, bob))
    status = await events(db, project.id, "membership.status_changed")
    assert len(status) == 5
