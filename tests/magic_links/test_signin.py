"""Magic-link sign-in through HTTP: send, the landing page, verify, the session envelope.

Links are read from the development mailbox (the console sink of `make run`), exactly as a
developer reads them; SMTP and SMS delivery are proven in tests/messages/test_outbox.py.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession
from jwcrypto import jwk, jwt

from common.ids import new_id
from common.settings import Settings
from tests.fixtures.database import events
from tests.fixtures.identity import (
    add_member,
    email,
    latest_link,
    link_in,
    make_org,
    send_link,
    sign_in,
    token_of,
    verify,
)
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import Api, Project, assert_error, assert_invalid_field, combined_app, serving


def phone() -> str:
    return "+1415555" + str(secrets.randbelow(10_000)).zfill(4)


async def jwks_claims(api: Api, project: Project, token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, claims) of ``token`` verified by jwcrypto against the served JWKS."""
    r = await api.get(f"/v1/auth/.well-known/jwks.json?project_id={project.id}", key=None)
    assert r.status == 200, r.body
    keyset = jwk.JWKSet.from_json(r.raw.decode())
    verified = jwt.JWT(jwt=token, key=keyset, algs=["EdDSA", "RS256"],
                       check_claims={"aud": "service", "exp": None, "nbf": None, "iat": None})
    import json

    return json.loads(verified.header), json.loads(verified.claims)


# --- send -------------------------------------------------------------------------------------


async def test_send_queues_a_link_to_the_landing_page(service: Api, project: Project) -> None:
    to = email()
    r = await send_link(service, project, to)
    assert r.status == 200, r.body
    assert r.body["sent"] is True and r.body["channel"] == "email" and r.body["expires_in"] == 900
    link = await latest_link(project, to)
    assert link.startswith("http://localhost:") and f"project_id={project.id}" in link
    assert len(token_of(link)) >= 43


async def test_send_answers_the_same_for_unknown_and_known_users(service: Api, project: Project) -> None:
    known = email()
    r = await project.api.post("/v1/users", {"email": known, "name": "Known"})
    assert r.status == 201, r.body
    a = await send_link(service, project, known)
    b = await send_link(service, project, email())
    assert a.status == b.status == 200
    strip = lambda body: {k: v for k, v in body.items() if k != "request_id"}  # noqa: E731
    assert strip(a.body) == strip(b.body)


@pytest.mark.parametrize(("destination", "status", "code"), [
    ("not-an-address", 400, "invalid_destination"),
    ("14155550100", 400, "invalid_destination"),
    ("+0123", 400, "invalid_destination"),
    ("someone@", 422, "invalid_email"),
    ("a@b@c.com", 422, "invalid_email"),
    ("two words@example.com", 422, "invalid_email"),
])
async def test_send_rejects_bad_destinations(service: Api, project: Project, destination: str,
                                             status: int, code: str) -> None:
    assert_error(await send_link(service, project, destination), status, code)


@pytest.mark.parametrize("path", ["/v1/auth/magic-link/verify", "/v1/auth/magic-link/send",
                                  "/v1/auth/.well-known/jwks.json"])
async def test_a_nul_in_project_id_is_invalid_request_naming_it(service: Api, path: str) -> None:
    """The verify route passed it on to PostgreSQL, which cannot take NUL (a 500)."""
    body = {"token": "x" * 43} if path.endswith("verify") else {"destination": email()}
    r = await service.request("GET" if path.endswith(".json") else "POST",
                              f"{path}?project_id=proj_%00", key=None,
                              json=None if path.endswith(".json") else body)
    assert_invalid_field(r, "project_id", "must not contain the NUL character (\\u0000)")


async def test_send_needs_a_project(service: Api, project: Project) -> None:
    r = await service.post("/v1/auth/magic-link/send", {"destination": email()}, key=None)
    assert_error(r, 400, "invalid_request")
    assert r.body["error"]["details"]["fields"][0]["field"] == "project_id"
    r = await service.post("/v1/auth/magic-link/send", {"destination": email()}, key=None,
                           headers={"Service-Project": "proj_01jd0000000000000000000000"})
    assert_error(r, 404, "project_not_found")
    r = await service.post("/v1/auth/magic-link/send", {"destination": email()}, key=None,
                           headers={"Service-Project": project.id})
    assert r.status == 200, r.body


