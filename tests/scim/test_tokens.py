"""SCIM tokens and what answers without one (issue 23): minting, replacement (the previous token
is refused at once), refusals in RFC 7644's shape, and the discovery resources, which need no
token (RFC 7643 5)."""

from __future__ import annotations

import re

import asyncpg

from tests.fixtures.database import events
from tests.fixtures.identity import make_org
from tests.fixtures.service import Project, assert_error, scoped
from tests.scim.helpers import ENTERPRISE, GROUP, LIST, USER, assert_scim_error, directory, mint


async def test_a_token_is_shown_once_and_kept_encrypted(project: Project, db: asyncpg.Pool) -> None:
    org = await make_org(project)
    r = await mint(project, org["id"])
    assert r.status == 201, r.body
    token = r.body["token"]
    assert re.fullmatch(r"scim_[A-Za-z0-9_-]{43}", token), token
    assert r.body["base_url"].endswith("/scim/v2") and r.body["store_id"] is None
    row = await db.fetchrow("SELECT * FROM scim_tokens WHERE organization_id = $1", org["id"])
    assert row["id"].startswith("sct_")
    # Neither the hash column nor the sealed one holds the token in the clear.
    assert token.encode() not in bytes(row["token_sealed"])
    assert token.encode() not in bytes(row["token_hash"]) and len(row["token_hash"]) == 32
    [event] = await events(db, project.id, "scim.token.created")
    assert event["target_id"] == org["id"] and token not in str(event)


async def test_a_new_token_replaces_the_previous_one_at_once(project: Project) -> None:
    d = await directory(project)
    assert (await d.get("/Users")).status == 200
    r = await mint(project, d.org_id)
    assert r.status == 201
    assert_scim_error(await d.get("/Users"), 401)
    fresh = d.api.with_key(r.body["token"])
    assert (await fresh.get("/scim/v2/Users")).status == 200


async def test_refusals_without_the_token_are_scim_errors(project: Project) -> None:
    d = await directory(project)
    r = await d.api.get("/scim/v2/Users", key=None)
    assert_scim_error(r, 401)
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert_scim_error(await d.api.get("/scim/v2/Groups", key="scim_not-a-token"), 401)
    assert_scim_error(await d.api.get("/scim/v2/Users", key=project.key), 401)  # an API key
    # Another organization's token does not see this one's users.
    other = await directory(project)
    created = await d.post("/Users", {"schemas": [USER], "userName": "a@example.com",
                                      "emails": [{"value": "a@example.com"}]})
    assert created.status == 201, created.body
    assert_scim_error(await other.get(f"/Users/{created.body['id']}"), 404)


async def test_every_refusal_under_scim_v2_is_in_rfc_7644s_shape(project: Project) -> None:
    d = await directory(project)
    assert_scim_error(await d.get("/Nothing"), 404)
    assert_scim_error(await d.api.request("DELETE", "/scim/v2/Users"), 405)
    r = await d.api.request("POST", "/scim/v2/Users", data=b"{not json")
    assert_scim_error(r, 400, "invalidSyntax")
    assert_scim_error(await d.get('/Users?filter=userName%20eq'), 400, "invalidFilter")
    assert_scim_error(await d.get('/Users?filter=nickName%20zz%20%22x%22'), 400, "invalidFilter")
    assert_scim_error(await d.get("/Users/user_01hzzzzzzzzzzzzzzzzzzzzzzz"), 404)
    # The management API keeps its envelope.
    assert_error(await project.api.get("/v1/nothing"), 404, "not_found")


async def test_minting_needs_organizations_write_and_a_known_store(project: Project) -> None:
    org = await make_org(project)
    reader = await scoped(project, "users:read")
    r = await reader.post(f"/v1/organizations/{org['id']}/scim-token", {})
    assert_error(r, 403, "insufficient_scope")
    assert_error(await mint(project, org["id"], store_id="store_01hzzzzzzzzzzzzzzzzzzzzzzz"),
                 404, "store_not_found")
    assert_error(await mint(project, "org_01hzzzzzzzzzzzzzzzzzzzzzzz"), 404,
                 "organization_not_found")
    store = (await project.api.post("/v1/stores", {"name": "dir"})).body["id"]
    r = await mint(project, org["id"], store_id=store)
    assert r.status == 201 and r.body["store_id"] == store
    r = await mint(project, org["id"])  # left out: kept
    assert r.body["store_id"] == store
    r = await mint(project, org["id"], store_id=None)
    assert r.body["store_id"] is None


async def test_discovery_answers_without_a_token(project: Project) -> None:
    d = await directory(project)
    api = d.api.with_key(None)
    r = await api.get("/scim/v2/ServiceProviderConfig")
    assert r.status == 200, r.body
    assert r.headers["Content-Type"].startswith("application/scim+json")
    assert r.body["patch"]["supported"] is True and r.body["bulk"]["supported"] is False
    assert r.body["filter"] == {"supported": True, "maxResults": 1000}
    assert r.body["etag"]["supported"] is True and r.body["sort"]["supported"] is False
    r = await api.get("/scim/v2/Schemas")
    assert r.status == 200 and r.body["schemas"] == [LIST]
    ids = [s["id"] for s in r.body["Resources"]]
    assert ids == [USER, ENTERPRISE, GROUP]
    user = r.body["Resources"][0]
    emails = next(a for a in user["attributes"] if a["name"] == "emails")
    assert emails["required"] is True
    r = await api.get(f"/scim/v2/Schemas/{USER}")
    assert r.status == 200 and r.body["id"] == USER
    r = await api.get("/scim/v2/ResourceTypes")
    assert [t["name"] for t in r.body["Resources"]] == ["User", "Group"]
    r = await api.get("/scim/v2/ResourceTypes/Group")
    assert r.status == 200 and r.body["endpoint"] == "/Groups"
    assert_scim_error(await api.get("/scim/v2/ResourceTypes/Nope"), 404)
