"""Passkey routes (WebAuthn): registration for a signed-in user, login (a sign-in like a magic
link's), a user's passkeys by session and by API key, and a small page that runs both
ceremonies in a browser (DESIGN.md "Paths and shapes the spec leaves open", passkeys)."""

from __future__ import annotations

import time
from typing import Final

from aiohttp import web

from common.errors import (
    BlockedByRiskPolicy,
    InvalidEmail,
    InvalidRequest,
    NoSession,
    NotFound,
    StepUpRequired,
    UnknownOrExpiredChallenge,
    UserNotFound,
    VerificationFailed,
)
from common.routing import Reply, RouteTable
from control_plane.appkeys import RISK, TOKENS
from control_plane.passkeys import service
from control_plane.passkeys.page import PAGE
from control_plane.passkeys.schemas import (
    AuthenticationOptionsBody,
    AuthenticationResponseBody,
    CreationOptions,
    Passkey,
    PasskeyList,
    RegistrationOptionsBody,
    RegistrationResponseBody,
    RequestOptions,
)
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import Grant
from control_plane.web import auth
from control_plane.web.actor import Call, client_device
from control_plane.web.endpoint import endpoint
from control_plane.web.pages import page
from control_plane.web.public_project import HEADER as PROJECT_HEADER

routes = RouteTable("passkeys", "Passkeys (WebAuthn): registration, login, a user's passkeys.")

SESSION: Final = auth.Session(check=sessions.ensure_active)
READ: Final = auth.ApiKey("users:read", "users:write")
WRITE: Final = auth.ApiKey("users:write")
_PROJECT_HEADERS: Final = {PROJECT_HEADER: "The project, when the query does not name it."}


@endpoint(routes, "POST", "/v1/auth/passkey/register/options", auth=SESSION, json_only=True,
          errors=[InvalidRequest, UserNotFound],
          replies=[Reply(200, "Creation options for navigator.credentials.create.", CreationOptions)])
async def post_passkey_register_options(call: Call, body: RegistrationOptionsBody) -> web.Response:
    """Start registering a passkey for the signed-in user.

    Answers ``PublicKeyCredentialCreationOptionsJSON`` (a discoverable credential; the user's
    passkeys excluded); its challenge works once, for this user, within
    ``SERVICE_WEBAUTHN_CHALLENGE_TTL_SECONDS``. 400 ``invalid_request`` naming ``webauthn`` when
    the project has no relying party (``PATCH /v1/projects/me``)."""
    async with call.connection() as conn:
        options = await service.registration_options(conn, call.actor, name=body.name,
                                                     settings=call.settings)
    return call.reply(options)


@endpoint(routes, "POST", "/v1/auth/passkey/register/verify", auth=SESSION, json_only=True,
          errors=[UnknownOrExpiredChallenge, VerificationFailed, InvalidRequest],
          replies=[Reply(201, "The passkey, registered.", Passkey)])
async def post_passkey_register_verify(call: Call, body: RegistrationResponseBody) -> web.Response:
    """Finish registering: the browser's ``PublicKeyCredential.toJSON()`` at top level.

    The challenge is spent whatever the outcome."""
    async with call.connection() as conn:
        passkey = await service.register(conn, call.actor, credential=body)
    return call.reply(passkey, status=201)


@endpoint(routes, "POST", "/v1/auth/passkey/login/options", auth=auth.Public(), json_only=True,
          headers=_PROJECT_HEADERS, errors=[InvalidRequest, InvalidEmail],
          replies=[Reply(200, "Request options for navigator.credentials.get.", RequestOptions)])
async def post_passkey_login_options(call: Call, body: AuthenticationOptionsBody) -> web.Response:
    """Start a passkey login.

    Without ``email``, ``allowCredentials`` is empty: any of the project's discoverable
    passkeys (usernameless; passkey autofill with ``mediation: "conditional"``). With it, that
    user's passkeys. 400 ``invalid_request`` naming ``webauthn`` when the project has no relying
    party."""
    async with call.connection() as conn:
        options = await service.authentication_options(conn, call.actor, email=body.email,
                                                       settings=call.settings)
    return call.reply(options)