async def test_send_rejects_unknown_fields(service: Api, project: Project) -> None:
    r = await service.post(f"/v1/auth/magic-link/send?project_id={project.id}",
                           {"destination": email(), "password": "x"}, key=None)
    assert_error(r, 400, "invalid_request")


async def test_send_is_rate_limited_per_destination(
    http: ClientSession, settings_factory: Callable[..., Settings], project: Project,
) -> None:
    settings = settings_factory(magic_link_rate_per_destination="2/minute",
                                magic_link_rate_per_ip="100/minute")
    async with serving(http, combined_app(settings)) as api:
        to = email()
        for _ in range(2):
            assert (await send_link(api, project, to)).status == 200
        r = await send_link(api, project, to)
        assert_error(r, 429, "rate_limited")
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert r.body["error"]["details"]["retry_after"] == int(r.headers["Retry-After"])
        # The limit is per destination: another address still goes through; so does the same
        # address in letters of another case only if it is another mailbox (it is not).
        assert (await send_link(api, project, email())).status == 200
        assert_error(await send_link(api, project, to.upper()), 429, "rate_limited")


async def test_sub_addresses_share_their_mailbox_limit(
    http: ClientSession, settings_factory: Callable[..., Settings], project: Project,
) -> None:
    """Before: ``a+1@x`` and ``a+2@x`` each had a limit of their own, so one inbox could be
    flooded through endless tags. The links still go to the address as written."""
    settings = settings_factory(magic_link_rate_per_destination="2/minute",
                                magic_link_rate_per_ip="100/minute")
    local, domain = email().split("@")
    async with serving(http, combined_app(settings)) as api:
        for tag in ("1", "2"):
            assert (await send_link(api, project, f"{local}+{tag}@{domain}")).status == 200
        assert_error(await send_link(api, project, f"{local}+3@{domain}"), 429, "rate_limited")
        assert_error(await send_link(api, project, f"{local}@{domain}"), 429, "rate_limited")
        # Delivered as written (by whichever running app's outbox worker took it).
        assert await latest_link(project, f"{local}+2@{domain}", also=(api,))
        # Gmail ignores dots and answers to googlemail.com too.
        for address in (f"{local}.x@gmail.com", f"{local}x@gmail.com"):
            assert (await send_link(api, project, address)).status == 200
        assert_error(await send_link(api, project, f"{local}.X+y@googlemail.com"), 429,
                     "rate_limited")


async def test_send_is_rate_limited_per_ip(
    http: ClientSession, settings_factory: Callable[..., Settings], project: Project,
) -> None:
    settings = settings_factory(magic_link_rate_per_destination="100/minute",
                                magic_link_rate_per_ip="3/minute")
    # Each test app shares Redis; a key prefix of its own keeps this IP budget to this test.
    settings = settings.model_copy(update={"redis_prefix": settings.redis_prefix + secrets.token_hex(3) + ":"})
    async with serving(http, combined_app(settings)) as api:
        for _ in range(3):
            assert (await send_link(api, project, email())).status == 200
        r = await send_link(api, project, email())
        assert_error(r, 429, "rate_limited")
        assert "Retry-After" in r.headers


# --- the landing page ---------------------------------------------------------------------------


async def test_landing_page_shows_a_button_and_never_consumes(service: Api, project: Project) -> None:
    to = email()
    await send_link(service, project, to)
    link = await latest_link(project, to)
    path = link[link.index("/v1/"):]
    for _ in range(2):  # a mail scanner, then the person
        r = await service.get(path, key=None)
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        assert r.headers["Cache-Control"] == "no-store"
        assert r.headers["Referrer-Policy"] == "no-referrer"
        assert "script-src 'nonce-" in r.headers["Content-Security-Policy"]
        assert b"<button" in r.raw and token_of(link).encode() not in r.raw
    r = await verify(service, project, token_of(link))
    assert r.status == 200, r.body


# --- verify -----------------------------------------------------------------------------------


