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
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from authio_client import (
    AsyncAuthioClient,
    DataSubjectRequest,
    Fulfilment,
    Invitation,
    OAuthProvider,
    Page,
    Passkey,
    PortalLink,
    RiskDecision,
    RiskPolicy,
    ScimToken,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookVerificationError,
    verify_webhook,
)
from authio_client.errors import (
    InvalidRequest,
    InvitationNotFound,
    InvitationNotPending,
    InvitationPending,
    NotFound,
    OrganizationNotFound,
    StoreNotFound,
    UnknownProvider,
    UserNotFound,
)

from tests.client.helpers import Sent, signed_in, sync_client
from tests.fixtures.service import Project, assert_error, eventually, ts
from tests.fixtures.webauthn import SoftAuthenticator
from tests.passkeys.helpers import ORIGIN, configure, login_verify, options, register
from tests.portal.helpers import open_link
from tests.webhooks.helpers import Received, receiver


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


# -- webhooks -----------------------------------------------------------------------------------


async def _user(project: Project) -> str:
    r = await project.api.post("/v1/users", {"email": mail()})
    assert r.status == 201, r.body
    return str(r.body["id"])


def _same_endpoint(got: WebhookEndpoint, raw: dict[str, Any]) -> None:
    assert (got.id, got.url, got.events, got.description, got.status, got.disabled_reason) == (
        raw["id"], raw["url"], raw["events"], raw["description"], raw["status"], raw["disabled_reason"])
    assert got.created_at == ts(raw["created_at"])


def _same_delivery(got: WebhookDelivery, raw: dict[str, Any]) -> None:
    assert (got.id, got.event_id, got.event_type, got.status) == (
        raw["id"], raw["event_id"], raw["event_type"], raw["status"])
    assert [(a.at, a.status_code, a.duration_ms, a.error) for a in got.attempts] == [
        (ts(a["at"]), a["status_code"], a["duration_ms"], a["error"]) for a in raw["attempts"]]
    assert got.next_attempt_at == (ts(raw["next_attempt_at"]) if raw["next_attempt_at"] else None)
    assert got.created_at == ts(raw["created_at"])


async def _deliveries_until(project: Project, endpoint_id: str, status: str, count: int) -> None:
    async def ready() -> bool:
        r = await project.api.get(f"/v1/webhook-endpoints/{endpoint_id}/deliveries?status={status}")
        return len(r.body["data"]) >= count
    await eventually(ready, what=f"{count} {status} deliveries")


