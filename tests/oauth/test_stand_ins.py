"""GitHub and Microsoft sign-in against small aiohttp stand-ins (tests/oauth/peers.py), which
have no offline peer: GitHub issues no ID token (the e-mail comes from ``/user/emails``), and
Microsoft's multi-tenant issuer is a ``{tenantid}`` template filled from the token's ``tid``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.identity import create_user, email
from tests.fixtures.service import Api, assert_error, bootstrap_project, combined_app, serving
from tests.oauth.helpers import configure, sets_cookie, sign_in
from tests.oauth.peers import GitHubStandIn, MicrosoftStandIn, stand_in


@pytest.fixture
def prefix(settings_factory: Callable[..., Settings]) -> str:
    return settings_factory().public_base_url + "/v1/auth/oauth/"


@pytest_asyncio.fixture
async def github() -> AsyncIterator[GitHubStandIn]:
    peer = GitHubStandIn()
    async with stand_in(peer):
        yield peer


@pytest_asyncio.fixture
async def microsoft() -> AsyncIterator[MicrosoftStandIn]:
    peer = MicrosoftStandIn()
    async with stand_in(peer):
        yield peer


@pytest_asyncio.fixture
async def api(settings_factory: Callable[..., Settings], http: ClientSession,
              github: GitHubStandIn, microsoft: MicrosoftStandIn) -> AsyncIterator[Api]:
    """The service with GitHub's and Microsoft's endpoints pointed at the stand-ins."""
    settings = settings_factory(
        oauth_github_base_url=github.base_url, oauth_github_api_url=github.base_url + "/api",
        oauth_microsoft_issuer=microsoft.base_url + "/common/v2.0")
    async with serving(http, combined_app(settings)) as served:
        yield served


def _github_user(address: str, *, verified: bool = True) -> dict[str, object]:
    return {"id": 583231, "login": "octocat", "emails": [
        {"email": "other@example.com", "primary": False, "verified": True},
        {"email": address, "primary": True, "verified": verified}]}


async def test_github_signs_in_with_the_primary_verified_email(
        browser: ClientSession, api: Api, github: GitHubStandIn, prefix: str) -> None:
    project = await bootstrap_project(api, "github")
    r = await configure(project, "github", client_id=github.client_id,
                        client_secret=github.client_secret)
    assert r.status == 201 and r.body["scopes"] == ["read:user", "user:email"], r.body
    address = email()
    existing = await create_user(project.api, address)
    github.next_user = _github_user(address)
    done, _ = await sign_in(browser, api, project, "github", account=None, callback_prefix=prefix)
    assert done.status == 200, done.body
    assert done.body["user"]["id"] == existing["id"]  # linked: GitHub verified the address
    again, _ = await sign_in(browser, api, project, "github", account=None, callback_prefix=prefix)
    assert again.body["user"]["id"] == existing["id"]


async def test_github_unverified_primary_email_of_an_existing_user_conflicts(
        browser: ClientSession, api: Api, github: GitHubStandIn, prefix: str) -> None:
    project = await bootstrap_project(api, "github")
    await configure(project, "github", client_id=github.client_id,
                    client_secret=github.client_secret)
    address = email()
    await create_user(project.api, address)
    github.next_user = _github_user(address, verified=False)
    done, _ = await sign_in(browser, api, project, "github", account=None, callback_prefix=prefix)
    assert_error(done, 409, "identity_conflict")
    assert not sets_cookie(done)


async def test_an_unverified_address_cannot_pre_hijack_its_owners_account(
        browser: ClientSession, api: Api, github: GitHubStandIn, prefix: str) -> None:
    """The review's reproduction (issue 11): GitHub account A claims the victim's address
    unverified; before, that made a user with it, the victim's verified sign-in later joined
    that user, and A signed into the victim's account. Now A's sign-in makes no user, and the
    victim's own sign-in makes a user A has no identity in."""
    project = await bootstrap_project(api, "github")
    await configure(project, "github", client_id=github.client_id,
                    client_secret=github.client_secret)
    victim = email()
    github.next_user = {"id": 1001, "login": "attacker", "emails": [
        {"email": victim, "primary": True, "verified": False}]}
    attempt, _ = await sign_in(browser, api, project, "github", account=None,
                               callback_prefix=prefix)
    assert_error(attempt, 400, "missing_email")
    browser.cookie_jar.clear()
    github.next_user = {"id": 2002, "login": "victim", "emails": [
        {"email": victim, "primary": True, "verified": True}]}
    owner, _ = await sign_in(browser, api, project, "github", account=None, callback_prefix=prefix)
    assert owner.status == 200, owner.body
    browser.cookie_jar.clear()
    github.next_user = {"id": 1001, "login": "attacker", "emails": [
        {"email": email(), "primary": True, "verified": True}]}
    again, _ = await sign_in(browser, api, project, "github", account=None, callback_prefix=prefix)
    assert again.status == 200, again.body
    assert again.body["user"]["id"] != owner.body["user"]["id"]