async def test_verify_signs_in_and_returns_the_envelope(service: Api, project: Project,
                                                        db: asyncpg.Pool) -> None:
    to = email()
    s = await sign_in(project, to, api=service)
    body = s.body
    assert set(body) == {"session", "user", "access_token", "token_type", "expires_in",
                         "refresh_token", "request_id"}
    assert body["token_type"] == "Bearer" and body["expires_in"] == 900
    assert body["refresh_token"].startswith("rt_")
    assert body["session"]["id"].startswith("sess_")
    assert body["session"]["user_id"] == body["user"]["id"]
    assert body["session"]["organization_id"] is None and body["session"]["role"] is None
    assert body["session"]["expires_at"]
    assert body["user"]["email"] == to and body["user"]["email_verified"] is True
    cookie = s.response.headers["Set-Cookie"]
    assert cookie.startswith(f"service_session={body['access_token']};")
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "path", "samesite", "max-age"} <= attrs
    assert "SameSite=Lax" in cookie and "Path=/" in cookie
    assert "secure" not in attrs  # plain-HTTP localhost
    # Stored hashed: neither the refresh token nor the link token appear in the database.
    stored = await db.fetchval("SELECT count(*) FROM refresh_tokens WHERE session_id = $1",
                               s.session_id)
    assert stored == 1
    assert await db.fetchval(
        "SELECT count(*) FROM refresh_tokens WHERE token_hash = convert_to($1, 'UTF8')",
        s.refresh_token) == 0


async def test_cookie_is_secure_off_localhost(
    http: ClientSession, settings_factory: Callable[..., Settings], project: Project,
) -> None:
    settings = settings_factory(base_url="https://auth.example.com", dev_mailbox=True)
    async with serving(http, combined_app(settings)) as api:
        to = email()
        await send_link(api, project, to)
        messages_link = await latest_link(project, to, also=[api])
        assert messages_link.startswith("https://auth.example.com/v1/auth/magic-link/verify?")
        r = await verify(api, project, token_of(messages_link))
        assert r.status == 200, r.body
        assert "Secure" in r.headers["Set-Cookie"]


async def test_access_token_verifies_against_the_jwks_with_exact_claims(
    service: Api, project: Project, settings_factory: Callable[..., Settings],
) -> None:
    s = await sign_in(project, email(), api=service)
    header, claims = await jwks_claims(service, project, s.access_token)
    assert header["alg"] == "EdDSA" and header["kid"].startswith("kid_")
    assert set(claims) == {"iss", "aud", "sub", "sid", "iat", "nbf", "exp", "pid"}
    assert claims["iss"] == settings_factory().public_base_url
    assert claims["aud"] == "service" and claims["sub"] == s.user_id
    assert claims["sid"] == s.session_id and claims["pid"] == project.id
    assert claims["nbf"] == claims["iat"] and claims["exp"] == claims["iat"] + 900


async def test_a_link_works_once(service: Api, project: Project, db: asyncpg.Pool) -> None:
    to = email()
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to))
    assert (await verify(service, project, token)).status == 200
    assert_error(await verify(service, project, token), 410, "token_consumed")
    failures = [e for e in await events(db, project.id, "auth.signin_attempt")
                if e["metadata"]["outcome"] == "failure"]
    assert [e["metadata"]["reason"] for e in failures] == ["token_consumed"]


async def test_an_expired_link_fails(service: Api, project: Project, db: asyncpg.Pool) -> None:
    to = email()
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to))
    # Time travel: the link was issued 16 minutes ago.
    await db.execute(
        """UPDATE magic_link_tokens SET created_at = created_at - interval '16 minutes',
                  expires_at = expires_at - interval '16 minutes'
           WHERE project_id = $1 AND destination = $2""", project.id, to)
    assert_error(await verify(service, project, token), 410, "token_expired")


async def test_links_expire_after_fifteen_minutes(service: Api, project: Project,
                                                  db: asyncpg.Pool) -> None:
    to = email()
    await send_link(service, project, to)
    lifetime = await db.fetchval(
        "SELECT expires_at - created_at FROM magic_link_tokens WHERE project_id = $1 AND destination = $2",
        project.id, to)
    assert lifetime.total_seconds() == 900


async def test_unknown_or_foreign_tokens_fail(service: Api, project: Project,
                                              new_project: Callable[..., Any]) -> None:
    assert_error(await verify(service, project, "x" * 43), 410, "token_invalid_or_expired")
    other = await new_project("other")
    to = email()
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to))
    # Redeemed against another project: refused, and not consumed.
    assert_error(await verify(service, other, token), 410, "token_invalid_or_expired")
    assert (await verify(service, project, token)).status == 200