def test_verify_webhook_refuses_what_was_not_signed_with_the_secret() -> None:
    """The Standard Webhooks test vector (standard-webhooks/libraries), then each refusal."""
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    headers = {"Webhook-Id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "Webhook-Timestamp": "1614265330",
               "Webhook-Signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}
    assert verify_webhook(body, headers, secret, now=1614265330) == {"test": 2432232314}
    assert verify_webhook(body.decode(), headers, secret, now=1614265330 + 299) == {"test": 2432232314}
    rotated = {**headers, "Webhook-Signature": "v1,bm90IGl0 " + headers["Webhook-Signature"]}
    assert verify_webhook(body, rotated, secret, now=1614265330) == {"test": 2432232314}
    refusals: list[tuple[bytes, dict[str, str], str, float]] = [
        (body + b" ", headers, secret, 1614265330),                           # the body changed
        (body, headers, "whsec_" + "A" * 32, 1614265330),                      # another secret
        (body, headers, secret, 1614265330 + 301),                             # too old
        (body, headers, secret, 1614265330 - 301),                             # from the future
        (body, {**headers, "Webhook-Id": "msg_other"}, secret, 1614265330),    # another id
        (body, {k: v for k, v in headers.items() if k != "Webhook-Id"}, secret, 1614265330),
        (body, {**headers, "Webhook-Signature": "v2," + headers["Webhook-Signature"][3:]}, secret,
         1614265330),
        (body, {**headers, "Webhook-Timestamp": "soon"}, secret, 1614265330),
        (body, headers, "whsec_not base64!", 1614265330),
    ]
    for payload, hdrs, key, now in refusals:
        with pytest.raises(WebhookVerificationError):
            verify_webhook(payload, hdrs, key, now=now)


async def test_webhook_endpoints_and_a_real_delivery_with_the_sync_client(project: Project) -> None:
    c = sync_client(project.api.base_url, project.key, Sent())

    def call(method: Any, *args: Any, **kwargs: Any) -> Any:
        return asyncio.to_thread(method, *args, **kwargs)

    try:
        async with receiver() as hooks:
            endpoint: WebhookEndpoint = await call(c.create_webhook_endpoint, hooks.url, ["user.created"],
                                                   description="users")
            assert endpoint.secret and endpoint.secret.startswith("whsec_")
            assert endpoint.secret not in repr(endpoint)
            hooks.secrets.append(endpoint.secret)  # the reference library checks it as well
            raw = await project.api.get(f"/v1/webhook-endpoints/{endpoint.id}")
            _same_endpoint(endpoint, raw.body)
            _same_endpoint(await call(c.get_webhook_endpoint, endpoint.id), raw.body)

            user_id = await _user(project)
            [got] = await hooks.wait_for(1)
            event = verify_webhook(got.body, got.headers, endpoint.secret)
            assert got.verified == {endpoint.secret: True}
            assert (event["type"], event["data"]["target_id"], event["id"]) == (
                "user.created", user_id, got.headers["webhook-id"])
            with pytest.raises(WebhookVerificationError):
                verify_webhook(got.body.replace(user_id.encode(), b"user_forged"), got.headers,
                               endpoint.secret)
            with pytest.raises(WebhookVerificationError):  # the same message, replayed 6 min later
                verify_webhook(got.body, got.headers, endpoint.secret, now=time.time() + 360)

            await _deliveries_until(project, endpoint.id, "succeeded", 1)
            page: Page[WebhookDelivery] = await call(c.list_webhook_deliveries, endpoint.id)
            raw = await project.api.get(f"/v1/webhook-endpoints/{endpoint.id}/deliveries")
            [delivery] = page.data
            _same_delivery(delivery, raw.body["data"][0])
            assert (delivery.event_id, delivery.status, delivery.attempts[0].status_code) == (
                event["id"], "succeeded", 200)

            replayed: WebhookDelivery = await call(c.replay_webhook_delivery, delivery.id)
            assert replayed.id == delivery.id
            again = (await hooks.wait_for(2))[1]
            assert again.headers["webhook-id"] == got.headers["webhook-id"]
            assert verify_webhook(again.body, again.headers, endpoint.secret) == event
            with pytest.raises(NotFound):
                await call(c.replay_webhook_delivery, "dlv_" + "0" * 26)

            # After a rotation deliveries verify under the new secret, and under the old one for a day.
            rotated: WebhookEndpoint = await call(c.rotate_webhook_endpoint_secret, endpoint.id)
            assert rotated.secret and rotated.secret != endpoint.secret
            await _user(project)
            third = (await hooks.wait_for(3))[2]
            assert verify_webhook(third.body, third.headers, rotated.secret)["type"] == "user.created"
            assert verify_webhook(third.body, third.headers, endpoint.secret)["type"] == "user.created"

            changed: WebhookEndpoint = await call(c.update_webhook_endpoint, endpoint.id, events=["*"],
                                                  description=None)
            raw = await project.api.get(f"/v1/webhook-endpoints/{endpoint.id}")
            assert raw.body["events"] == ["*"] and raw.body["description"] is None
            _same_endpoint(changed, raw.body)
            assert (await call(c.update_webhook_endpoint, endpoint.id, status="disabled")).status == "disabled"
            assert (await project.api.get(f"/v1/webhook-endpoints/{endpoint.id}")).body["status"] == "disabled"

            deleted = await call(c.delete_webhook_endpoint, endpoint.id)
            assert (deleted.id, deleted.deleted) == (endpoint.id, True)
            assert (await project.api.get(f"/v1/webhook-endpoints/{endpoint.id}")).status == 404
            with pytest.raises(NotFound) as gone:
                await call(c.get_webhook_endpoint, endpoint.id)
            assert (gone.value.status, gone.value.code) == (404, "not_found")
            with pytest.raises(InvalidRequest) as bad:
                await call(c.create_webhook_endpoint, "ftp://example.com/hooks", ["*"])
            assert bad.value.details["fields"][0]["field"] == "url"
    finally:
        c.close()


async def test_failed_deliveries_recovered_with_the_async_client(authio: AsyncAuthioClient,
                                                                 project: Project) -> None:
    # Four failures spend the schedule (1 + 3 retries of 0.3 s); the fifth request succeeds.
    async with receiver(answers=[500, 500, 500, 500, 200]) as hooks:
        before = datetime.now(UTC) - timedelta(seconds=5)
        endpoint = await authio.create_webhook_endpoint(hooks.url, ["user.created"])
        assert endpoint.secret
        others = [await authio.create_webhook_endpoint(hooks.url + f"/{i}", ["user.deleted"])
                  for i in range(2)]
        listed = [e.id async for e in authio.iter_webhook_endpoints(limit=2)]
        assert listed == [endpoint.id] + [o.id for o in others]
        raw = await project.api.get("/v1/webhook-endpoints")
        page = await authio.list_webhook_endpoints()
        for got, item in zip(page.data, raw.body["data"], strict=True):
            _same_endpoint(got, item)
            assert got.secret is None

        await _user(project)
        await _deliveries_until(project, endpoint.id, "failed", 1)
        [failed] = [d async for d in authio.iter_webhook_deliveries(endpoint.id, status="failed")]
        assert [a.status_code for a in failed.attempts] == [500] * 4 and failed.next_attempt_at is None
        assert await authio.recover_webhook_endpoint(endpoint.id, before) == 1
        delivered: list[Received] = await hooks.wait_for(5)
        assert verify_webhook(delivered[4].body, delivered[4].headers, endpoint.secret)["id"] == failed.event_id
        await _deliveries_until(project, endpoint.id, "succeeded", 1)
        raw = await project.api.get(f"/v1/webhook-endpoints/{endpoint.id}/deliveries")
        [now] = (await authio.list_webhook_deliveries(endpoint.id)).data
        _same_delivery(now, raw.body["data"][0])
        assert now.status == "succeeded" and now.attempts[-1].status_code == 200
        assert await authio.recover_webhook_endpoint(endpoint.id, before.isoformat()) == 0
        with pytest.raises(ValueError, match="naive"):
            await authio.recover_webhook_endpoint(endpoint.id, datetime.now())
        assert (await authio.delete_webhook_endpoint(endpoint.id)).deleted
        with pytest.raises(NotFound):
            await authio.list_webhook_deliveries(endpoint.id)


# -- data-subject requests --------------------------------------------------------------------


def _same_dsr(got: DataSubjectRequest, raw: dict[str, Any]) -> None:
    assert (got.dsr_id, got.request_type, got.user_email, got.notes, got.due_days, got.status,
            got.overdue, got.output_artifact_url, got.result) == (
        raw["dsr_id"], raw["request_type"], raw["user_email"], raw["notes"], raw["due_days"],
        raw["status"], raw["overdue"], raw["output_artifact_url"], raw["result"])
    assert (got.created_at, got.due_at) == (ts(raw["created_at"]), ts(raw["due_at"]))
    assert got.fulfilled_at == (ts(raw["fulfilled_at"]) if raw["fulfilled_at"] else None)


async def test_data_subject_requests_with_the_sync_client(project: Project) -> None:
    doomed, exported = mail(), mail()
    for address in (doomed, exported):
        assert (await project.api.post("/v1/users", {"email": address})).status == 201
    doomed_id = (await project.api.get(f"/v1/users?email={doomed}")).body["data"][0]["id"]

    def flow() -> dict[str, Any]:
        with sync_client(project.api.base_url, project.key, Sent()) as c:
            deletion = c.create_dsr(doomed, "deletion", due_days=45, notes="ticket 12")
            export = c.create_dsr(exported, "export")
            assert c.get_dsr(deletion.dsr_id) == deletion
            pending = c.list_dsrs(status="pending", type="deletion")
            with pytest.raises(InvalidRequest):  # an export says where its document goes
                c.fulfill_dsr(export.dsr_id)
            with pytest.raises(InvalidRequest):
                c.create_dsr(doomed, "rectification")
            with pytest.raises(NotFound):
                c.get_dsr("dsr_" + "0" * 26)
            return {"deletion": deletion, "export": export, "pending": pending,
                    "deleted": c.fulfill_dsr(deletion.dsr_id), "again": c.fulfill_dsr(deletion.dsr_id),
                    "exported": c.fulfill_dsr(export.dsr_id, output_artifact_url="https://files.example.com/1"),
                    "all": list(c.iter_dsrs(limit=1))}

    got = await asyncio.to_thread(flow)
    deletion: DataSubjectRequest = got["deletion"]
    assert (deletion.request_type, deletion.status, deletion.due_days, deletion.notes) == (
        "deletion", "pending", 45, "ticket 12")
    assert round((deletion.due_at - deletion.created_at).total_seconds()) == 45 * 86400
    assert [d.dsr_id for d in got["pending"].data] == [deletion.dsr_id]

    deleted: Fulfilment = got["deleted"]
    assert deleted.user_found and not deleted.finishing and deleted.dsr.status == "fulfilled"
    assert deleted.deleted and deleted.deleted["users"] == 1 and deleted.anonymized is not None
    assert got["again"].dsr == deleted.dsr and got["again"].deleted == deleted.deleted
    assert (await project.api.get(f"/v1/users/{doomed_id}")).status == 404  # the user is gone
    raw = await project.api.get(f"/v1/compliance/dsr/{deletion.dsr_id}")
    _same_dsr(deleted.dsr, raw.body)

    exported_: Fulfilment = got["exported"]
    raw = await project.api.get(f"/v1/compliance/dsr/{got['export'].dsr_id}")
    _same_dsr(exported_.dsr, raw.body)
    assert exported_.user_found and exported_.document is not None and exported in str(exported_.document)
    assert exported_.sha256 == raw.body["result"]["sha256"]
    assert exported_.dsr.output_artifact_url == "https://files.example.com/1"
    listed = await project.api.get("/v1/compliance/dsr")
    for mine, item in zip(got["all"], listed.body["data"], strict=True):
        _same_dsr(mine, item)


async def test_data_subject_requests_with_the_async_client(authio: AsyncAuthioClient,
                                                            project: Project) -> None:
    nobody = mail()  # an address the project never held
    made = await authio.create_dsr(nobody, "deletion")
    assert made.due_days == 30 and made.status == "pending" and not made.overdue
    assert [d.dsr_id async for d in authio.iter_dsrs(overdue=False)] == [made.dsr_id]
    assert (await authio.list_dsrs(overdue=True)).data == []
    done = await authio.fulfill_dsr(made.dsr_id)
    assert not done.user_found and done.dsr.status == "fulfilled" and done.dsr.fulfilled_at
    raw = await project.api.get(f"/v1/compliance/dsr/{made.dsr_id}")
    _same_dsr(await authio.get_dsr(made.dsr_id), raw.body)
    assert [d.dsr_id for d in (await authio.list_dsrs(status="fulfilled")).data] == [made.dsr_id]


# -- risk policy and decisions ------------------------------------------------------------------


def _same_policy(got: RiskPolicy, raw: dict[str, Any]) -> None:
    assert (got.threshold_challenge, got.threshold_block, got.default) == (
        raw["threshold_challenge"], raw["threshold_block"], raw["default"])
    assert {n: (p.enabled, p.weight, p.description) for n, p in got.signals.items()} == {
        n: (p["enabled"], p["weight"], p["description"]) for n, p in raw["signals"].items()}
    assert got.updated_at == (ts(raw["updated_at"]) if raw["updated_at"] else None)


def _same_decision(got: RiskDecision, raw: dict[str, Any]) -> None:
    assert (got.id, got.user_id, got.session_id, got.method, got.score, got.decision, got.reasons,
            got.inputs, got.step_up_challenge_id, got.created_at) == (
        raw["id"], raw["user_id"], raw["session_id"], raw["method"], raw["score"], raw["decision"],
        raw["reasons"], raw["inputs"], raw["step_up_challenge_id"], ts(raw["created_at"]))
    assert [(s.name, s.fired, s.contribution, s.reason) for s in got.signals] == [
        (s["name"], s["fired"], s["contribution"], s["reason"]) for s in raw["signals"]]


async def test_the_risk_policy_and_decisions_with_the_sync_client(project: Project) -> None:
    signed = await signed_in(project)
    user_id = signed.body["user"]["id"]

    def flow() -> dict[str, Any]:
        with sync_client(project.api.base_url, project.key, Sent()) as c:
            before = c.get_risk_policy()
            after = c.replace_risk_policy(40, 80, signals={"new_device": {"weight": 15},
                                                           "ip_velocity": {"weight": 5, "enabled": False}})
            with pytest.raises(InvalidRequest):
                c.replace_risk_policy(80, 40)
            with pytest.raises(InvalidRequest) as unknown:
                c.replace_risk_policy(40, 80, signals={"full_moon": {"weight": 1}})
            assert unknown.value.code == "invalid_request"
            with pytest.raises(NotFound):
                c.get_risk_decision("rd_" + "0" * 26)
            decisions = c.list_risk_decisions(user=user_id)
            return {"before": before, "after": after, "decisions": decisions,
                    "one": c.get_risk_decision(decisions.data[0].id),
                    "blocked": c.list_risk_decisions(decision="block"),
                    "walked": list(c.iter_risk_decisions(limit=1))}

    got = await asyncio.to_thread(flow)
    assert got["before"].default and (got["before"].threshold_challenge, got["before"].threshold_block) == (50, 90)
    after: RiskPolicy = got["after"]
    assert not after.default and after.signals["new_device"].weight == 15
    assert not after.signals["ip_velocity"].enabled and after.signals["new_country"].enabled
    _same_policy(after, (await project.api.get("/v1/risk/policy")).body)

    raw = await project.api.get(f"/v1/risk/decisions?user={user_id}")
    [decision] = got["decisions"].data
    _same_decision(decision, raw.body["data"][0])
    assert (decision.session_id, decision.decision, decision.method) == (
        signed.session_id, "allow", raw.body["data"][0]["method"])
    _same_decision(got["one"], raw.body["data"][0])
    assert got["blocked"].data == [] and [d.id for d in got["walked"]] == [decision.id]


async def test_the_risk_policy_and_decisions_with_the_async_client(authio: AsyncAuthioClient,
                                                                    project: Project) -> None:
    first, second = await signed_in(project), await signed_in(project)
    _same_policy(await authio.get_risk_policy(), (await project.api.get("/v1/risk/policy")).body)
    walked = [d async for d in authio.iter_risk_decisions(limit=1)]
    assert [d.session_id for d in walked] == [second.session_id, first.session_id]  # newest first
    raw = await project.api.get(f"/v1/risk/decisions/{walked[1].id}")
    _same_decision(await authio.get_risk_decision(walked[1].id), raw.body)
    later = await authio.list_risk_decisions(since=walked[0].created_at)
    assert [d.id for d in later.data] == [walked[0].id]
    replaced = await authio.replace_risk_policy(30, 60)
    assert (replaced.threshold_challenge, replaced.threshold_block, replaced.default) == (30, 60, False)


# -- a user's passkeys and OAuth providers -----------------------------------------------------


def _same_passkey(got: Passkey, raw: dict[str, Any]) -> None:
    assert (got.id, got.user_id, got.credential_id, got.name, got.aaguid, got.sign_count,
            got.transports, got.backup_eligible, got.backup_state, got.created_at) == (
        raw["id"], raw["user_id"], raw["credential_id"], raw["name"], raw["aaguid"], raw["sign_count"],
        raw["transports"], raw["backup_eligible"], raw["backup_state"], ts(raw["created_at"]))
    assert got.last_used_at == (ts(raw["last_used_at"]) if raw["last_used_at"] else None)


async def test_a_users_passkeys_with_both_clients(authio: AsyncAuthioClient, project: Project) -> None:
    await configure(project)
    user = await signed_in(project)
    laptop, phone = SoftAuthenticator(ORIGIN), SoftAuthenticator(ORIGIN)
    first = await register(project, user, laptop)
    second = await register(project, user, phone)
    c = sync_client(project.api.base_url, project.key, Sent())
    try:
        listed: list[Passkey] = await asyncio.to_thread(c.list_user_passkeys, user.user_id)
        raw = await project.api.get(f"/v1/users/{user.user_id}/passkeys")
        assert [p.id for p in listed] == [first["id"], second["id"]]
        for got, item in zip(listed, raw.body["data"], strict=True):
            _same_passkey(got, item)
        deleted: Passkey = await asyncio.to_thread(c.delete_user_passkey, user.user_id, first["id"])
        assert deleted.id == first["id"]
        with pytest.raises(NotFound) as twice:
            await asyncio.to_thread(c.delete_user_passkey, user.user_id, first["id"])
        assert twice.value.code == "not_found"
    finally:
        c.close()
    # The deleted passkey signs in no more; the other one still does.
    assert (await login_verify(project, laptop.get(await options(project)))).status == 400
    assert (await login_verify(project, phone.get(await options(project)))).status == 200
    assert [p.id for p in await authio.list_user_passkeys(user.user_id)] == [second["id"]]
    assert (await authio.delete_user_passkey(user.user_id, second["id"])).id == second["id"]
    assert (await project.api.get(f"/v1/users/{user.user_id}/passkeys")).body["data"] == []
    with pytest.raises(UserNotFound):
        await authio.list_user_passkeys("user_" + "0" * 26)


def _same_provider(got: OAuthProvider, raw: dict[str, Any]) -> None:
    assert (got.provider, got.kind, got.client_id, got.issuer, got.scopes, got.redirect_uris,
            got.callback_url, got.created_at, got.updated_at) == (
        raw["provider"], raw["kind"], raw["client_id"], raw["issuer"], raw["scopes"], raw["redirect_uris"],
        raw["callback_url"], ts(raw["created_at"]), ts(raw["updated_at"]))


async def test_oauth_providers_with_both_clients(authio: AsyncAuthioClient, project: Project) -> None:
    pages = ["https://app.example.com/signed-in"]

    def flow() -> tuple[OAuthProvider, OAuthProvider, OAuthProvider]:
        with sync_client(project.api.base_url, project.key, Sent()) as c:
            made = c.replace_oauth_provider("github", client_id="gh-client", client_secret="gh-secret",
                                            redirect_uris=pages)
            again = c.replace_oauth_provider("github", client_id="gh-client-2", client_secret="gh-secret",
                                             redirect_uris=pages, scopes=["read:user", "user:email"])
            with pytest.raises(InvalidRequest) as bad:  # a generic provider needs its issuer
                c.replace_oauth_provider("corp", client_id="c", client_secret="s", redirect_uris=pages)
            assert any(f["field"] == "issuer" for f in bad.value.details["fields"])
            return made, again, c.get_oauth_provider("github")

    made, again, got = await asyncio.to_thread(flow)
    assert (made.created, again.created, got.created) == (True, False, None)
    assert made.callback_url == f"{project.api.base_url}/v1/auth/oauth/github/callback"
    raw = await project.api.get("/v1/oauth/providers/github")
    assert raw.body["client_id"] == "gh-client-2" and "gh-secret" not in raw.raw.decode()
    for answer in (again, got):
        _same_provider(answer, raw.body)
    assert again.scopes == ["read:user", "user:email"] and again.redirect_uris == pages
    _same_provider(await authio.get_oauth_provider("github"), raw.body)
    assert await authio.delete_oauth_provider("github") == "github"
    assert (await project.api.get("/v1/oauth/providers/github")).status == 404
    with pytest.raises(UnknownProvider) as gone:
        await authio.get_oauth_provider("github")
    assert (gone.value.status, gone.value.code) == (404, "unknown_provider")
    with pytest.raises(UnknownProvider):
        await authio.delete_oauth_provider("github")
