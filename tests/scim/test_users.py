"""SCIM Users (issue 23): a User is a member of the organization. Provisioning, reading,
filtering and paging the view, PUT and PATCH (RFC 7644 3.5.2, with and without paths),
deactivation (the membership suspended, every session revoked, at the edge too), deletion (the
membership goes, the user stays), versions, and the audit events."""

from __future__ import annotations

import asyncpg
from redis.asyncio import Redis

from tests.fixtures.database import events
from tests.fixtures.identity import add_member, create_user, email, session_call, sign_in
from tests.fixtures.service import Project, eventually
from tests.scim.helpers import (
    ENTERPRISE,
    LIST,
    USER,
    assert_scim_error,
    directory,
    user_body,
)


async def test_a_provisioned_user_is_a_member_and_its_scim_view(project: Project,
                                                                db: asyncpg.Pool) -> None:
    d = await directory(project)
    address = email()
    r = await d.post("/Users", user_body(address, userName="bjensen", externalId="ext-1",
                                         displayName="Babs Jensen"))
    assert r.status == 201, r.body
    user = r.body
    assert user["id"].startswith("user_") and user["userName"] == "bjensen"
    assert user["active"] is True and user["externalId"] == "ext-1"
    assert user["emails"] == [{"value": address, "type": "work", "primary": True}]
    assert user["meta"]["resourceType"] == "User"
    assert user["meta"]["location"] == f"{d.base_url}/Users/{user['id']}"
    assert r.headers["Location"] == user["meta"]["location"]
    assert r.headers["ETag"] == user["meta"]["version"] and user["meta"]["version"].startswith('W/"')
    # The project's user, with the address and the display name, and a member of the org.
    shown = (await project.api.get(f"/v1/users/{user['id']}")).body
    assert (shown["email"], shown["name"]) == (address, "Babs Jensen")
    [membership] = (await project.api.get(f"/v1/organizations/{d.org_id}/memberships")).body["data"]
    assert (membership["user_id"], membership["status"]) == (user["id"], "active")
    # Read back as it was written.
    r = await d.get(f"/Users/{user['id']}")
    assert r.status == 200 and r.body == user
    # The same address again is the same user, already in the view.
    assert_scim_error(await d.post("/Users", user_body(address)), 409, "uniqueness")
    # And another user cannot take the userName; the refusal leaves nothing behind: the user
    # it would have created, its membership and events were one transaction.
    refused = email()
    assert_scim_error(await d.post("/Users", user_body(refused, userName="BJensen")), 409,
                      "uniqueness")
    assert (await project.api.get(f"/v1/users?email={refused}")).body["data"] == []
    assert len((await project.api.get(f"/v1/organizations/{d.org_id}/memberships")).body["data"]) == 1
    [event] = await events(db, project.id, "scim.user.synced")
    assert event["actor_type"] == "scim" and event["actor_id"].startswith("sct_")
    assert event["target_id"] == user["id"] and event["metadata"]["change"] == "created"
    assert event["metadata"]["organization_id"] == d.org_id
    assert {"userName", "emails", "externalId"} <= set(event["metadata"]["fields"])
    assert event["metadata"]["user_created"] is True
    # The user.created and membership.created it implies are the token's too, in its transaction.
    for action in ("user.created", "membership.created"):
        [implied] = await events(db, project.id, action)
        assert implied["actor_type"] == "scim" and implied["actor_id"] == event["actor_id"]


async def test_an_existing_user_of_the_project_is_found_by_its_address(project: Project) -> None:
    existing = await create_user(project.api, email())
    d = await directory(project)
    r = await d.post("/Users", user_body(existing["email"].upper()))
    assert r.status == 201, r.body
    assert r.body["id"] == existing["id"]
    # A member that the directory never named is in the view too, and POST adopts it.
    other = await create_user(project.api, email())
    await add_member(project, d.org_id, other["id"])
    r = await d.get(f"/Users/{other['id']}")
    assert r.status == 200 and r.body["userName"] == other["email"]
    r = await d.post("/Users", user_body(other["email"], userName="adopted"))
    assert r.status == 201 and r.body["id"] == other["id"] and r.body["userName"] == "adopted"


