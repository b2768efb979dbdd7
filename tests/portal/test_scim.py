"""The admin portal's SCIM step: the organization's SCIM token minted through the portal session
(by the SCIM service's own rule, replacing the previous token), shown once, and working at
``/scim/v2``; the sync status the portal shows once the directory has synced."""

from __future__ import annotations

import secrets
from typing import Any

import asyncpg

from tests.fixtures.database import events
from tests.fixtures.service import Api, Project, assert_error, ts
from tests.portal.helpers import opened, portal_call

USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"


def scim_user() -> dict[str, Any]:
    address = f"scim-{secrets.token_hex(6)}@example.com"
    return {"schemas": [USER], "userName": address,
            "emails": [{"value": address, "type": "work", "primary": True}]}


async def mint(api: Api, cookie: str) -> dict[str, Any]:
    r = await portal_call(api, "POST", "/v1/portal/scim/token", cookie, json={})
    assert r.status == 201, r.body
    return dict(r.body)


async def state(api: Api, cookie: str) -> dict[str, Any]:
    r = await portal_call(api, "GET", "/v1/portal/state", cookie)
    assert r.status == 200, r.body
    return dict(r.body)


async def test_the_portal_mints_a_scim_token_that_works_at_scim_v2(
        portal_service: Api, portal_project: Project, db: asyncpg.Pool) -> None:
    portal = await opened(portal_service, portal_project, "scim")
    before = await state(portal_service, portal.cookie)
    assert before["intent"] == "scim" and before["domains"] is None
    assert before["scim"] == {"base_url": f"{portal_service.base_url}/scim/v2",
                              "token_minted_at": None, "users": None, "groups": None,
                              "last_synced_at": None, "recent_changes": []}

    minted = await mint(portal_service, portal.cookie)
    assert set(minted) == {"token", "base_url", "request_id"}
    assert minted["token"].startswith("scim_")
    assert minted["base_url"] == f"{portal_service.base_url}/scim/v2"
    directory = portal_service.with_key(minted["token"])
    r = await directory.get("/scim/v2/Users")
    assert r.status == 200 and r.body["totalResults"] == 0, r.body
    r = await directory.post("/scim/v2/Users", scim_user())
    assert r.status == 201, r.body
    user_id = r.body["id"]
    r = await directory.post("/scim/v2/Groups", {"schemas": [GROUP], "displayName": "Engineering",
                                                 "members": [{"value": user_id}]})
    assert r.status == 201, r.body

    after = (await state(portal_service, portal.cookie))["scim"]
    assert after["token_minted_at"] is not None and "token" not in after
    assert minted["token"] not in str(after)
    assert (after["users"], after["groups"]) == (1, 1)
    assert [(c["action"], c["change"]) for c in after["recent_changes"]] == [
        ("scim.group.synced", "created"), ("scim.user.synced", "created")]
    assert after["recent_changes"][1]["resource_id"] == user_id
    assert ts(after["last_synced_at"]) >= ts(after["token_minted_at"])

    [event] = await events(db, portal_project.id, "scim.token.created")
    assert (event["actor_type"], event["actor_id"]) == ("portal", portal.link["id"])
    assert (event["target_type"], event["target_id"]) == ("organization", portal.org["id"])
    assert minted["token"] not in str(event)

    # A new token replaces the old one at once.
    again = await mint(portal_service, portal.cookie)
    assert again["token"] != minted["token"]
    r = await directory.get("/scim/v2/Users")
    assert r.status == 401, r.body
    r = await portal_service.with_key(again["token"]).get("/scim/v2/Users")
    assert r.status == 200 and r.body["totalResults"] == 1, r.body
    assert ts((await state(portal_service, portal.cookie))["scim"]["token_minted_at"]) \
        > ts(after["token_minted_at"])


async def test_only_a_scim_link_mints_and_only_while_its_session_lives(
        portal_service: Api, portal_project: Project, db: asyncpg.Pool) -> None:
    domains = await opened(portal_service, portal_project, "domain_verification")
    r = await portal_call(portal_service, "POST", "/v1/portal/scim/token", domains.cookie, json={})
    assert_error(r, 403, "forbidden")
    portal = await opened(portal_service, portal_project, "scim")
    r = await portal_call(portal_service, "POST", "/v1/portal/scim/token", portal.cookie,
                          json={"organization_id": domains.org["id"]})
    assert_error(r, 400, "invalid_request")  # the organization is the link's, never the body's
    await db.execute("UPDATE portal_links SET session_expires_at = now() - interval '1 second' "
                     "WHERE id = $1", portal.link["id"])
    r = await portal_call(portal_service, "POST", "/v1/portal/scim/token", portal.cookie, json={})
    assert_error(r, 410, "token_invalid_or_expired")
    assert await events(db, portal_project.id, "scim.token.created") == []
