"""Passkeys over HTTP with the software authenticator: registration, login (a sign-in like a
magic link's), every refusal with its code and no cookie, and a user's passkeys."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable

import asyncpg

from tests.fixtures.database import events
from tests.fixtures.identity import add_member, email, make_org, session_call
from tests.fixtures.service import Api, Project, Response, assert_error, assert_invalid_field
from tests.fixtures.webauthn import SoftAuthenticator, unb64url
from tests.passkeys.helpers import (
    ORIGIN,
    RP_ID,
    configure,
    login_options,
    login_verify,
    options,
    register,
    register_options,
    register_verify,
    signed_in_user,
)


def _no_cookie(r: Response) -> None:
    assert "service_session" not in r.headers.get("Set-Cookie", ""), r.headers


async def test_register_then_usernameless_login_signs_in(
        service: Api, project: Project, db: asyncpg.Pool) -> None:
    await configure(project)
    user = await signed_in_user(project)
    authenticator = SoftAuthenticator(ORIGIN)
    r = await register_options(project.api, user, {"name": "Laptop"})
    assert r.status == 200, r.body
    assert r.body["rp"] == {"id": RP_ID, "name": "Test app"}
    assert unb64url(r.body["user"]["id"]) == user.user_id.encode()
    assert r.body["authenticatorSelection"]["residentKey"] == "required"
    assert r.body["attestation"] == "none" and r.body["excludeCredentials"] == []
    r = await register_verify(project.api, user, authenticator.create(r.body))
    assert r.status == 201, r.body
    passkey = r.body
    assert passkey["id"].startswith("pk_") and passkey["name"] == "Laptop"
    assert passkey["user_id"] == user.user_id and passkey["sign_count"] == 0
    assert unb64url(passkey["credential_id"]) == authenticator.credentials[0].credential_id
    assert passkey["transports"] == ["hybrid", "internal"]
    assert passkey["aaguid"] == "a11ce000-0000-4000-8000-0000000000a1"
    assert passkey["backup_eligible"] is False and passkey["last_used_at"] is None

    opts = await options(project)
    assert opts["allowCredentials"] == [] and opts["rpId"] == RP_ID
    r = await login_verify(project, authenticator.get(opts))
    assert r.status == 200, r.body
    assert r.body["user"]["id"] == user.user_id
    assert r.body["session"]["auth_method"] == "passkey"
    assert "service_session=" in r.headers["Set-Cookie"]
    me = await session_call(service, "GET", "/v1/sessions/me", r.body["access_token"])
    assert me.status == 200 and me.body["session"]["id"] == r.body["session"]["id"]

    listed = await session_call(service, "GET", "/v1/sessions/me/passkeys", r.body["access_token"])
    assert [p["id"] for p in listed.body["data"]] == [passkey["id"]]
    assert listed.body["data"][0]["sign_count"] == 1 and listed.body["data"][0]["last_used_at"]
    by_key = await project.api.get(f"/v1/users/{user.user_id}/passkeys")
    assert by_key.status == 200 and by_key.body["data"] == listed.body["data"]

    signins = await events(db, project.id, "auth.signin_attempt")
    assert signins[-1]["metadata"]["method"] == "passkey"
    assert signins[-1]["metadata"]["outcome"] == "success"
    assert [e["target_id"] for e in await events(db, project.id, "passkey.created")] == [passkey["id"]]


async def test_login_with_email_lists_the_users_credentials(project: Project) -> None:
    await configure(project)
    address = email()
    user = await signed_in_user(project, address)
    authenticator = SoftAuthenticator(ORIGIN)
    passkey = await register(project, user, authenticator)
    opts = await options(project, {"email": address.upper()})
    assert [c["id"] for c in opts["allowCredentials"]] == [passkey["credential_id"]]
    r = await login_verify(project, authenticator.get(opts))
    assert r.status == 200 and r.body["user"]["id"] == user.user_id
    assert (await options(project, {"email": email()}))["allowCredentials"] == []


async def test_the_organization_is_selected_as_on_every_sign_in(project: Project) -> None:
    await configure(project)
    user = await signed_in_user(project)
    org = await make_org(project)
    await add_member(project, org["id"], user.user_id, role="admin")
    authenticator = SoftAuthenticator(ORIGIN)
    await register(project, user, authenticator)
    r = await login_verify(project, authenticator.get(await options(project)))
    assert r.status == 200, r.body
    assert r.body["session"]["organization_id"] is not None and r.body["session"]["role"] == "admin"


async def test_a_synced_passkey_counting_zero_every_time_is_accepted(project: Project) -> None:
    await configure(project)
    user = await signed_in_user(project)
    authenticator = SoftAuthenticator(ORIGIN)
    passkey = await register(project, user, authenticator, synced=True)
    assert passkey["backup_eligible"] is True and passkey["backup_state"] is True
    for _ in range(3):
        r = await login_verify(project, authenticator.get(await options(project)))
        assert r.status == 200, r.body


async def _refused(project: Project, r: Response, code: str) -> None:
    assert_error(r, 400, code)
    _no_cookie(r)


async def _registered(project: Project) -> tuple[SoftAuthenticator, str]:
    await configure(project)
    user = await signed_in_user(project)
    authenticator = SoftAuthenticator(ORIGIN)
    await register(project, user, authenticator)
    return authenticator, user.user_id


async def test_a_tampered_signature_fails_and_is_recorded(project: Project, db: asyncpg.Pool) -> None:
    authenticator, user_id = await _registered(project)
    r = await login_verify(project, authenticator.get(await options(project), tamper=True))
    await _refused(project, r, "verification_failed")
    failure = (await events(db, project.id, "auth.signin_attempt"))[-1]
    assert failure["metadata"]["outcome"] == "failure"
    assert failure["metadata"]["method"] == "passkey" and failure["user_id"] == user_id


async def test_a_wrong_origin_fails(project: Project) -> None:
    authenticator, _ = await _registered(project)
    r = await login_verify(project, authenticator.get(await options(project),
                                                      origin="https://evil.example"))
    await _refused(project, r, "verification_failed")


async def test_a_wrong_rp_id_fails(project: Project) -> None:
    authenticator, _ = await _registered(project)
    r = await login_verify(project, authenticator.get(await options(project), rp_id="example.com"))
    await _refused(project, r, "verification_failed")


async def test_the_other_ceremony_type_fails(project: Project) -> None:
    authenticator, _ = await _registered(project)
    r = await login_verify(project, authenticator.get(await options(project),
                                                      ceremony="webauthn.create"))
    await _refused(project, r, "verification_failed")


async def test_user_verification_when_required(project: Project) -> None:
    authenticator, _ = await _registered(project)
    await configure(project, user_verification="required")
    opts = await options(project)
    assert opts["userVerification"] == "required"
    await _refused(project, await login_verify(project, authenticator.get(opts, uv=False)),
                   "verification_failed")
    r = await login_verify(project, authenticator.get(await options(project)))
    assert r.status == 200, r.body


async def test_a_replayed_challenge_is_refused(project: Project) -> None:
    authenticator, _ = await _registered(project)
    opts = await options(project)
    assertion = authenticator.get(opts)
    assert (await login_verify(project, assertion)).status == 200
    await _refused(project, await login_verify(project, assertion), "unknown_or_expired_challenge")


async def test_a_failed_verify_spends_the_challenge(project: Project) -> None:
    authenticator, _ = await _registered(project)
    opts = await options(project)
    await _refused(project, await login_verify(project, authenticator.get(opts, tamper=True)),
                   "verification_failed")
    await _refused(project, await login_verify(project, authenticator.get(opts)),
                   "unknown_or_expired_challenge")


async def test_an_expired_challenge_is_refused(project: Project, db: asyncpg.Pool) -> None:
    authenticator, _ = await _registered(project)
    opts = await options(project)
    digest = hashlib.sha256(unb64url(opts["challenge"])).digest()
    moved = await db.execute("UPDATE webauthn_challenges SET expires_at = now() - interval '1 second' "
                             "WHERE challenge_hash = $1", digest)
    assert moved == "UPDATE 1"
    await _refused(project, await login_verify(project, authenticator.get(opts)),
                   "unknown_or_expired_challenge")


async def test_a_challenge_never_issued_is_refused(project: Project) -> None:
    authenticator, _ = await _registered(project)
    opts = await options(project)
    r = await login_verify(project, authenticator.get(opts, challenge="bm90LWlzc3VlZA"))
    await _refused(project, r, "unknown_or_expired_challenge")


async def test_a_registration_challenge_does_not_log_in(project: Project) -> None:
    authenticator, _ = await _registered(project)
    user = await signed_in_user(project)
    reg = await register_options(project.api, user)
    opts = await options(project)
    r = await login_verify(project, authenticator.get(opts, challenge=reg.body["challenge"]))
    await _refused(project, r, "unknown_or_expired_challenge")


async def test_another_users_challenge_is_refused(project: Project) -> None:
    authenticator, _ = await _registered(project)
    other = email()
    other_user = await signed_in_user(project, other)
    await register(project, other_user, SoftAuthenticator(ORIGIN))
    opts = await options(project, {"email": other})
    # the first user's passkey answers a challenge issued for the other user
    r = await login_verify(project, authenticator.get(opts, credential=authenticator.credentials[0]))
    await _refused(project, r, "unknown_or_expired_challenge")
    # and a registration challenge is its user's only
    reg = await register_options(project.api, other_user)
    me = await signed_in_user(project)
    r = await register_verify(project.api, me, SoftAuthenticator(ORIGIN).create(reg.body))
    await _refused(project, r, "unknown_or_expired_challenge")


async def test_a_cloned_counter_is_refused(project: Project) -> None:
    authenticator, _ = await _registered(project)
    for _ in range(2):
        assert (await login_verify(project, authenticator.get(await options(project)))).status == 200
    r = await login_verify(project, authenticator.get(await options(project), sign_count=1))
    await _refused(project, r, "verification_failed")


async def test_a_deleted_credential_fails(service: Api, project: Project, db: asyncpg.Pool) -> None:
    await configure(project)
    user = await signed_in_user(project)
    authenticator = SoftAuthenticator(ORIGIN)
    passkey = await register(project, user, authenticator)
    r = await session_call(service, "DELETE", f"/v1/sessions/me/passkeys/{passkey['id']}",
                           user.access_token)
    assert r.status == 200 and r.body["id"] == passkey["id"]
    assert [e["target_id"] for e in await events(db, project.id, "passkey.deleted")] == [passkey["id"]]
    await _refused(project, await login_verify(project, authenticator.get(await options(project))),
                   "verification_failed")
    r = await session_call(service, "DELETE", f"/v1/sessions/me/passkeys/{passkey['id']}",
                           user.access_token)
    assert_error(r, 404, "not_found")


async def test_deleting_by_api_key(project: Project) -> None:
    await configure(project)
    user = await signed_in_user(project)
    authenticator = SoftAuthenticator(ORIGIN)
    passkey = await register(project, user, authenticator)
    r = await project.api.delete(f"/v1/users/{user.user_id}/passkeys/{passkey['id']}")
    assert r.status == 200 and r.body["id"] == passkey["id"]
    assert (await project.api.get(f"/v1/users/{user.user_id}/passkeys")).body["data"] == []
    await _refused(project, await login_verify(project, authenticator.get(await options(project))),
                   "verification_failed")


async def test_another_projects_credential_fails(
        project: Project, new_project: Callable[[str], Awaitable[Project]]) -> None:
    authenticator, user_id = await _registered(project)
    other = await new_project("other")
    await configure(other)
    r = await login_verify(other, authenticator.get(await options(other)))
    await _refused(other, r, "verification_failed")
    assert_error(await other.api.get(f"/v1/users/{user_id}/passkeys"), 404, "user_not_found")


async def test_a_project_without_webauthn_refuses_options(project: Project) -> None:
    r = await login_options(project)
    assert_invalid_field(r, "webauthn")
    user = await signed_in_user(project)
    assert_invalid_field(await register_options(project.api, user), "webauthn")
    assert (await project.api.get("/v1/projects/me")).body["webauthn"] is None


async def test_the_project_shows_its_relying_party(project: Project) -> None:
    await configure(project, origins=["http://localhost:8443", "https://app.localhost/"])
    r = await project.api.get("/v1/projects/me")
    assert r.body["webauthn"] == {"rp_id": RP_ID, "rp_name": "Test app",
                                  "origins": ["http://localhost:8443", "https://app.localhost"],
                                  "user_verification": "preferred"}
    r = await project.api.request("PATCH", "/v1/projects/me", json={"webauthn": {
        "rp_id": "example.com", "rp_name": "x", "origins": ["https://example.org"]}})
    assert_invalid_field(r, "webauthn.origins")
    for origin in ("http://example.com", "https://Example.com", "https://example.com/path"):
        r = await project.api.request("PATCH", "/v1/projects/me", json={"webauthn": {
            "rp_id": "example.com", "rp_name": "x", "origins": [origin]}})
        assert_invalid_field(r, "webauthn.origins.0")


async def test_null_turns_passkeys_off(project: Project) -> None:
    """Before: ``{"webauthn": null}`` answered 200 and changed nothing (review of issue 11)."""
    await configure(project)
    r = await project.api.request("PATCH", "/v1/projects/me", json={"webauthn": None})
    assert r.status == 200, r.body
    assert (await project.api.get("/v1/projects/me")).body["webauthn"] is None
    assert_invalid_field(await login_options(project), "webauthn")


async def test_registration_refusals(project: Project) -> None:
    await configure(project)
    user = await signed_in_user(project)
    authenticator = SoftAuthenticator(ORIGIN)
    reg = (await register_options(project.api, user)).body
    r = await register_verify(project.api, user, authenticator.create(reg, origin="https://evil.example"))
    await _refused(project, r, "verification_failed")
    r = await register_verify(project.api, user, authenticator.create(reg))
    await _refused(project, r, "unknown_or_expired_challenge")  # spent by the failed verify
    passkey = await register(project, user, authenticator)
    reg = (await register_options(project.api, user)).body
    assert [c["id"] for c in reg["excludeCredentials"]] == [passkey["credential_id"]]
    r = await session_call(project.api, "POST", "/v1/auth/passkey/register/options", None, json={})
    assert_error(r, 401, "no_session")


async def test_two_verifies_of_one_challenge_at_once_sign_in_once(project: Project) -> None:
    authenticator, _ = await _registered(project)
    assertion = authenticator.get(await options(project))
    answers = await asyncio.gather(*(login_verify(project, assertion) for _ in range(4)))
    assert sorted(r.status for r in answers) == [200, 400, 400, 400], [r.body for r in answers]
    for r in answers:
        if r.status == 400:
            assert r.body["error"]["code"] in ("unknown_or_expired_challenge", "verification_failed")
            _no_cookie(r)


async def test_an_expired_challenge_records_the_failed_attempt(
        project: Project, db: asyncpg.Pool) -> None:
    authenticator, _ = await _registered(project)
    opts = await options(project)
    await db.execute("UPDATE webauthn_challenges SET expires_at = now() WHERE challenge_hash = $1",
                     hashlib.sha256(unb64url(opts["challenge"])).digest())
    await _refused(project, await login_verify(project, authenticator.get(opts)),
                   "unknown_or_expired_challenge")
    failure = (await events(db, project.id, "auth.signin_attempt"))[-1]
    assert failure["metadata"]["outcome"] == "failure"
    assert failure["metadata"]["reason"] == "unknown_or_expired_challenge"
    assert await db.fetchval("SELECT count(*) FROM webauthn_challenges WHERE challenge_hash = $1",
                             hashlib.sha256(unb64url(opts["challenge"])).digest()) == 0


async def test_setting_the_relying_party_is_audited(project: Project, db: asyncpg.Pool) -> None:
    await configure(project)
    await configure(project)  # unchanged: no second event
    await configure(project, user_verification="required")
    changes = [e["metadata"]["changes"]["webauthn"]
               for e in await events(db, project.id, "project.updated")]
    assert [c["from"] and c["from"]["user_verification"] for c in changes] == [None, "preferred"]
    assert [c["to"]["user_verification"] for c in changes] == ["preferred", "required"]


async def test_registration_without_user_verification_when_required(project: Project) -> None:
    await configure(project, user_verification="required")
    user = await signed_in_user(project)
    reg = (await register_options(project.api, user)).body
    assert reg["authenticatorSelection"]["userVerification"] == "required"
    r = await register_verify(project.api, user, SoftAuthenticator(ORIGIN).create(reg, uv=False))
    await _refused(project, r, "verification_failed")


async def test_the_page_runs_only_its_own_script(service: Api, project: Project) -> None:
    r = await service.get(f"/v1/auth/passkey/page?project_id={project.id}", key=None)
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    csp = r.headers["Content-Security-Policy"]
    nonce = csp.split("script-src 'nonce-")[1].split("'")[0]
    page = r.raw.decode()
    assert f'<script nonce="{nonce}">' in page and 'autocomplete="username webauthn"' in page
    assert "connect-src 'self'" in csp and r.headers["Cache-Control"] == "no-store"