async def test_emails_are_required_and_the_primary_one_is_the_users(project: Project) -> None:
    d = await directory(project)
    body = user_body()
    del body["emails"]
    assert_scim_error(await d.post("/Users", body), 400, "invalidValue")
    home, work = email(), email()
    r = await d.post("/Users", user_body(work, emails=[{"value": home, "type": "home"},
                                                       {"value": work, "primary": True}]))
    assert r.status == 201, r.body
    assert (await project.api.get(f"/v1/users/{r.body['id']}")).body["email"] == work
    r = await d.post("/Users", user_body(emails=[{"value": home}]))
    assert r.status == 201, r.body  # no primary: the first
    assert (await project.api.get(f"/v1/users/{r.body['id']}")).body["email"] == home
    assert_scim_error(await d.post("/Users", user_body(emails=[{"value": "not-an-address"}])),
                      400, "invalidValue")
    assert_scim_error(await d.post("/Users", {"schemas": [USER], "emails": [{"value": email()}]}),
                      400)


async def test_filters_and_pages(project: Project) -> None:
    d = await directory(project)
    made = []
    for i in range(7):
        address = f"filter-{i}-{email()}"
        r = await d.post("/Users", user_body(address, userName=f"person{i}", externalId=f"x{i}",
                                             active=i != 3, title="Engineer" if i % 2 else None))
        assert r.status == 201, r.body
        made.append(r.body)

    async def ids(query: str) -> list[str]:
        r = await d.get("/Users?" + query)
        assert r.status == 200, r.body
        assert r.body["schemas"] == [LIST]
        return [u["id"] for u in r.body["Resources"]]

    assert await ids('filter=userName eq "PERSON2"') == [made[2]["id"]]  # case-insensitive
    assert await ids('filter=externalId eq "x4"') == [made[4]["id"]]
    assert await ids('filter=externalId eq "X4"') == []  # externalId is caseExact
    assert await ids(f'filter=id eq "{made[5]["id"]}"') == [made[5]["id"]]
    address = made[1]["emails"][0]["value"]
    assert await ids(f'filter=emails.value eq "{address}"') == [made[1]["id"]]
    assert await ids(f'filter=emails[type eq "work" and value eq "{address.upper()}"]') == [made[1]["id"]]
    assert await ids('filter=userName sw "person" and active eq false') == [made[3]["id"]]
    assert await ids('filter=userName eq "person0" or userName eq "person6"') == [
        made[0]["id"], made[6]["id"]]
    assert await ids('filter=title pr and not (userName eq "person1")') == [
        made[3]["id"], made[5]["id"]]
    assert await ids('filter=name.familyName co "ENS"&count=2') == [m["id"] for m in made[:2]]
    assert await ids('filter=meta.created gt "2000-01-01T00:00:00Z"&startIndex=6') == [
        m["id"] for m in made[5:]]
    # startIndex and count, 1-based (RFC 7644 3.4.2.4): out-of-range values are clamped.
    r = await d.get("/Users?startIndex=3&count=2")
    assert (r.body["totalResults"], r.body["startIndex"], r.body["itemsPerPage"]) == (7, 3, 2)
    assert [u["id"] for u in r.body["Resources"]] == [made[2]["id"], made[3]["id"]]
    r = await d.get("/Users?startIndex=0&count=-4")
    assert (r.body["totalResults"], r.body["startIndex"], r.body["Resources"]) == (7, 1, [])
    r = await d.get("/Users?startIndex=100")
    assert r.body["totalResults"] == 7 and r.body["Resources"] == []
    # attributes and excludedAttributes.
    r = await d.get('/Users?attributes=userName&filter=userName eq "person0"')
    assert set(r.body["Resources"][0]) == {"schemas", "id", "userName"}
    r = await d.get(f'/Users/{made[0]["id"]}?excludedAttributes=emails,name')
    assert "emails" not in r.body and "name" not in r.body and r.body["userName"] == "person0"


