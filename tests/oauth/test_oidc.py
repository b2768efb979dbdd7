"""OAuth and OpenID Connect sign-in against a real OpenID Provider run locally (``oidc-provider``,
tests/oauth/peers.py), over HTTP: configuration, start, the provider's login, the callback.

Bad ID tokens come from the proxy in front of the provider's token endpoint (``TokenProxy``):
``tamper`` edits a claim without signing again, ``nonce`` and ``aud`` sign again with the
provider's key and a wrong nonce or audience."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator
from urllib.parse import parse_qs, quote, urlencode, urljoin, urlsplit

import asyncpg
import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures import conformance
from tests.fixtures.database import events
from tests.fixtures.identity import create_user, email
from tests.fixtures.service import Api, Project, assert_error, bootstrap_project, combined_app, serving
from tests.oauth.helpers import (
    APP_REDIRECT,
    authorize,
    configure,
    fetch,
    sets_cookie,
    sign_in,
    start,
    state_of,
)
from tests.oauth.peers import CLIENT_SECRET, OidcPeer


@pytest.fixture
def prefix(settings_factory: Callable[..., Settings]) -> str:
    """Where the provider sends the browser back (the service's public base URL)."""
    return settings_factory().public_base_url + "/v1/auth/oauth/"


@pytest_asyncio.fixture
async def corp(project: Project, oidc_peer: OidcPeer) -> Project:
    """``project`` with the local provider configured as the generic provider ``corp``."""
    r = await configure(project, "corp", issuer=oidc_peer.issuer)
    assert r.status == 201, r.body
    return project


@pytest.fixture
def proxy_mode(oidc_peer: OidcPeer) -> Iterator[Callable[[str | None], None]]:
    def set_mode(mode: str | None) -> None:
        oidc_peer.proxy.mode = mode
    yield set_mode
    oidc_peer.proxy.mode = None


# --- configuration ------------------------------------------------------------------------------


async def test_configuration_is_stored_sealed_and_never_answers_the_secret(
        project: Project, oidc_peer: OidcPeer, db: asyncpg.Pool) -> None:
    r = await configure(project, "corp", issuer=oidc_peer.issuer, scopes=["openid", "email"])
    assert r.status == 201, r.body
    assert r.body["provider"] == "corp" and r.body["kind"] == "oidc"
    assert r.body["callback_url"].endswith("/v1/auth/oauth/corp/callback")
    assert r.body["scopes"] == ["openid", "email"] and r.body["redirect_uris"] == [APP_REDIRECT]
    assert CLIENT_SECRET not in r.raw.decode() and "client_secret" not in r.body
    sealed = await db.fetchval("SELECT client_secret_sealed FROM oauth_providers "
                               "WHERE project_id = $1 AND name = 'corp'", project.id)
    assert CLIENT_SECRET.encode() not in sealed
    again = await configure(project, "corp", issuer=oidc_peer.issuer)
    assert again.status == 200 and again.body["scopes"] == ["openid", "email", "profile"]
    got = await project.api.get("/v1/oauth/providers/corp")
    assert got.status == 200 and got.body["client_id"] == r.body["client_id"]
    assert CLIENT_SECRET not in got.raw.decode()
    deleted = await project.api.delete("/v1/oauth/providers/corp")
    assert deleted.status == 200 and deleted.body == {**deleted.body, "deleted": True}
    assert_error(await project.api.get("/v1/oauth/providers/corp"), 404, "unknown_provider")
    assert_error(await project.api.delete("/v1/oauth/providers/corp"), 404, "unknown_provider")
    actions = [e["action"] for e in await events(db, project.id)
               if e["action"].startswith("oauth.provider.")]
    assert actions == ["oauth.provider.configured"] * 2 + ["oauth.provider.deleted"]


@pytest.mark.parametrize(("name", "extra", "field"), [
    ("corp", {}, "issuer"),  # a generic provider needs its issuer
    ("github", {"issuer": "https://github.com"}, "issuer"),
    ("corp", {"issuer": "http://idp.example.com"}, "issuer"),  # http only for loopback hosts
    ("corp", {"issuer": "https://idp.example.com", "redirect_uris": ["http://app.example.com/x"]},
     "redirect_uris.0"),
    ("corp", {"issuer": "https://idp.example.com", "redirect_uris": []}, "redirect_uris"),
])
async def test_configuration_refusals(project: Project, name: str, extra: dict[str, object],
                                      field: str) -> None:
    body = {"client_id": "c", "client_secret": "s", "redirect_uris": [APP_REDIRECT], **extra}
    r = await project.api.request("PUT", f"/v1/oauth/providers/{name}", json=body)
    assert_error(r, 400, "invalid_request")
    assert any(f["field"] == field for f in r.body["error"]["details"]["fields"]), r.body


# --- signing in -------------------------------------------------------------------------------


async def test_generic_provider_signs_a_new_user_in_and_redirects(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer, prefix: str,
        db: asyncpg.Pool) -> None:
    address = email()
    account = await oidc_peer.account(email=address, name="Ada Lovelace")
    r = await start(browser, service, corp, "corp")
    assert r.status == 302 and not r.body
    location = urlsplit(r.headers["Location"])
    q = parse_qs(location.query)
    assert r.headers["Location"].startswith(oidc_peer.issuer)
    assert q["code_challenge_method"] == ["S256"] and len(q["code_challenge"][0]) == 43
    assert q["nonce"] and q["state"] and q["scope"] == ["openid email profile"]
    assert q["redirect_uri"] == [prefix + "corp/callback"]
    cookie = r.headers["Set-Cookie"]
    assert "oauth_browser=" in cookie and "HttpOnly" in cookie and "/v1/auth/oauth/" in cookie
    callback = await authorize(browser, r.headers["Location"], account=account,
                               callback_prefix=prefix)
    done = await fetch(browser, service, callback)
    assert done.status == 302, done.body
    assert done.headers["Location"] == APP_REDIRECT
    assert "service_session=" in done.headers["Set-Cookie"]
    # the code was exchanged with its PKCE verifier
    assert "code_verifier" in oidc_peer.proxy.token_requests[-1]
    user = await db.fetchrow("SELECT * FROM users WHERE project_id = $1", corp.id)
    assert user["email"] == address and user["email_verified"] and user["name"] == "Ada Lovelace"
    signins = await events(db, corp.id, "auth.signin_attempt")
    assert signins[-1]["metadata"]["method"] == "oauth"
    assert signins[-1]["metadata"]["provider"] == "corp"
    assert signins[-1]["metadata"]["outcome"] == "success"
    session = await db.fetchrow("SELECT auth_method FROM sessions WHERE user_id = $1", user["id"])
    assert session["auth_method"] == "oauth"


async def test_json_answer_is_the_sign_in_envelope_and_the_session_works(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    account = await oidc_peer.account(email=email())
    r, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert r.status == 200, r.body
    assert r.body["session"]["auth_method"] == "oauth"
    assert r.body["access_token"] and r.body["refresh_token"].startswith("rt_")
    assert "service_session=" in r.headers["Set-Cookie"]
    me = await service.get("/v1/sessions/me", key=r.body["access_token"])
    assert me.status == 200 and me.body["user"]["id"] == r.body["user"]["id"]


async def test_a_data_subject_deletion_removes_the_identity_and_its_traces(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer, prefix: str,
        db: asyncpg.Pool) -> None:
    """SPEC.md 4 rule 2 for a user made by an OpenID Connect sign-in: its identity row goes with
    it, nothing in the log or the risk decisions names it or the provider's subject, and the
    same account signing in again is a new user."""
    address = email()
    account = await oidc_peer.account(email=address)
    first, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert first.status == 200, first.body
    user_id = first.body["user"]["id"]
    subject = await db.fetchval("SELECT subject FROM oauth_identities WHERE user_id = $1", user_id)
    assert subject
    made = await corp.api.post("/v1/compliance/dsr", {"request_type": "deletion", "user_email": address})
    done = await corp.api.post(f"/v1/compliance/dsr/{made.body['dsr_id']}/fulfill", {})
    assert done.status == 200, done.body
    assert (done.body["deleted"]["oauth_identities"], done.body["deleted"]["users"]) == (1, 1)
    assert await db.fetchval("SELECT count(*) FROM oauth_identities WHERE subject = $1", subject) == 0
    needles = [f"%{user_id}%", f"%{address}%", f"%{subject}%"]
    for table in ("audit_events", "risk_decisions"):
        named = await db.fetchval(f"SELECT count(*) FROM {table} t WHERE project_id = $1 "
                                  "AND t::text ILIKE ANY($2::text[])", corp.id, needles)
        assert named == 0, table
    again, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert again.status == 200 and again.body["user"]["id"] != user_id


async def test_returning_identity_signs_in_to_the_same_user(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    account = await oidc_peer.account(email=email())
    first, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    second, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert first.status == second.status == 200
    assert first.body["user"]["id"] == second.body["user"]["id"]
    assert first.body["session"]["id"] != second.body["session"]["id"]


async def test_a_deployment_refuses_issuers_on_its_own_machine(
        settings_factory: Callable[..., Settings], http: ClientSession) -> None:
    """Loopback issuers are for development, the service itself on localhost (as in these
    tests). Deployed (a public base URL), a project key naming this machine or a link-local
    address (cloud metadata) would make the service call its own ports (review of issue 11)."""
    settings = settings_factory(base_url="https://auth.example.com")
    async with serving(http, combined_app(settings)) as api:
        project = await bootstrap_project(api, "deployed")
        for issuer in ("http://127.0.0.1:5432", "https://localhost", "https://[::1]:6379",
                       "https://169.254.169.254"):
            r = await configure(project, "corp", issuer=issuer)
            assert_error(r, 400, "invalid_request")
            assert r.body["error"]["details"]["fields"][0]["field"] == "issuer", r.body
        assert (await configure(project, "corp", issuer="https://idp.example.com")).status == 201


async def test_an_identity_of_another_issuer_is_not_this_ones(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer, prefix: str,
        db: asyncpg.Pool) -> None:
    """A subject is unique only at its issuer (OIDC Core 2). Before, identities were keyed by
    the provider's name alone: one linked while ``corp`` named another issuer signed the same
    ``sub`` of the new issuer into the old user (review of issue 11). The identity below was
    linked, to another user, under an issuer ``corp`` named before."""
    address = email()
    account = await oidc_peer.account(email=address)
    first, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert first.status == 200, first.body
    other = await create_user(corp.api, email())
    await db.execute("UPDATE oauth_identities SET issuer = 'https://old-idp.example', user_id = $2"
                     " WHERE project_id = $1 AND provider = 'corp'", corp.id, other["id"])
    again, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert again.status == 200, again.body
    assert again.body["user"]["id"] == first.body["user"]["id"] != other["id"]


async def test_verified_email_links_an_existing_user(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    address = email()
    user = await create_user(corp.api, address.upper())
    account = await oidc_peer.account(email=address, email_verified=True)
    r, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert r.status == 200, r.body
    assert r.body["user"]["id"] == user["id"] and r.body["user"]["email_verified"] is True


async def test_unverified_email_of_an_existing_user_is_a_conflict_never_a_link(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer, prefix: str,
        db: asyncpg.Pool) -> None:
    address = email()
    await create_user(corp.api, address)
    account = await oidc_peer.account(email=address, email_verified=False)
    r, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert_error(r, 409, "identity_conflict")
    assert not sets_cookie(r)
    assert await db.fetchval("SELECT count(*) FROM oauth_identities WHERE project_id = $1",
                             corp.id) == 0
    failed = (await events(db, corp.id, "auth.signin_attempt"))[-1]["metadata"]
    assert failed["outcome"] == "failure" and failed["reason"] == "identity_conflict"
    assert failed["method"] == "oauth" and failed["provider"] == "corp"


async def test_unverified_email_of_nobody_makes_no_user(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    """Before: a user was created with the unverified address, which its owner's later sign-in
    would have joined (review of issue 11; tests/oauth/test_stand_ins.py shows the takeover)."""
    address = email()
    account = await oidc_peer.account(email=address, email_verified=False)
    r, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert_error(r, 400, "missing_email")
    assert r.body["error"]["details"]["reason"] == "email_not_verified"
    assert not sets_cookie(r)
    listed = await corp.api.get(f"/v1/users?email={quote(address)}")
    assert listed.status == 200 and listed.body["data"] == [], listed.body


async def test_provider_without_email_is_missing_email(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    account = await oidc_peer.account(email=None)
    r, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert_error(r, 400, "missing_email")
    assert not sets_cookie(r)


@pytest.mark.parametrize("mode", ["tamper", "nonce", "aud"])
async def test_id_token_failing_validation_is_verification_failed(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer, prefix: str,
        proxy_mode: Callable[[str | None], None], mode: str) -> None:
    account = await oidc_peer.account(email=email())
    proxy_mode(mode)
    r, _ = await sign_in(browser, service, corp, "corp", account=account, callback_prefix=prefix)
    assert_error(r, 400, "verification_failed")
    assert r.body["error"]["details"]["reason"] == "id_token"
    assert not sets_cookie(r)


async def test_replayed_state_is_refused(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    account = await oidc_peer.account(email=email())
    r, callback = await sign_in(browser, service, corp, "corp", account=account,
                                callback_prefix=prefix)
    assert r.status == 200
    again = await fetch(browser, service, callback, headers={"Accept": "application/json"})
    assert_error(again, 400, "invalid_request")
    assert not sets_cookie(again)


async def test_state_of_another_browser_is_refused(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    account = await oidc_peer.account(email=email())
    r = await start(browser, service, corp, "corp")
    callback = await authorize(browser, r.headers["Location"], account=account,
                               callback_prefix=prefix)
    async with ClientSession() as other:  # no oauth_browser cookie
        refused = await fetch(other, service, callback)
    assert_error(refused, 400, "invalid_request")
    assert not sets_cookie(refused)
    # the state was used up by the attempt: the right browser cannot use it either
    assert_error(await fetch(browser, service, callback), 400, "invalid_request")


async def test_provider_error_is_verification_failed(
        browser: ClientSession, service: Api, corp: Project) -> None:
    r = await start(browser, service, corp, "corp")
    state = state_of(r.headers["Location"])
    refused = await fetch(browser, service,
                          f"/v1/auth/oauth/corp/callback?error=access_denied&state={state}")
    assert_error(refused, 400, "verification_failed")
    assert refused.body["error"]["details"]["provider_error"] == "access_denied"
    assert not sets_cookie(refused)


async def test_unknown_provider(browser: ClientSession, service: Api, corp: Project,
                                oidc_peer: OidcPeer, prefix: str) -> None:
    assert_error(await start(browser, service, corp, "nobody"), 404, "unknown_provider")
    # configured at start, deleted before the callback: the state's project lacks it
    account = await oidc_peer.account(email=email())
    r = await start(browser, service, corp, "corp")
    callback = await authorize(browser, r.headers["Location"], account=account,
                               callback_prefix=prefix)
    assert (await corp.api.delete("/v1/oauth/providers/corp")).status == 200
    refused = await fetch(browser, service, callback)
    assert_error(refused, 404, "unknown_provider")
    assert not sets_cookie(refused)


async def test_redirect_uri_must_be_allow_listed(browser: ClientSession, service: Api,
                                                  corp: Project) -> None:
    r = await start(browser, service, corp, "corp", redirect_uri="https://evil.example.com/")
    assert_error(r, 400, "invalid_request")
    assert r.body["error"]["details"]["fields"][0]["field"] == "redirect_uri"
    assert not sets_cookie(r)


async def test_unknown_state_and_missing_state(browser: ClientSession, service: Api) -> None:
    for query in ("", "?state=nope&code=x"):
        r = await fetch(browser, service, f"/v1/auth/oauth/corp/callback{query}")
        assert_error(r, 400, "invalid_request")
        assert not sets_cookie(r)


# --- Google's shape ---------------------------------------------------------------------------


@pytest_asyncio.fixture
async def google_service(settings_factory: Callable[..., Settings], http: ClientSession,
                         oidc_peer: OidcPeer) -> AsyncIterator[Api]:
    """The service with Google's issuer pointed at the local provider."""
    settings = settings_factory(oauth_google_issuer=oidc_peer.issuer)
    async with serving(http, combined_app(settings)) as api:
        yield api


async def test_google_shaped_provider(browser: ClientSession, google_service: Api,
                                      oidc_peer: OidcPeer, prefix: str) -> None:
    project = await bootstrap_project(google_service, "google")
    r = await configure(project, "google")
    assert r.status == 201 and r.body["kind"] == "google" and r.body["issuer"] is None
    address = email()
    account = await oidc_peer.account(email=address)
    done, _ = await sign_in(browser, google_service, project, "google", account=account,
                            callback_prefix=prefix)
    assert done.status == 200, done.body
    assert done.body["user"]["email"] == address


async def test_authorization_response_naming_another_issuer_is_refused(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    """RFC 9207: the ``iss`` of the authorization response must be the provider's (mix-up)."""
    account = await oidc_peer.account(email=email())
    r = await start(browser, service, corp, "corp")
    callback = await authorize(browser, r.headers["Location"], account=account,
                               callback_prefix=prefix)
    path, _, query = callback.partition("?")
    params = [p for p in query.split("&") if not p.startswith("iss=")]
    tampered = f"{path}?{'&'.join([*params, 'iss=https%3A%2F%2Fidp.evil.example'])}"
    refused = await fetch(browser, service, tampered, headers={"Accept": "application/json"})
    assert_error(refused, 400, "verification_failed")
    assert refused.body["error"]["details"]["reason"] == "issuer"
    assert not sets_cookie(refused)


async def test_expired_state_is_refused(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer, prefix: str,
        db: asyncpg.Pool) -> None:
    """A state past its 10 minutes (time moved in the database, not slept) is refused."""
    account = await oidc_peer.account(email=email())
    r = await start(browser, service, corp, "corp")
    callback = await authorize(browser, r.headers["Location"], account=account,
                               callback_prefix=prefix)
    moved = await db.execute("UPDATE oauth_states SET expires_at = now() - interval '1 second' "
                             "WHERE project_id = $1", corp.id)
    assert moved == "UPDATE 1"
    refused = await fetch(browser, service, callback)
    assert_error(refused, 400, "invalid_request")
    assert refused.body["error"]["details"]["fields"] == [{"field": "state", "message": "expired"}]
    assert not sets_cookie(refused)


async def test_state_of_another_provider_is_refused(
        browser: ClientSession, service: Api, corp: Project, oidc_peer: OidcPeer,
        prefix: str) -> None:
    assert (await configure(corp, "acme", issuer=oidc_peer.issuer)).status == 201
    account = await oidc_peer.account(email=email())
    r = await start(browser, service, corp, "corp")
    callback = await authorize(browser, r.headers["Location"], account=account,
                               callback_prefix=prefix)
    refused = await fetch(browser, service, callback.replace("/corp/", "/acme/"))
    assert_error(refused, 400, "invalid_request")
    assert not sets_cookie(refused)


# --- Apple's shape: the answer comes back by form_post ----------------------------------------


@pytest_asyncio.fixture
async def apple_service(settings_factory: Callable[..., Settings], http: ClientSession,
                        oidc_peer: OidcPeer) -> AsyncIterator[Api]:
    """The service with Apple's issuer pointed at the local provider."""
    settings = settings_factory(oauth_apple_issuer=oidc_peer.issuer)
    async with serving(http, combined_app(settings)) as api:
        yield api


async def test_apple_shaped_provider_answers_by_form_post(
        browser: ClientSession, apple_service: Api, oidc_peer: OidcPeer, prefix: str) -> None:
    """Apple asks for ``response_mode=form_post``: the browser comes back by a cross-site POST,
    so the binding cookie is ``SameSite=None; Secure``; oidc-provider answers the same mode with
    its auto-submitting form, which the test submits."""
    project = await bootstrap_project(apple_service, "apple")
    # oidc-provider knows no "name" scope: the test asks for Apple's others
    r = await configure(project, "apple", scopes=["openid", "email"])
    assert r.status == 201 and r.body["kind"] == "apple", r.body
    address = email()
    account = await oidc_peer.account(email=address)
    started = await start(browser, apple_service, project, "apple")
    assert started.status == 302
    assert parse_qs(urlsplit(started.headers["Location"]).query)["response_mode"] == ["form_post"]
    cookie = started.headers["Set-Cookie"]
    assert "SameSite=None" in cookie and "Secure" in cookie
    binding = cookie.split("oauth_browser=", 1)[1].split(";", 1)[0]
    url = started.headers["Location"]
    for _ in range(10):
        if "/interaction/" in url:
            url += "?" + urlencode({"account": account})
        async with browser.get(url, allow_redirects=False) as step:
            if step.status == 200:
                page = await step.text()
                break
            url = urljoin(url, step.headers["Location"])
    action = re.search(r'action="([^"]+)"', page)
    assert action is not None and action.group(1) == prefix + "apple/callback", page
    fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', page))
    assert {"code", "state"} <= fields.keys(), page
    path = "/v1/auth/oauth/apple/callback"
    async with ClientSession() as other, other.post(
            apple_service.base_url + path, data=fields,
            headers={"Cookie": f"oauth_browser={binding}", "Accept": "application/json"}) as done:
        raw = await done.read()
        problems = conformance.document().problems("POST", path, done.status, done.content_type,
                                                   done.headers, raw)
        assert not problems, problems
        assert done.status == 200, raw
        assert "service_session=" in done.headers["Set-Cookie"]
    assert orjson.loads(raw)["user"]["email"] == address
    # without the cookie (another browser), the same form is refused
    async with ClientSession() as other, other.post(apple_service.base_url + path,
                                                    data=fields) as refused:
        assert refused.status == 400 and not refused.headers.getall("Set-Cookie", [])


# --- the risk engine --------------------------------------------------------------------------


@pytest_asyncio.fixture
async def guarded_service(settings_factory: Callable[..., Settings],
                          http: ClientSession) -> AsyncIterator[Api]:
    """The service behind a trusted proxy on loopback, with 203.0.113.0/24 a known-bad network."""
    settings = settings_factory(trusted_proxies="127.0.0.1/32",
                                risk_blocked_networks="203.0.113.0/24")
    async with serving(http, combined_app(settings)) as api:
        yield api


async def test_a_sign_in_from_a_known_bad_network_is_blocked_and_recorded_once(
        browser: ClientSession, guarded_service: Api, oidc_peer: OidcPeer, prefix: str,
        db: asyncpg.Pool) -> None:
    """The callback is scored like every primary sign-in: from a blocked network it answers 403
    ``blocked_by_risk_policy``, sets no session cookie and starts no session; the attempt is
    recorded once, as blocked (not again as a failure), with its decision."""
    project = await bootstrap_project(guarded_service, "guarded")
    assert (await configure(project, "corp", issuer=oidc_peer.issuer)).status == 201
    account = await oidc_peer.account(email=email())
    r = await start(browser, guarded_service, project, "corp")
    callback = await authorize(browser, r.headers["Location"], account=account,
                               callback_prefix=prefix)
    done = await fetch(browser, guarded_service, callback,
                       headers={"Accept": "application/json", "X-Forwarded-For": "203.0.113.40"})
    assert_error(done, 403, "blocked_by_risk_policy")
    assert not sets_cookie(done)
    decision_id = done.body["error"]["details"]["decision_id"]
    decision = (await project.api.get(f"/v1/risk/decisions/{decision_id}")).body
    assert (decision["method"], decision["decision"], decision["inputs"]["ip"]) == (
        "oauth", "block", "203.0.113.40")
    assert decision["reasons"] == ["203.0.113.40 is in the blocked network 203.0.113.0/24"]
    [attempt] = await events(db, project.id, "auth.signin_attempt")
    assert (attempt["metadata"]["outcome"], attempt["metadata"]["decision_id"]) == ("blocked", decision_id)
    assert attempt["metadata"]["provider"] == "corp"
    [blocked] = await events(db, project.id, "auth.blocked_by_risk_policy")
    assert blocked["metadata"]["decision_id"] == decision_id
    assert await db.fetchval("SELECT count(*) FROM sessions WHERE project_id = $1", project.id) == 0
