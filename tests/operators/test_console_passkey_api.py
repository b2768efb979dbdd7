"""The console's usernameless passkey sign-in over HTTP, with the software authenticator of
tests/fixtures/webauthn.py choosing the credential (issue 23): ``POST /console/sign-in/passkey``
answers options for any console passkey, stored for no project; ``POST /console/sign-in/passkey
/verify`` finds the operator project by the credential's user handle, so one address that is an
operator of two tenants signs in to the tenant whose passkey it picks; the console's challenges
and the operator projects' own do not stand in for each other; a passkey that is no operator's
is refused, its challenge spent; a challenged sign-in names the project of its step-up.

Each operator signs in by a link first (over HTTP: the mailed link redeemed, the tokens handed
to ``POST /console/session``) and adds a passkey with the console's own calls, its session's
cookies and CSRF token sent as a page sends them. Requests go through a client session without
a cookie jar: every cookie is the test's to send.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest_asyncio
from aiohttp import ClientSession, ClientTimeout, DummyCookieJar
from cryptography.hazmat.primitives.asymmetric import ec

from tests.fixtures.service import Api, assert_error
from tests.fixtures.webauthn import Credential, SoftAuthenticator, b64url, unb64url
from tests.operators.helpers import (
    FIREFOX_WINDOWS,
    ConsoleService,
    challenge_new_devices,
    mailed_link,
    tenant,
)

OPTIONS = "/console/sign-in/passkey"
VERIFY = "/console/sign-in/passkey/verify"


@dataclass
class ConsoleSignIn:
    """An operator's console session: the cookies a browser would hold, and the CSRF token."""

    project_id: str
    user_id: str
    tenant_id: str
    cookie: str
    csrf: str

    def headers(self) -> dict[str, str]:
        return {"Cookie": self.cookie, "X-CSRF-Token": self.csrf}


@pytest_asyncio.fixture
async def api(console: ConsoleService) -> AsyncIterator[Api]:
    """The console service, through a client that keeps no cookies."""
    async with ClientSession(timeout=ClientTimeout(total=60), cookie_jar=DummyCookieJar()) as s:
        yield Api(s, console.base_url)


async def _open(api: Api, grant: dict[str, Any]) -> dict[str, Any]:
    r = await api.post("/console/session", {"access_token": grant["access_token"],
                                            "refresh_token": grant["refresh_token"]}, key=None)
    assert r.status == 200, r.body
    return dict(r.body)


async def _signed_in_by_links(console: ConsoleService, api: Api, address: str,
                              tenants: int) -> dict[str, ConsoleSignIn]:
    """Ask the console for sign-in links to ``address`` (one per tenant), redeem each and open
    its console session: by operator project."""
    r = await api.post("/console/sign-in", {"email": address}, key=None)
    assert r.status == 200, r.body
    out = {}
    for count in range(1, tenants + 1):
        link = await mailed_link(console, address, count=count)
        project_id = parse_qs(urlsplit(link).query)["project_id"][0]
        r = await api.post(f"/v1/auth/magic-link/verify?project_id={project_id}",
                           {"token": link.split("#token=", 1)[1]}, key=None)
        assert r.status == 200, r.body
        opened = await _open(api, r.body)
        out[project_id] = ConsoleSignIn(
            project_id, r.body["user"]["id"], opened["operator"]["tenant_id"],
            f"authio_console={r.body['access_token']}; "
            f"authio_console_refresh={r.body['refresh_token']}", opened["csrf_token"])
    assert len(out) == tenants, out
    return out


async def _add_passkey(api: Api, who: ConsoleSignIn, authenticator: SoftAuthenticator,
                       name: str) -> tuple[dict[str, Any], Credential]:
    r = await api.post("/console/passkeys/options", {"name": name}, key=None,
                       headers=who.headers())
    assert r.status == 200, r.body
    options = r.body
    created = authenticator.create(options)
    r = await api.post("/console/passkeys", created, key=None, headers=who.headers())
    assert r.status == 201, r.body
    return options, authenticator.credentials[-1]


async def _challenge_row(console: ConsoleService, options: dict[str, Any]) -> Any:
    digest = hashlib.sha256(unb64url(options["challenge"])).digest()
    return await console.db.fetchrow(
        "SELECT project_id, ceremony, user_id, user_verification FROM webauthn_challenges "
        "WHERE challenge_hash = $1", digest)