async def test_put_and_patch(project: Project, db: asyncpg.Pool) -> None:
    d = await directory(project)
    address = email()
    user = (await d.post("/Users", user_body(address, userName="pat"))).body
    path = f"/Users/{user['id']}"
    # Add, replace and remove with paths.
    r = await d.patch(path, {"op": "add", "path": "nickName", "value": "Patty"},
                      {"op": "replace", "path": "name.givenName", "value": "Patricia"},
                      {"op": "remove", "path": "externalId"})
    assert r.status == 200, r.body
    assert r.body["nickName"] == "Patty" and r.body["name"]["givenName"] == "Patricia"
    # Without a path: the value's attributes.
    r = await d.patch(path, {"op": "replace", "value": {"displayName": "Pat Jones",
                                                       "title": "Manager"}})
    assert r.status == 200 and r.body["displayName"] == "Pat Jones" and r.body["title"] == "Manager"
    assert (await project.api.get(f"/v1/users/{user['id']}")).body["name"] == "Pat Jones"
    # A changed primary address changes the user's.
    new = email()
    r = await d.patch(path, {"op": "replace", "path": 'emails[type eq "work"].value', "value": new})
    assert r.status == 200, r.body
    assert (await project.api.get(f"/v1/users/{user['id']}")).body["email"] == new
    # An attribute no schema declares is ignored (as an unknown attribute of a body is); a path
    # that is not a path, the last address removed and an unknown op are refused.
    r = await d.patch(path, {"op": "replace", "path": "nonsense", "value": 1})
    assert r.status == 200 and "nonsense" not in r.body
    assert_scim_error(await d.patch(path, {"op": "replace", "path": "emails[type eq", "value": 1}),
                      400, "invalidPath")
    assert_scim_error(await d.patch(path, {"op": "remove", "path": "emails"}), 400)
    assert_scim_error(await d.patch(path, {"op": "jump", "path": "nickName"}), 400)
    # PUT replaces what the directory said.
    r = await d.put(path, {"schemas": [USER, ENTERPRISE], "userName": "pat2",
                           "emails": [{"value": new, "primary": True}],
                           ENTERPRISE: {"department": "Sales"}})
    assert r.status == 200, r.body
    assert r.body["userName"] == "pat2" and "nickName" not in r.body
    # A PUT without ``active`` unassigns it (RFC 7644 3.5.1): the membership stays as it was.
    assert "active" not in r.body
    assert r.body[ENTERPRISE] == {"department": "Sales"} and ENTERPRISE in r.body["schemas"]
    r = await d.get(f'/Users?filter={ENTERPRISE}:department eq "sales"')
    assert [u["id"] for u in r.body["Resources"]] == [user["id"]]
    changes = [e["metadata"] for e in await events(db, project.id, "scim.user.synced")]
    assert [c["change"] for c in changes] == ["created"] + ["updated"] * 4
    assert changes[-1]["fields"] == sorted(["userName", "nickName", "name", "displayName", "emails", "active",
                                           "title", ENTERPRISE, "schemas"])
    # Versions: If-Match must name the current one.
    etag = (await d.get(path)).headers["ETag"]
    r = await d.patch(path, {"op": "replace", "path": "title", "value": "x"},
                      headers={"If-Match": 'W/"stale"'})
    assert_scim_error(r, 412)
    r = await d.patch(path, {"op": "replace", "path": "title", "value": "x"},
                      headers={"If-Match": etag})
    assert r.status == 200 and r.headers["ETag"] != etag
    assert_scim_error(await d.put("/Users/user_01hzzzzzzzzzzzzzzzzzzzzzzz", user_body()), 404)


