"""Passkey login (WebAuthn), usernameless, with a software authenticator as the browser
(:mod:`devtools.webauthn`, shared with the tests).

Set-up of each simulated user, through the service's own surface: a magic-link sign-in
(``scenarios.signin``), then ``POST /v1/auth/passkey/register/options`` and
``/register/verify`` with the session's token, the authenticator creating the credential. The
project's relying party must be set first (``bench/locust_setup.py`` sets ``rp_id`` ``localhost``
and the origin ``https://localhost``; ``AUTHIO_PASSKEY_ORIGIN`` names another origin of the
project). One login is ``POST /v1/auth/passkey/login/options?project_id=`` ``{}`` (200 with a
``challenge``), the authenticator's assertion (an ES256 signature with a counter that counts),
then ``POST /v1/auth/passkey/login/verify?project_id=`` with it (200 with ``access_token`` and
``refresh_token``). Each login comes from a fresh address (see ``scenarios.signin``).

A user signs in with ``AUTHIO_PASSKEY_ACCOUNTS`` (default 4) accounts in turn, registered as it
first needs them: the risk engine's ``destination_velocity`` fires past 10 sign-ins of one
account in 10 minutes (35 points, under the default challenge at 50, unless ``ip_velocity``
adds its 30: it does when the service does not believe ``X-Forwarded-For``). Tag: ``passkey``.
"""

from __future__ import annotations

import os

import orjson
from locust import FastHttpUser, tag, task
from locust.contrib.fasthttp import FastHttpSession

from devtools.webauthn import Credential, SoftAuthenticator
from scenarios import common
from scenarios.signin import MagicLinkFlow


class PasskeyFlow:
    """Passkey logins of one simulated user (several accounts, one passkey each)."""

    def __init__(self, client: FastHttpSession) -> None:
        self.client = client
        self.project = common.project_id()
        origin = common.setting("AUTHIO_PASSKEY_ORIGIN", "passkey_origin", "https://localhost")
        self.authenticator = SoftAuthenticator(origin)
        self.accounts = max(1, int(os.environ.get("AUTHIO_PASSKEY_ACCOUNTS", "4")))
        self.credentials: list[Credential] = []
        self.turn = 0
        self.signin = MagicLinkFlow(client)

    def register(self) -> Credential | None:
        """A new user (magic-link sign-up) with one passkey."""
        session = self.signin.sign_in(common.new_email("pk"))
        if session is None:
            return None
        headers = common.bearer(session.access_token)
        with self.client.post("/v1/auth/passkey/register/options", data=b"{}", headers=headers,
                              name="POST /v1/auth/passkey/register/options (set-up)",
                              catch_response=True) as resp:
            options = common.expect(resp, 200, "challenge", "rp", "user")
            if options is None:
                return None
        response = self.authenticator.create(options)
        credential = self.authenticator.credentials[-1]
        with self.client.post("/v1/auth/passkey/register/verify", data=orjson.dumps(response),
                              headers=headers, catch_response=True,
                              name="POST /v1/auth/passkey/register/verify (set-up)") as resp:
            if resp.status_code not in (200, 201):
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:300]}")
                return None
        self.signin.sign_out(session)
        return credential

    def login(self) -> None:
        if len(self.credentials) < self.accounts:
            credential = self.register()
            if credential is None:
                return
            self.credentials.append(credential)
        credential = self.credentials[self.turn % len(self.credentials)]
        self.turn += 1
        headers = common.browser_headers(common.fresh_address())
        query = f"?project_id={self.project}"
        with self.client.post(f"/v1/auth/passkey/login/options{query}", data=b"{}",
                              headers=headers, name="POST /v1/auth/passkey/login/options",
                              catch_response=True) as resp:
            options = common.expect(resp, 200, "challenge", "rpId")
            if options is None:
                return
        assertion = self.authenticator.get(options, credential=credential)
        with self.client.post(f"/v1/auth/passkey/login/verify{query}",
                              data=orjson.dumps(assertion), headers=headers,
                              name="POST /v1/auth/passkey/login/verify",
                              catch_response=True) as resp:
            common.expect(resp, 200, "access_token", "refresh_token")


class PasskeyUser(FastHttpUser):
    """Signs in with a passkey, again and again."""

    weight = 1
    host = common.default_host()
    wait_time = common.wait_time()

    def on_start(self) -> None:
        self.flow = PasskeyFlow(self.client)

    @tag("passkey")
    @task
    def passkey_login(self) -> None:
        self.flow.login()