async def test_sign_in_records_attempts_with_device_ip_and_user_agent(
    service: Api, project: Project, db: asyncpg.Pool,
) -> None:
    to = email()
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to))
    r = await verify(service, project, token, headers={
        "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Test/1.0",
        "Sec-CH-UA-Platform": '"Linux"', "Sec-CH-UA-Mobile": "?0"})
    assert r.status == 200, r.body
    [event] = await events(db, project.id, "auth.signin_attempt")
    m = event["metadata"]
    assert m["method"] == "magic_link" and m["outcome"] == "success"
    assert m["ip"] == "127.0.0.1" and m["user_agent"].startswith("Mozilla/5.0")
    device = m["device"]
    assert {k: device[k] for k in ("user_agent", "platform", "mobile")} == {
        "user_agent": m["user_agent"], "platform": '"Linux"', "mobile": "?0"}
    # What the risk engine made of it (SPEC.md 6: score, decision, reasons, device).
    assert device["label"] == "an unknown browser on Linux" and len(device["fingerprint"]) == 32
    assert m["decision"] == "allow" and m["score"] == 0 and m["reasons"] == []
    assert m["decision_id"].startswith("rd_")
    assert event["user_id"] == r.body["user"]["id"] and event["actor_type"] == "user"
    assert event["target_id"] == r.body["session"]["id"]


async def test_first_sign_in_creates_the_user_and_later_ones_reuse_it(
    service: Api, project: Project, db: asyncpg.Pool,
) -> None:
    to = email()
    first = await sign_in(project, to, api=service)
    second = await sign_in(project, to.upper().replace("EXAMPLE.COM", "example.com"),
                           api=service)
    assert first.user_id == second.user_id
    assert first.session_id != second.session_id
    [created] = await events(db, project.id, "user.created")
    assert created["user_id"] == created["target_id"] == created["actor_id"] == first.user_id
    assert created["metadata"]["source"] == "magic_link"
    attempts = await events(db, project.id, "auth.signin_attempt")
    assert [e["target_id"] for e in attempts] == [first.session_id, second.session_id]
    assert all(e["metadata"]["outcome"] == "success" for e in attempts)
    # Exactly the stored rows the response describes, and each link used up.
    assert await db.fetchval(
        "SELECT count(*) FROM magic_link_tokens WHERE project_id = $1 AND consumed_at IS NULL",
        project.id) == 0
    assert await db.fetchval("SELECT count(*) FROM sessions WHERE user_id = $1", first.user_id) == 2


async def test_existing_user_signs_in_and_gets_verified(service: Api, project: Project) -> None:
    to = email()
    r = await project.api.post("/v1/users", {"email": to, "name": "Ada", "email_verified": False})
    assert r.status == 201 and r.body["email_verified"] is False
    s = await sign_in(project, to, api=service, count=2)  # the enrollment link came first
    assert s.user_id == r.body["id"] and s.body["user"]["email_verified"] is True
    assert s.body["user"]["last_sign_in_at"]


async def test_sms_sign_in(service: Api, project: Project) -> None:
    to = phone()
    r = await send_link(service, project, to)
    assert r.status == 200 and r.body["channel"] == "sms"
    link = await latest_link(project, to)
    v = await verify(service, project, token_of(link))
    assert v.status == 200, v.body
    assert v.body["user"]["phone_number"] == to and v.body["user"]["phone_verified"] is True
    assert v.body["user"]["email"] is None


async def test_a_link_stops_working_when_the_user_changes_address(
    service: Api, project: Project,
) -> None:
    to = email()
    r = await project.api.post("/v1/users", {"email": to, "name": "Mover"})
    user_id = r.body["id"]
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to, count=2))
    p = await project.api.request("PATCH", f"/v1/users/{user_id}", json={"email": email()})
    assert p.status == 200, p.body
    assert_error(await verify(service, project, token), 410, "token_invalid_or_expired")


# --- organizations at sign-in -------------------------------------------------------------------