async def test_deactivation_suspends_and_revokes_and_delete_leaves_the_view(
        project: Project, db: asyncpg.Pool, redis: Redis, redis_prefix: str) -> None:
    d = await directory(project)
    address = email()
    user = (await d.post("/Users", user_body(address))).body
    signed = await sign_in(project, address, count=2)  # the enrollment link, then this one
    assert signed.user_id == user["id"]
    assert (await session_call(project.api, "GET", "/v1/sessions/me", signed.access_token)).status == 200
    r = await d.patch(f"/Users/{user['id']}", {"op": "Replace", "path": "active", "value": "False"})
    assert r.status == 200 and r.body["active"] is False, r.body
    [membership] = (await project.api.get(f"/v1/organizations/{d.org_id}/memberships")).body["data"]
    assert membership["status"] == "suspended"
    assert (await session_call(project.api, "GET", "/v1/sessions/me", signed.access_token)).status == 401

    async def refused_at_the_edge() -> bool | None:
        r = await session_call(project.api, "GET", "/v1/edge/validate", signed.access_token)
        return True if r.status == 401 and r.body["error"]["details"]["reason"] == "revoked" else None

    await eventually(refused_at_the_edge, what="the edge refusing the revoked session")
    r = await d.get('/Users?filter=active eq false')
    assert [u["id"] for u in r.body["Resources"]] == [user["id"]]
    # Okta's form: a replace without a path.
    r = await d.patch(f"/Users/{user['id']}", {"op": "replace", "value": {"active": True}})
    assert r.status == 200 and r.body["active"] is True
    [membership] = (await project.api.get(f"/v1/organizations/{d.org_id}/memberships")).body["data"]
    assert membership["status"] == "active"
    changes = [e["metadata"] for e in await events(db, project.id, "scim.user.synced")]
    assert [c["change"] for c in changes] == ["created", "deactivated", "reactivated"]
    assert changes[1]["sessions_revoked"] == 1 and changes[1]["fields"] == ["active"]
    # DELETE: the membership goes, the user stays, and is 404 in this view.
    again = await sign_in(project, address, count=3)
    r = await d.delete(f"/Users/{user['id']}")
    assert r.status == 204 and r.headers.get("X-Request-Id")
    assert_scim_error(await d.get(f"/Users/{user['id']}"), 404)
    assert_scim_error(await d.delete(f"/Users/{user['id']}"), 404)
    assert (await project.api.get(f"/v1/users/{user['id']}")).status == 200
    assert (await project.api.get(f"/v1/organizations/{d.org_id}/memberships")).body["data"] == []
    assert (await session_call(project.api, "GET", "/v1/sessions/me", again.access_token)).status == 401
    assert await db.fetchval("SELECT count(*) FROM scim_users WHERE user_id = $1", user["id"]) == 0
    deleted = (await events(db, project.id, "scim.user.synced"))[-1]["metadata"]
    assert deleted["change"] == "deleted" and deleted["sessions_revoked"] == 1


async def test_a_search_by_post(project: Project) -> None:
    """RFC 7644 3.4.3: the listing's query as a body, per resource type; across resource types
    it is not offered (501)."""
    d = await directory(project)
    first = (await d.post("/Users", user_body(userName="searched"))).body
    await d.post("/Users", user_body())
    r = await d.post("/Users/.search", {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:SearchRequest"],
        "filter": 'userName eq "searched"', "attributes": ["userName"], "count": 10})
    assert r.status == 200, r.body
    assert r.body["totalResults"] == 1
    assert r.body["Resources"] == [{"schemas": [USER], "id": first["id"], "userName": "searched"}]
    r = await d.post("/Users/.search", {"startIndex": 2, "count": 1})
    assert (r.body["totalResults"], r.body["startIndex"], r.body["itemsPerPage"]) == (2, 2, 1)
    assert_scim_error(await d.post("/Users/.search", {"filter": "userName zz 1"}), 400,
                      "invalidFilter")
    assert_scim_error(await d.post("/.search", {"filter": 'userName eq "x"'}), 501)
