"""Invitations through HTTP: create with its queued link, list, show, revoke, and acceptance by the
invited person's magic link (SPEC.md 6, 7; issue 4).

Expiry is tested by moving an invitation's ``expires_at`` into the past in the database (the
shortest configurable lifetime is five minutes); everything else goes through the API.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from tests.fixtures.database import events, messages
from tests.fixtures.identity import create_user, email, latest_link, link_in, token_of, verify
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import ULID, Api, Project, Response, assert_error, scoped, ts
from tests.organizations.helpers import add_ok, create_org, patch_membership

INVITATION_FIELDS = {"id", "organization_id", "email", "role", "status", "expires_at",
                     "created_at", "accepted_at", "revoked_at"}


def base(org_id: str) -> str:
    return f"/v1/organizations/{org_id}/invitations"


async def invite(api: Api, org_id: str, address: str, **fields: Any) -> Response:
    return await api.post(base(org_id), {"email": address, **fields})


async def invite_ok(api: Api, org_id: str, address: str | None = None,
                    **fields: Any) -> dict[str, Any]:
    r = await invite(api, org_id, address or email(), **fields)
    assert r.status == 201, r.body
    return dict(r.body)


async def revoke(api: Api, org_id: str, invitation_id: str) -> Response:
    return await api.post(f"{base(org_id)}/{invitation_id}/revoke")


async def expire(db: asyncpg.Pool, invitation_id: str) -> None:
    """Move the invitation's expiry into the past (time passing, not an API call)."""
    await db.execute("UPDATE invitations SET expires_at = now() - interval '1 second' WHERE id = $1",
                     invitation_id)


# --- create -----------------------------------------------------------------------------------


async def test_create_queues_the_link_and_records_the_event(
    project: Project, db: asyncpg.Pool
) -> None:
    org = await create_org(project.api, name="Initech")
    address = email()
    r = await invite(project.api, org["id"], address.upper(), role="admin")
    assert r.status == 201, r.body
    inv = r.body
    assert set(inv) == INVITATION_FIELDS | {"request_id"}
    assert re.fullmatch(rf"inv_{ULID}", inv["id"])
    assert inv["organization_id"] == org["id"] and inv["role"] == "admin"
    assert inv["email"].lower() == address and inv["status"] == "pending"
    assert inv["accepted_at"] is None and inv["revoked_at"] is None
    lifetime = ts(inv["expires_at"]) - ts(inv["created_at"])
    assert abs(lifetime - timedelta(days=7)) < timedelta(seconds=5)
    assert await messages(db, project.id, address, "invitation") == 1
    token = await db.fetchrow("SELECT * FROM magic_link_tokens WHERE invitation_id = $1", inv["id"])
    assert token["purpose"] == "invitation" and token["user_id"] is None
    assert token["project_id"] == project.id
    created = await events(db, project.id, "invitation.created")
    assert len(created) == 1
    e = created[0]
    assert (e["target_type"], e["target_id"], e["user_id"]) == ("invitation", inv["id"], None)
    assert e["metadata"]["organization_id"] == org["id"] and e["metadata"]["role"] == "admin"
    mail = await mailbox_messages(project.api, inv["email"])
    assert "Initech" in mail[0]["subject"] + mail[0]["text"]
    assert mail[0]["kind"] == "invitation"