async def test_one_membership_selects_that_org(service: Api, project: Project) -> None:
    to = email()
    user = (await project.api.post("/v1/users", {"email": to, "name": "Solo"})).body
    org = await make_org(project)
    await add_member(project, org["id"], user["id"], role="admin")
    s = await sign_in(project, to, api=service, count=2)
    assert s.body["session"]["organization_id"] == org["id"]
    assert s.body["session"]["role"] == "admin"
    _, claims = await jwks_claims(service, project, s.access_token)
    assert claims["act_org"] == org["id"] and claims["act_role"] == "admin"


async def test_several_memberships_select_none(service: Api, project: Project) -> None:
    to = email()
    user = (await project.api.post("/v1/users", {"email": to, "name": "Many"})).body
    for _ in range(2):
        await add_member(project, (await make_org(project))["id"], user["id"])
    s = await sign_in(project, to, api=service, count=2)
    assert s.body["session"]["organization_id"] is None
    _, claims = await jwks_claims(service, project, s.access_token)
    assert "act_org" not in claims and "act_role" not in claims


async def test_invitation_link_accepts_and_selects_the_org(
    service: Api, project: Project, db: asyncpg.Pool,
) -> None:
    org = await make_org(project)
    to = email()
    r = await project.api.post(f"/v1/organizations/{org['id']}/invitations",
                               {"email": to, "role": "admin"})
    assert r.status == 201, r.body
    invitation_id = r.body["id"]
    link = await latest_link(project, to)
    v = await verify(service, project, token_of(link))
    assert v.status == 200, v.body
    assert v.body["session"]["organization_id"] == org["id"] and v.body["session"]["role"] == "admin"
    m = await project.api.get(f"/v1/organizations/{org['id']}/memberships")
    assert [(x["user_id"], x["role"]) for x in m.body["data"]] == [(v.body["user"]["id"], "admin")]
    i = await project.api.get(f"/v1/organizations/{org['id']}/invitations/{invitation_id}")
    assert i.body["status"] == "accepted"
    assert [e["target_id"] for e in await events(db, project.id, "invitation.accepted")] == [invitation_id]


async def test_a_refused_invitation_link_is_recorded_and_used_up(
    service: Api, project: Project, db: asyncpg.Pool,
) -> None:
    org = await make_org(project)
    to = email()
    r = await project.api.post(f"/v1/organizations/{org['id']}/invitations", {"email": to})
    link = await latest_link(project, to)
    rv = await project.api.post(f"/v1/organizations/{org['id']}/invitations/{r.body['id']}/revoke")
    assert rv.status == 200, rv.body
    assert_error(await verify(service, project, token_of(link)), 409, "invitation_not_pending")
    [failure] = await events(db, project.id, "auth.signin_attempt")
    assert failure["metadata"]["outcome"] == "failure"
    assert failure["metadata"]["reason"] == "invitation_not_pending"
    assert failure["metadata"]["purpose"] == "invitation"
    assert_error(await verify(service, project, token_of(link)), 410, "token_consumed")


# --- concurrency ------------------------------------------------------------------------------


async def test_one_link_redeemed_at_once_signs_in_once(service: Api, project: Project,
                                                       db: asyncpg.Pool) -> None:
    to = email()
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to))
    results = await asyncio.gather(*(verify(service, project, token) for _ in range(8)))
    assert sorted(r.status for r in results) == [200] + [410] * 7
    assert {r.body["error"]["code"] for r in results if r.status == 410} == {"token_consumed"}
    user_id = next(r.body["user"]["id"] for r in results if r.status == 200)
    assert await db.fetchval("SELECT count(*) FROM sessions WHERE user_id = $1", user_id) == 1


async def test_two_first_sign_ins_at_once_make_one_user(service: Api, project: Project) -> None:
    to = email()
    for _ in range(2):
        await send_link(service, project, to)
    messages = await mailbox_messages(project.api, to, count=2)
    tokens = [token_of(link_in(m["text"])) for m in messages]
    first, second = await asyncio.gather(*(verify(service, project, t) for t in tokens))
    assert first.status == second.status == 200, (first.body, second.body)
    assert first.body["user"]["id"] == second.body["user"]["id"]
    users = await project.api.get(f"/v1/users?email={to}")
    assert len(users.body["data"]) == 1


# --- the per-IP limit behind proxies ------------------------------------------------------------