async def test_one_address_operator_of_two_tenants_signs_in_where_its_passkey_says(
        console: ConsoleService, api: Api) -> None:
    acme = await tenant(console, "acme")
    globex = await tenant(console, "globex")
    r = await globex.project.api.post("/v1/operators", {"email": acme.operator_email})
    assert r.status == 201, r.body
    operator_ids = {acme.project.tenant_id: acme.operator_id, globex.project.tenant_id: r.body["id"]}
    sessions = await _signed_in_by_links(console, api, acme.operator_email, tenants=2)
    by_tenant = {s.tenant_id: s for s in sessions.values()}
    authenticator = SoftAuthenticator(console.base_url)
    for tenant_id, name in ((acme.project.tenant_id, "Acme"), (globex.project.tenant_id, "Globex")):
        options, _ = await _add_passkey(api, by_tenant[tenant_id], authenticator, name)
        # Discoverable, and the account names the tenant: the chooser shows both apart.
        assert options["authenticatorSelection"]["residentKey"] == "required"
        assert options["user"]["displayName"] == f"{acme.operator_email} ({name} operators)"
        assert unb64url(options["user"]["id"]).decode() == by_tenant[tenant_id].user_id
    acme_key, globex_key = authenticator.credentials

    for credential, expected in ((globex_key, globex), (acme_key, acme)):
        r = await api.post(OPTIONS, key=None)
        assert r.status == 200, r.body
        options = r.body
        assert options["rpId"] == "localhost"
        assert options["userVerification"] == "required"
        assert not options.get("allowCredentials"), options
        row = await _challenge_row(console, options)
        assert (row["project_id"], row["ceremony"], row["user_id"], row["user_verification"]) \
            == (None, "authentication", None, "required")
        assertion = authenticator.get(options, credential=credential)
        r = await api.post(VERIFY, assertion, key=None)
        assert r.status == 200, r.body
        assert "Set-Cookie" not in r.headers  # the page hands the tokens to the console
        assert r.body["user"]["email"] == acme.operator_email
        opened = await _open(api, r.body)
        assert opened["operator"]["tenant_id"] == expected.project.tenant_id
        assert opened["operator"]["id"] == operator_ids[expected.project.tenant_id]
        assert await _challenge_row(console, options) is None  # spent
        # Used once.
        r = await api.post(VERIFY, assertion, key=None)
        assert_error(r, 400, "unknown_or_expired_challenge")

    # Each sign-in is the operator project's own passkey sign-in.
    for s in sessions.values():
        methods = await console.db.fetch(
            """SELECT metadata->>'method' AS method FROM audit_events
               WHERE project_id = $1 AND action = 'auth.signin_attempt'
                 AND metadata->>'outcome' = 'success' ORDER BY created_at""", s.project_id)
        assert [m["method"] for m in methods] == ["magic_link", "passkey"]


async def test_challenges_of_the_console_and_of_a_project_do_not_stand_in_for_each_other(
        console: ConsoleService, api: Api) -> None:
    acme = await tenant(console)
    [who] = (await _signed_in_by_links(console, api, acme.operator_email, tenants=1)).values()
    authenticator = SoftAuthenticator(console.base_url)
    await _add_passkey(api, who, authenticator, "Laptop")

    # The console's challenge at the operator project's own passkey login: refused, spent.
    r = await api.post(OPTIONS, key=None)
    assert r.status == 200, r.body
    console_options = r.body
    r = await api.post(f"/v1/auth/passkey/login/verify?project_id={who.project_id}",
                       authenticator.get(console_options), key=None)
    assert_error(r, 400, "unknown_or_expired_challenge")
    assert await _challenge_row(console, console_options) is None
    r = await api.post(VERIFY, authenticator.get(console_options), key=None)
    assert_error(r, 400, "unknown_or_expired_challenge")

    # The operator project's challenge at the console's verify: refused, spent.
    r = await api.post(f"/v1/auth/passkey/login/options?project_id={who.project_id}", {},
                       key=None)
    assert r.status == 200, r.body
    project_options = r.body
    r = await api.post(VERIFY, authenticator.get(project_options), key=None)
    assert_error(r, 400, "unknown_or_expired_challenge")
    assert await _challenge_row(console, project_options) is None


async def test_a_passkey_of_no_operator_is_refused_and_its_challenge_spent(
        console: ConsoleService, api: Api) -> None:
    authenticator = SoftAuthenticator(console.base_url)
    for handle in (f"user_{secrets.token_hex(13)}", "not-a-user-id", None):
        r = await api.post(OPTIONS, key=None)
        assert r.status == 200, r.body
        options = r.body
        # A credential of the console's host whose user handle names no operator (or none).
        credential = Credential(secrets.token_bytes(32), "localhost",
                                (handle or "x").encode(), ec.generate_private_key(ec.SECP256R1()))
        r = await api.post(VERIFY, authenticator.get(options, credential=credential,
                                                     user_handle=handle is not None), key=None)
        assert_error(r, 400, "verification_failed")
        assert r.body["error"]["details"] == {"reason": "not_an_operator"}, r.body
        assert await _challenge_row(console, options) is None

    # Without any body, or with a body that is no credential: the envelope.
    r = await api.post(VERIFY, {"id": b64url(b"x")}, key=None)
    assert_error(r, 400, "invalid_request")


async def test_a_challenged_console_passkey_sign_in_names_the_project_of_its_step_up(
        console: ConsoleService, console_db: str, api: Api) -> None:
    acme = await tenant(console)
    [who] = (await _signed_in_by_links(console, api, acme.operator_email, tenants=1)).values()
    authenticator = SoftAuthenticator(console.base_url)
    await _add_passkey(api, who, authenticator, "Laptop")
    await challenge_new_devices(console_db, who.project_id)
    r = await api.post(OPTIONS, key=None)
    assert r.status == 200, r.body
    r = await api.post(VERIFY, authenticator.get(r.body), key=None,
                       headers={"User-Agent": FIREFOX_WINDOWS})
    assert_error(r, 401, "step_up_required")
    details = r.body["error"]["details"]
    assert details["project_id"] == who.project_id
    assert details["methods"] == ["passkey", "magic_link"]
    # The public step-up of that project finishes it, and the console session opens.
    q = f"?project_id={details['project_id']}"
    r = await api.post("/v1/auth/step-up/passkey/options" + q,
                       {"challenge_id": details["challenge_id"]}, key=None)
    assert r.status == 200, r.body
    r = await api.post("/v1/auth/step-up/passkey/verify" + q,
                       {**authenticator.get(r.body), "challenge_id": details["challenge_id"]},
                       key=None)
    assert r.status == 200, r.body
    opened = await _open(api, r.body)
    assert opened["operator"]["id"] == acme.operator_id