async def test_invitation_of_an_existing_user_names_them(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    inv = await invite_ok(project.api, org["id"], user["email"])
    assert inv["role"] == "member"
    token = await db.fetchrow("SELECT * FROM magic_link_tokens WHERE invitation_id = $1", inv["id"])
    assert token["user_id"] == user["id"]
    assert (await events(db, project.id, "invitation.created"))[0]["user_id"] == user["id"]


@pytest.mark.parametrize("address", ["nope", "a@", "@example.com", "two@@example.com"])
async def test_invalid_email_is_invalid_email(project: Project, db: asyncpg.Pool, address: str) -> None:
    org = await create_org(project.api)
    assert_error(await invite(project.api, org["id"], address), 422, "invalid_email")
    assert await db.fetchval("SELECT count(*) FROM invitations WHERE project_id = $1", project.id) == 0
    assert await events(db, project.id, "invitation.created") == []


@pytest.mark.parametrize("body", [{}, {"email": 5}, {"email": "a@example.com", "role": "Admin"},
                                  {"email": "a@example.com", "expires_at": "2030-01-01T00:00:00Z"}])
async def test_invalid_body_is_invalid_request(project: Project, body: dict[str, Any]) -> None:
    org = await create_org(project.api)
    assert_error(await project.api.post(base(org["id"]), body), 400, "invalid_request")


async def test_unknown_or_foreign_organization(
    project: Project, new_project: Callable[..., Any], db: asyncpg.Pool
) -> None:
    other = await new_project("inv-other")
    theirs = await create_org(other.api)
    for org_id in (theirs["id"], "org_" + "0" * 26, "acme"):
        assert_error(await invite(project.api, org_id, email()), 404, "organization_not_found")
        assert_error(await project.api.get(base(org_id)), 404, "organization_not_found")
    assert await db.fetchval("SELECT count(*) FROM invitations WHERE organization_id = $1",
                             theirs["id"]) == 0


async def test_any_member_active_or_suspended_is_already_a_member(
    project: Project, db: asyncpg.Pool
) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    m = await add_ok(project.api, org["id"], user["id"])
    r = await invite(project.api, org["id"], user["email"].upper())
    assert_error(r, 409, "already_a_member")
    assert r.body["error"]["details"]["membership_id"] == m["id"]
    assert r.body["error"]["details"]["membership_status"] == "active"
    # Suspended: still a member; an invitation would be "accepted" and change nothing.
    assert (await patch_membership(project.api, org["id"], m["id"], {"status": "suspended"})).status == 200
    r = await invite(project.api, org["id"], user["email"])
    assert_error(r, 409, "already_a_member")
    details = r.body["error"]["details"]
    assert (details["membership_id"], details["membership_status"]) == (m["id"], "suspended")
    assert details["user_id"] == user["id"]
    message = r.body["error"]["message"]
    assert f"/v1/organizations/{org['id']}/memberships/{m['id']}" in message
    assert '{"status": "active"}' in message
    assert await messages(db, project.id, user["email"], "invitation") == 0
    assert await db.fetchval("SELECT count(*) FROM invitations WHERE organization_id = $1",
                             org["id"]) == 0
    assert await events(db, project.id, "invitation.created") == []
    # Reactivated as the message says: the membership is active again.
    assert (await patch_membership(project.api, org["id"], m["id"], {"status": "active"})).status == 200
    # Removed: the person may be invited again.
    assert (await project.api.delete(f"/v1/organizations/{org['id']}/memberships/{m['id']}")).status == 200
    await invite_ok(project.api, org["id"], user["email"])


async def test_pending_invitation_blocks_a_second_one(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    address = email()
    first = await invite_ok(project.api, org["id"], address)
    r = await invite(project.api, org["id"], address.upper())
    assert_error(r, 409, "invitation_pending")
    assert r.body["error"]["details"]["invitation_id"] == first["id"]
    results = await asyncio.gather(*(invite(project.api, org["id"], address) for _ in range(4)))
    assert {x.status for x in results} == {409}
    assert await messages(db, project.id, address, "invitation") == 1
    assert len(await events(db, project.id, "invitation.created")) == 1
    # Another organization may invite the same address.
    await invite_ok(project.api, (await create_org(project.api))["id"], address)


async def test_concurrent_invitations_make_one(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    address = email()
    results = await asyncio.gather(*(invite(project.api, org["id"], address) for _ in range(5)))
    assert sorted(x.status for x in results) == [201] + [409] * 4, [x.body for x in results]
    assert await messages(db, project.id, address, "invitation") == 1
    assert len(await events(db, project.id, "invitation.created")) == 1


async def test_expired_invitation_is_replaced(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    address = email()
    old = await invite_ok(project.api, org["id"], address)
    await expire(db, old["id"])
    shown = await project.api.get(f"{base(org['id'])}/{old['id']}")
    assert shown.body["status"] == "expired"
    assert_error(await revoke(project.api, org["id"], old["id"]), 409, "invitation_not_pending")
    new = await invite_ok(project.api, org["id"], address)
    assert new["id"] != old["id"] and new["status"] == "pending"
    replaced = await project.api.get(f"{base(org['id'])}/{old['id']}")
    assert replaced.body["status"] == "revoked" and replaced.body["revoked_at"] is not None
    revoked = await events(db, project.id, "invitation.revoked")
    assert len(revoked) == 1 and revoked[0]["target_id"] == old["id"]
    assert revoked[0]["metadata"]["reason"] == "expired"
    assert revoked[0]["metadata"]["replaced_by"] == new["id"]
    assert await messages(db, project.id, address, "invitation") == 2


# --- list, show -------------------------------------------------------------------------------


async def test_list_with_paging_and_status_filter(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    invs = [await invite_ok(project.api, org["id"]) for _ in range(4)]
    await invite_ok(project.api, (await create_org(project.api))["id"])
    assert (await revoke(project.api, org["id"], invs[1]["id"])).status == 200
    await expire(db, invs[2]["id"])
    page1 = await project.api.get(base(org["id"]) + "?limit=3")
    assert page1.status == 200, page1.body
    assert page1.body["has_more"] is True
    page2 = await project.api.get(base(org["id"]) + f"?limit=3&cursor={page1.body['next_cursor']}")
    listed = page1.body["data"] + page2.body["data"]
    assert [i["id"] for i in listed] == [i["id"] for i in invs]
    assert [i["status"] for i in listed] == ["pending", "revoked", "expired", "pending"]
    assert all(set(i) == INVITATION_FIELDS for i in listed)
    for status, expected in (("pending", [0, 3]), ("revoked", [1]), ("expired", [2]),
                             ("accepted", [])):
        r = await project.api.get(base(org["id"]) + f"?status={status}")
        assert [i["id"] for i in r.body["data"]] == [invs[n]["id"] for n in expected], status
    assert_error(await project.api.get(base(org["id"]) + "?status=open"), 400, "invalid_request")


async def test_show_and_invitation_not_found(project: Project, new_project: Callable[..., Any]) -> None:
    org, org_b = await create_org(project.api), await create_org(project.api)
    inv = await invite_ok(project.api, org["id"])
    r = await project.api.get(f"{base(org['id'])}/{inv['id']}")
    assert r.status == 200, r.body
    assert {k: r.body[k] for k in INVITATION_FIELDS} == {k: inv[k] for k in INVITATION_FIELDS}
    other = await new_project("inv-show-other")
    their_org = await create_org(other.api)
    theirs = await invite_ok(other.api, their_org["id"])
    for org_id, inv_id in ((org_b["id"], inv["id"]), (org["id"], "inv_" + "0" * 26),
                           (org["id"], "x"), (their_org["id"], theirs["id"]),
                           (org["id"], theirs["id"])):
        assert_error(await project.api.get(f"{base(org_id)}/{inv_id}"), 404, "invitation_not_found")
        assert_error(await revoke(project.api, org_id, inv_id), 404, "invitation_not_found")
    assert (await other.api.get(f"{base(their_org['id'])}/{theirs['id']}")).body["status"] == "pending"


# --- revoke -----------------------------------------------------------------------------------


async def test_revoke(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    inv = await invite_ok(project.api, org["id"])
    r = await revoke(project.api, org["id"], inv["id"])
    assert r.status == 200, r.body
    assert r.body["status"] == "revoked" and r.body["revoked_at"] is not None
    revoked = await events(db, project.id, "invitation.revoked")
    assert len(revoked) == 1 and revoked[0]["target_id"] == inv["id"]
    r = await revoke(project.api, org["id"], inv["id"])
    assert_error(r, 409, "invitation_not_pending")
    assert r.body["error"]["details"]["status"] == "revoked"
    assert len(await events(db, project.id, "invitation.revoked")) == 1
    # A new invitation for the address is possible again.
    await invite_ok(project.api, org["id"], inv["email"])


# --- accept (the invited person's magic link) -------------------------------------------------


async def test_link_accepts_for_a_new_user(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api, name="Globex")
    address = email()
    inv = await invite_ok(project.api, org["id"], address, role="admin")
    token = token_of(await latest_link(project, address))
    r = await verify(project.api, project, token)
    assert r.status == 200, r.body
    user_id = r.body["user"]["id"]
    assert r.body["session"]["organization_id"] == org["id"]
    members = await project.api.get(f"/v1/organizations/{org['id']}/memberships")
    assert [(m["user_id"], m["role"], m["status"]) for m in members.body["data"]] == [
        (user_id, "admin", "active")]
    shown = await project.api.get(f"{base(org['id'])}/{inv['id']}")
    assert shown.body["status"] == "accepted" and shown.body["accepted_at"] is not None
    accepted = await events(db, project.id, "invitation.accepted")
    assert len(accepted) == 1
    assert accepted[0]["target_id"] == inv["id"] and accepted[0]["user_id"] == user_id
    assert accepted[0]["metadata"]["membership_created"] is True
    created = await events(db, project.id, "membership.created")
    assert [e["user_id"] for e in created] == [user_id]
    assert accepted[0]["metadata"]["membership_id"] == created[0]["target_id"]
    assert await db.fetchval("SELECT accepted_user_id FROM invitations WHERE id = $1",
                             inv["id"]) == user_id
    # Accepted: cannot be revoked, and the link is spent.
    assert_error(await revoke(project.api, org["id"], inv["id"]), 409, "invitation_not_pending")
    assert_error(await verify(project.api, project, token), 410, "token_consumed")


async def test_link_keeps_a_membership_made_after_the_invitation(
    project: Project, db: asyncpg.Pool
) -> None:
    org = await create_org(project.api)
    user = await create_user(project.api)
    inv = await invite_ok(project.api, org["id"], user["email"], role="member")
    # Between the invitation and its acceptance the user is added, then suspended.
    m = await add_ok(project.api, org["id"], user["id"], role="owner")
    assert (await patch_membership(project.api, org["id"], m["id"], {"status": "suspended"})).status == 200
    mails = await mailbox_messages(project.api, user["email"], count=2)
    invitation_mail = next(x for x in mails if x["kind"] == "invitation")
    r = await verify(project.api, project, token_of(link_in(invitation_mail["text"])))
    assert r.status == 200, r.body
    assert r.body["user"]["id"] == user["id"]
    kept = await project.api.get(f"/v1/organizations/{org['id']}/memberships/{m['id']}")
    assert (kept.body["role"], kept.body["status"]) == ("owner", "suspended")
    assert (await project.api.get(f"{base(org['id'])}/{inv['id']}")).body["status"] == "accepted"
    accepted = await events(db, project.id, "invitation.accepted")
    assert accepted[0]["metadata"]["membership_created"] is False
    assert accepted[0]["metadata"]["membership_id"] == m["id"]
    assert len(await events(db, project.id, "membership.created")) == 1


@pytest.mark.parametrize("how", ["revoked", "expired"])
async def test_link_of_a_revoked_or_expired_invitation_is_refused(
    project: Project, db: asyncpg.Pool, how: str
) -> None:
    org = await create_org(project.api)
    address = email()
    inv = await invite_ok(project.api, org["id"], address)
    token = token_of(await latest_link(project, address))
    if how == "revoked":
        assert (await revoke(project.api, org["id"], inv["id"])).status == 200
    else:
        await expire(db, inv["id"])
    r = await verify(project.api, project, token)
    assert_error(r, 409, "invitation_not_pending")
    assert r.body["error"]["details"]["status"] == how
    assert await db.fetchval("SELECT count(*) FROM memberships WHERE organization_id = $1",
                             org["id"]) == 0
    assert await events(db, project.id, "invitation.accepted") == []
    assert await db.fetchval("SELECT count(*) FROM users WHERE project_id = $1", project.id) == 0


# --- scopes -----------------------------------------------------------------------------------


async def test_scopes_are_enforced(project: Project, db: asyncpg.Pool) -> None:
    org = await create_org(project.api)
    inv = await invite_ok(project.api, org["id"])
    reader = await scoped(project, "users:read")
    assert (await reader.get(base(org["id"]))).status == 200
    assert (await reader.get(f"{base(org['id'])}/{inv['id']}")).status == 200
    assert_error(await invite(reader, org["id"], email()), 403, "insufficient_scope")
    assert_error(await revoke(reader, org["id"], inv["id"]), 403, "insufficient_scope")
    unrelated = await scoped(project, "users:write")
    assert_error(await unrelated.get(base(org["id"])), 403, "insufficient_scope")
    assert_error(await invite(unrelated, org["id"], email()), 403, "insufficient_scope")
    writer = await scoped(project, "organizations:write")
    await invite_ok(writer, org["id"])
    assert len(await events(db, project.id, "invitation.created")) == 2
    assert await events(db, project.id, "invitation.revoked") == []
