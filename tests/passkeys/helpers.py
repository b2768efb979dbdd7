"""Helpers of the passkey tests: a project with a relying party, a signed-in user, and the two
ceremonies over HTTP with the software authenticator (tests/fixtures/webauthn.py)."""

from __future__ import annotations

from typing import Any

from tests.fixtures.identity import SignedIn, email, session_call, sign_in
from tests.fixtures.service import Api, Project, Response
from tests.fixtures.webauthn import SoftAuthenticator

RP_ID = "localhost"
ORIGIN = "http://localhost:8443"


async def configure(project: Project, *, rp_id: str = RP_ID, origins: list[str] | None = None,
                    user_verification: str = "preferred") -> Response:
    r = await project.api.request("PATCH", "/v1/projects/me", json={"webauthn": {
        "rp_id": rp_id, "rp_name": "Test app", "origins": origins or [ORIGIN],
        "user_verification": user_verification}})
    assert r.status == 200, r.body
    return r


async def signed_in_user(project: Project, address: str | None = None) -> SignedIn:
    """A user signed in by magic link (the session a registration needs)."""
    return await sign_in(project, address or email())


async def register_options(api: Api, user: SignedIn, body: dict[str, Any] | None = None) -> Response:
    return await session_call(api, "POST", "/v1/auth/passkey/register/options", user.access_token,
                              json=body or {})


async def register_verify(api: Api, user: SignedIn, credential: dict[str, Any]) -> Response:
    return await session_call(api, "POST", "/v1/auth/passkey/register/verify", user.access_token,
                              json=credential)


async def register(project: Project, user: SignedIn, authenticator: SoftAuthenticator,
                   **create: Any) -> dict[str, Any]:
    """Register a passkey for ``user``; the stored passkey."""
    r = await register_options(project.api, user, {"name": "Laptop"})
    assert r.status == 200, r.body
    r = await register_verify(project.api, user, authenticator.create(r.body, **create))
    assert r.status == 201, r.body
    return dict(r.body)


async def login_options(project: Project, body: dict[str, Any] | None = None,
                        api: Api | None = None) -> Response:
    return await (api or project.api).post(
        f"/v1/auth/passkey/login/options?project_id={project.id}", body or {}, key=None)


async def login_verify(project: Project, credential: dict[str, Any],
                       api: Api | None = None) -> Response:
    return await (api or project.api).post(
        f"/v1/auth/passkey/login/verify?project_id={project.id}", credential, key=None)


async def options(project: Project, body: dict[str, Any] | None = None) -> dict[str, Any]:
    r = await login_options(project, body)
    assert r.status == 200, r.body
    return dict(r.body)