@endpoint(routes, "POST", "/v1/auth/passkey/login/verify", auth=auth.Public(), json_only=True,
          headers=_PROJECT_HEADERS,
          errors=[UnknownOrExpiredChallenge, VerificationFailed, InvalidRequest, NoSession,
                  StepUpRequired, BlockedByRiskPolicy],
          replies=[Reply(200, "Signed in (the service_session cookie is set too).", Grant)])
async def post_passkey_login_verify(call: Call, body: AuthenticationResponseBody) -> web.Response:
    """Finish a passkey login: sign in.

    The body is the browser's ``PublicKeyCredential.toJSON()`` at top level. Answers what
    ``POST /v1/auth/magic-link/verify`` answers and sets the ``service_session`` cookie; a
    refusal sets no cookie. The challenge is spent whatever the outcome."""
    iat = int(time.time())
    async with call.connection() as conn:
        s = await service.sign_in(conn, call.actor, credential=body, device=client_device(call.request),
                                  settings=call.settings, iat=iat, risk_engine=call.app[RISK])
    grant = await sessions.grant(call.app[TOKENS], call.settings, project_id=s.project_id,
                                 session=s.session, user=s.user, iat=iat,
                                 refresh_token=s.refresh_token)
    return call.reply_signed_in(grant, access_token=grant.access_token, max_age=grant.expires_in)


@endpoint(routes, "GET", "/v1/sessions/me/passkeys", auth=auth.Session(),
          replies=[Reply(200, "The signed-in user's passkeys, oldest first.", PasskeyList)])
async def get_session_passkeys(call: Call) -> web.Response:
    """The signed-in user's passkeys."""
    claims = call.session_claims
    return call.reply(PasskeyList(await service.list_passkeys(call.pool, call.actor,
                                                              user_id=claims.sub)))


@endpoint(routes, "DELETE", "/v1/sessions/me/passkeys/{passkey_id}", auth=SESSION,
          errors=[NotFound], replies=[Reply(200, "The passkey, deleted.", Passkey)])
async def delete_session_passkey(call: Call) -> web.Response:
    """Delete one of the signed-in user's passkeys (``passkey.deleted``)."""
    async with call.connection() as conn:
        passkey = await service.remove_passkey(conn, call.actor, user_id=call.session_claims.sub,
                                               passkey_id=call.path("passkey_id"))
    return call.reply(passkey)


@endpoint(routes, "GET", "/v1/users/{user_id}/passkeys", auth=READ, errors=[UserNotFound],
          replies=[Reply(200, "The user's passkeys, oldest first.", PasskeyList)])
async def get_user_passkeys(call: Call) -> web.Response:
    """A user's passkeys."""
    return call.reply(PasskeyList(await service.list_passkeys(call.pool, call.actor,
                                                              user_id=call.path("user_id"))))


@endpoint(routes, "DELETE", "/v1/users/{user_id}/passkeys/{passkey_id}", auth=WRITE,
          errors=[UserNotFound, NotFound], replies=[Reply(200, "The passkey, deleted.", Passkey)])
async def delete_user_passkey(call: Call) -> web.Response:
    """Delete one of a user's passkeys (``passkey.deleted``)."""
    async with call.connection() as conn:
        passkey = await service.remove_passkey(conn, call.actor, user_id=call.path("user_id"),
                                               passkey_id=call.path("passkey_id"))
    return call.reply(passkey)


@endpoint(routes, "GET", "/v1/auth/passkey/page", auth=auth.Public(), allow_head=False,
          headers=_PROJECT_HEADERS,
          replies=[Reply(200, "The page.", content_type="text/html")])
async def get_passkey_page(call: Call) -> web.Response:
    """A small page of the project that runs both ceremonies in the browser: add a passkey to
    the signed-in user (session cookie), and sign in with one (a button, and passkey autofill
    on its username field where the browser offers it). For trying passkeys out and for the
    browser tests; an application builds its own (docs/sign-in.md, "Passkeys")."""
    return page(lambda nonce: PAGE.format(nonce=nonce))