async def test_github_without_a_primary_email_is_missing_email(
        browser: ClientSession, api: Api, github: GitHubStandIn, prefix: str) -> None:
    project = await bootstrap_project(api, "github")
    await configure(project, "github", client_id=github.client_id,
                    client_secret=github.client_secret)
    github.next_user = {"id": 1, "login": "ghost", "emails": []}
    done, _ = await sign_in(browser, api, project, "github", account=None, callback_prefix=prefix)
    assert_error(done, 400, "missing_email")


@pytest.mark.parametrize("address", ["nul\u0000@example.com", "a" * 6000 + "@example.com",
                                     "not an address"])
async def test_github_e_mail_that_is_no_address_is_missing_email(
        browser: ClientSession, api: Api, github: GitHubStandIn, prefix: str, address: str) -> None:
    """What a provider says is input like any other. Before: NUL was a 500 and 6,000 characters
    became the user's address (review of issue 11)."""
    project = await bootstrap_project(api, "github")
    await configure(project, "github", client_id=github.client_id,
                    client_secret=github.client_secret)
    github.next_user = _github_user(address)
    done, _ = await sign_in(browser, api, project, "github", account=None, callback_prefix=prefix)
    assert_error(done, 400, "missing_email")
    assert done.body["error"]["details"]["reason"] == "email_unusable"
    assert not sets_cookie(done)


async def test_a_form_post_callback_that_is_not_text_is_invalid_request(api: Api) -> None:
    """Before: bytes outside the form's charset, or an unknown charset, were a 500."""
    project = await bootstrap_project(api, "github")
    path = f"/v1/auth/oauth/github/callback?project_id={project.id}"
    for content_type, body in (("application/x-www-form-urlencoded", b"state=\xff\xfe"),
                               ("application/x-www-form-urlencoded; charset=bogus", b"state=x")):
        r = await api.request("POST", path, data=body, headers={"Content-Type": content_type},
                              key=None)
        assert_error(r, 400, "invalid_request")


async def test_github_wrong_client_secret_is_verification_failed(
        browser: ClientSession, api: Api, github: GitHubStandIn, prefix: str) -> None:
    project = await bootstrap_project(api, "github")
    await configure(project, "github", client_id=github.client_id, client_secret="wrong")
    github.next_user = _github_user(email())
    done, _ = await sign_in(browser, api, project, "github", account=None, callback_prefix=prefix)
    assert_error(done, 400, "verification_failed")
    assert done.body["error"]["details"]["reason"] == "token_request"


async def test_microsoft_tenant_issuer(browser: ClientSession, api: Api,
                                       microsoft: MicrosoftStandIn, prefix: str) -> None:
    project = await bootstrap_project(api, "microsoft")
    r = await configure(project, "microsoft", client_id=microsoft.client_id,
                        client_secret=microsoft.client_secret)
    assert r.status == 201, r.body
    address = email()
    # Microsoft's e-mail claim is not verified by itself: no user from it...
    microsoft.next_user = {"sub": "ms-sub-1", "email": address, "name": "Grace Hopper"}
    refused, _ = await sign_in(browser, api, project, "microsoft", account=None,
                               callback_prefix=prefix)
    assert_error(refused, 400, "missing_email")
    # ...but with the domain-verified flag the tenant's token signs in.
    microsoft.next_user = {**microsoft.next_user, "xms_edov": True}
    done, _ = await sign_in(browser, api, project, "microsoft", account=None,
                            callback_prefix=prefix)
    assert done.status == 200, done.body
    assert done.body["user"]["email"] == address and done.body["user"]["email_verified"] is True
    microsoft.wrong_tenant = True
    refused, _ = await sign_in(browser, api, project, "microsoft", account=None,
                               callback_prefix=prefix)
    assert_error(refused, 400, "verification_failed")
    assert not sets_cookie(refused)


async def test_microsoft_links_only_a_domain_verified_email(
        browser: ClientSession, api: Api, microsoft: MicrosoftStandIn, prefix: str) -> None:
    project = await bootstrap_project(api, "microsoft")
    await configure(project, "microsoft", client_id=microsoft.client_id,
                    client_secret=microsoft.client_secret)
    address = email()
    existing = await create_user(project.api, address)
    microsoft.next_user = {"sub": "ms-sub-2", "email": address}
    refused, _ = await sign_in(browser, api, project, "microsoft", account=None,
                               callback_prefix=prefix)
    assert_error(refused, 409, "identity_conflict")
    microsoft.next_user = {"sub": "ms-sub-2", "email": address, "xms_edov": True}
    done, _ = await sign_in(browser, api, project, "microsoft", account=None,
                            callback_prefix=prefix)
    assert done.status == 200, done.body
    assert done.body["user"]["id"] == existing["id"]
