"""The Python client's methods for the domains beyond users, stores and checks, against the
running service: organization invitations, admin portal links and SCIM tokens, webhook
endpoints and their deliveries (a real delivery to a loopback receiver, verified by the client's
``verify_webhook``), data-subject requests, the risk policy and decisions, a user's passkeys and
OAuth providers. Each answer is compared with the service's own state read over raw HTTP
(``project.api``); errors with the class of their code. The sync client runs in a worker thread
(``asyncio.to_thread``) while the service answers on the test's event loop."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from authio_client import AsyncAuthioClient, Invitation, Page, PortalLink, ScimToken
from authio_client.errors import (
    InvalidRequest,
    InvitationNotFound,
    InvitationNotPending,
    InvitationPending,
    OrganizationNotFound,
    StoreNotFound,
)

from tests.client.helpers import Sent, sync_client
from tests.fixtures.service import Project, assert_error, ts
from tests.portal.helpers import open_link


def mail() -> str:
    return f"client-{secrets.token_hex(5)}@example.com"


def slug() -> str:
    return f"org-{secrets.token_hex(4)}"


async def _org(project: Project) -> str:
    r = await project.api.post("/v1/organizations", {"name": "Acme", "slug": slug()})
    assert r.status == 201, r.body
    return str(r.body["id"])


def _same_invitation(got: Invitation, raw: dict[str, Any]) -> None:
    assert (got.id, got.organization_id, got.email, got.role, got.status) == (
        raw["id"], raw["organization_id"], raw["email"], raw["role"], raw["status"])
    assert got.expires_at == ts(raw["expires_at"]) and got.created_at == ts(raw["created_at"])
    assert got.revoked_at == (ts(raw["revoked_at"]) if raw["revoked_at"] else None)


# -- invitations ------------------------------------------------------------------------------


async def test_invitations_with_the_sync_client(project: Project) -> None:
    org_id = await _org(project)
    first, second = mail(), mail()

    def flow() -> tuple[Invitation, Invitation, list[Invitation], Page[Invitation]]:
        with sync_client(project.api.base_url, project.key, Sent()) as c:
            a = c.create_invitation(org_id, first, role="admin")
            b = c.create_invitation(org_id, second)
            with pytest.raises(InvitationPending) as twice:
                c.create_invitation(org_id, first)
            assert (twice.value.status, twice.value.code) == (409, "invitation_pending")
            assert c.get_invitation(org_id, a.id) == a
            revoked = c.revoke_invitation(org_id, b.id)
            with pytest.raises(InvitationNotPending):
                c.revoke_invitation(org_id, b.id)
            with pytest.raises(InvitationNotFound) as missing:
                c.get_invitation(org_id, "inv_" + "0" * 26)
            assert missing.value.status == 404
            with pytest.raises(OrganizationNotFound):
                c.list_invitations("org_" + "0" * 26)
            with pytest.raises(InvalidRequest) as bad:
                c.create_invitation(org_id, "not an address")
            assert bad.value.code == "invalid_email"
            walked = list(c.iter_invitations(org_id, limit=1))
            return a, revoked, walked, c.list_invitations(org_id, status="pending")

    a, revoked, walked, pending = await asyncio.to_thread(flow)
    assert (a.email, a.role, a.status, a.accepted_at, a.revoked_at) == (first, "admin", "pending", None, None)
    assert (revoked.status, revoked.role, revoked.email) == ("revoked", "member", second)
    assert revoked.revoked_at is not None
    listed = await project.api.get(f"/v1/organizations/{org_id}/invitations")
    assert listed.status == 200 and len(listed.body["data"]) == 2
    for got, raw in zip(walked, listed.body["data"], strict=True):  # both, one page at a time
        _same_invitation(got, raw)
    assert [i.id for i in pending.data] == [a.id] and not pending.has_more


async def test_invitations_with_the_async_client(authio: AsyncAuthioClient, project: Project) -> None:
    org_id = await _org(project)
    made = [await authio.create_invitation(org_id, mail()) for _ in range(3)]
    page = await authio.list_invitations(org_id, limit=2)
    assert [i.id for i in page.data] == [m.id for m in made[:2]] and page.has_more and page.next_cursor
    assert [i.id async for i in authio.iter_invitations(org_id, limit=2)] == [m.id for m in made]
    got = await authio.get_invitation(org_id, made[0].id)
    raw = await project.api.get(f"/v1/organizations/{org_id}/invitations/{made[0].id}")
    _same_invitation(got, raw.body)
    revoked = await authio.revoke_invitation(org_id, made[1].id)
    raw = await project.api.get(f"/v1/organizations/{org_id}/invitations/{made[1].id}")
    assert raw.body["status"] == "revoked"
    _same_invitation(revoked, raw.body)
    assert [i.id for i in (await authio.list_invitations(org_id, status="revoked")).data] == [made[1].id]
    with pytest.raises(InvitationNotFound):
        await authio.revoke_invitation(org_id, "inv_" + "0" * 26)


# -- admin portal links and SCIM tokens -------------------------------------------------------


async def test_a_portal_link_and_a_scim_token_with_the_sync_client(project: Project) -> None:
    org_id = await _org(project)
    store = await project.api.post("/v1/stores", {"name": "directory"})

    def flow() -> tuple[PortalLink, ScimToken, ScimToken, ScimToken]:
        with sync_client(project.api.base_url, project.key, Sent()) as c:
            link = c.create_portal_link(org_id, "scim", ttl_seconds=600)
            assert "ptk_" not in repr(link)  # the secret part is not in logs by accident
            with pytest.raises(OrganizationNotFound):
                c.create_portal_link("org_" + "0" * 26, "scim")
            with pytest.raises(InvalidRequest) as bad:
                c.create_portal_link(org_id, "scim", ttl_seconds=59)
            assert bad.value.details["fields"][0]["field"] == "ttl_seconds"
            first = c.create_organization_scim_token(org_id, store_id=store.body["id"])
            kept = c.create_organization_scim_token(org_id)  # left out: the store stays
            with pytest.raises(StoreNotFound):
                c.create_organization_scim_token(org_id, store_id="store_" + "0" * 26)
            return link, first, kept, c.create_organization_scim_token(org_id, store_id=None)

    link, first, kept, last = await asyncio.to_thread(flow)
    assert (link.organization_id, link.intent) == (org_id, "scim")
    assert link.link.startswith(f"{project.api.base_url}/portal?token=ptk_")
    assert 595 < (link.expires_at - link.created_at).total_seconds() <= 600
    # The link is the service's: it opens the portal once, and it was recorded as made.
    assert (await open_link(project.api, link.link)).status == 200
    assert_error(await open_link(project.api, link.link), 410, "token_consumed")
    made = await project.api.get("/v1/audit/events?type=portal.link.created")
    assert [e["metadata"]["portal_link_id"] for e in made.body["data"]] == [link.id]

    assert (first.store_id, kept.store_id, last.store_id) == (store.body["id"], store.body["id"], None)
    assert first.base_url == kept.base_url == f"{project.api.base_url}/scim/v2"
    # Each token replaced the one before at once: only the last opens the directory.
    for token, status in ((first.token, 401), (kept.token, 401), (last.token, 200)):
        r = await project.api.get("/scim/v2/Users", key=token)
        assert r.status == status, (token, r.body)


async def test_a_portal_link_and_a_scim_token_with_the_async_client(
        authio: AsyncAuthioClient, project: Project) -> None:
    org_id = await _org(project)
    link = await authio.create_portal_link(org_id, "domain_verification")
    assert (link.intent, round((link.expires_at - link.created_at).total_seconds())) == (
        "domain_verification", 300)
    assert (await open_link(project.api, link.link)).status == 200
    token = await authio.create_organization_scim_token(org_id)
    assert token.store_id is None and token.token.startswith("scim_")
    assert (await project.api.get("/scim/v2/Users", key=token.token)).status == 200
    with pytest.raises(OrganizationNotFound):
        await authio.create_organization_scim_token("org_" + "0" * 26)