async def test_ip_limit_counts_the_client_behind_a_trusted_proxy(
    http: ClientSession, settings_factory: Callable[..., Settings], project: Project,
) -> None:
    settings = settings_factory(magic_link_rate_per_destination="100/minute",
                                magic_link_rate_per_ip="2/minute", trusted_proxies="127.0.0.1/32")
    settings = settings.model_copy(update={"redis_prefix": settings.redis_prefix + secrets.token_hex(3) + ":"})

    async def send(forwarded_for: str) -> int:
        r = await send_link(api, project, email(), headers={"X-Forwarded-For": forwarded_for})
        return r.status

    async with serving(http, combined_app(settings)) as api:
        assert [await send("203.0.113.5") for _ in range(3)] == [200, 200, 429]
        assert await send("203.0.113.6") == 200  # another client behind the same proxy
        # An IPv6 client is counted by its /64: rotating the interface id does not help.
        assert [await send(f"2001:db8:1:2::{n}") for n in range(1, 4)] == [200, 200, 429]
        # A spoofed left-most entry does not change who the proxy says the client is.
        assert await send("198.51.100.1, 203.0.113.5") == 429


# --- races, made deterministic by holding a row lock in a transaction of the test's ----------


async def _blocked(task: asyncio.Task[Any]) -> None:
    """Give ``task`` time to reach the lock the test holds, and check that it waits there."""
    await asyncio.sleep(0.3)
    assert not task.done(), task.result()


async def test_an_address_changed_during_the_sign_in_is_not_verified(
    service: Api, project: Project, db: asyncpg.Pool,
) -> None:
    to, new_address = email(), email()
    user = (await project.api.post("/v1/users", {"email": to, "name": "Racer"})).body
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to, count=2))
    async with db.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("UPDATE users SET email = $2, email_verified = false WHERE id = $1",
                           user["id"], new_address)
        verifying = asyncio.create_task(verify(service, project, token))
        await _blocked(verifying)
        await tx.commit()
    assert_error(await verifying, 410, "token_invalid_or_expired")
    stored = await db.fetchrow("SELECT email, email_verified FROM users WHERE id = $1", user["id"])
    assert stored["email"] == new_address and stored["email_verified"] is False
    assert await db.fetchval("SELECT count(*) FROM sessions WHERE user_id = $1", user["id"]) == 0
    [refused] = await events(db, project.id, "auth.signin_attempt")
    assert refused["metadata"]["reason"] == "token_invalid_or_expired"


async def test_a_user_deleted_during_the_sign_in_gets_no_session(
    service: Api, project: Project, db: asyncpg.Pool,
) -> None:
    to = email()
    user = (await project.api.post("/v1/users", {"email": to, "name": "Leaver"})).body
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to, count=2))
    async with db.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        # As DELETE /v1/users does: the user's row first, then its links through the foreign
        # key. A sign-in that locked the link first would deadlock with it here.
        await conn.execute("SELECT 1 FROM users WHERE id = $1 FOR UPDATE", user["id"])
        verifying = asyncio.create_task(verify(service, project, token))
        await _blocked(verifying)
        await conn.execute("DELETE FROM users WHERE id = $1", user["id"])
        await tx.commit()
    r = await verifying
    assert_error(r, 410, "token_invalid_or_expired")  # not a deadlock's 500
    assert await db.fetchval("SELECT count(*) FROM users WHERE project_id = $1 AND lower(email) = $2",
                             project.id, to) == 0


async def test_a_first_sign_in_racing_another_creation_signs_in_as_that_user(
    service: Api, project: Project, db: asyncpg.Pool,
) -> None:
    """The fast path yields to the other creation and the general path signs in."""
    to = email()
    await send_link(service, project, to)
    token = token_of(await latest_link(project, to))
    racer = new_id("user")
    async with db.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(
            "INSERT INTO users (id, project_id, email, name) VALUES ($1, $2, $3, 'Other')",
            racer, project.id, to)
        verifying = asyncio.create_task(verify(service, project, token))
        await _blocked(verifying)
        await tx.commit()
    r = await verifying
    assert r.status == 200, r.body
    assert r.body["user"]["id"] == racer and r.body["user"]["email_verified"] is True
    assert await events(db, project.id, "user.created") == []  # it created nobody
    [attempt] = await events(db, project.id, "auth.signin_attempt")
    assert attempt["metadata"]["outcome"] == "success" and attempt["user_id"] == racer
