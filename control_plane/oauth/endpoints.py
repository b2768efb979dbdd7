"""OAuth routes: a project's providers (API key), and the sign-in's start and callback, which a
browser follows (DESIGN.md "OAuth"; RFC 6749 4.1, RFC 7636, OIDC Core 3.1)."""

from __future__ import annotations

import time
from typing import Final

from aiohttp import web
from multidict import MultiDict

from common.errors import (
    BlockedByRiskPolicy,
    IdentityConflict,
    InvalidRequest,
    MissingEmail,
    NoSession,
    ProjectNotFound,
    ServiceUnavailable,
    StepUpRequired,
    UnknownProvider,
    VerificationFailed,
)
from common.routing import Reply, RouteTable
from common.schemas import parse_query
from control_plane.appkeys import KMS, OAUTH, RISK, TOKENS
from control_plane.oauth import service
from control_plane.oauth.schemas import (
    CallbackQuery,
    DeletedProvider,
    Provider,
    ProviderBody,
    StartQuery,
)
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import Grant
from control_plane.web import auth
from control_plane.web.actor import Call, client_device
from control_plane.web.cookies import secure_cookies, set_session_cookie
from control_plane.web.endpoint import endpoint

routes = RouteTable("oauth", "Sign-in with Google, GitHub, Microsoft, Apple or any OpenID Connect "
                             "provider, and the providers a project configures.")

_PROVIDER: Final = "{provider:[^/]+}"
"""A provider's name: any path segment (``schemas.PROVIDER_NAME`` says which are names)."""
_PROVIDER_PATH: Final = f"/v1/oauth/providers/{_PROVIDER}"
_LOCATION: Final = {"Location": "Where the browser goes next."}
_FORM: Final = "application/x-www-form-urlencoded"


def _name(call: Call, *, configuring: bool = False) -> str:
    return service.provider_name(call.path("provider"), configuring=configuring)


@endpoint(routes, "PUT", _PROVIDER_PATH, auth=auth.ApiKey(), errors=[InvalidRequest],
          replies=[Reply(201, "Configured.", Provider), Reply(200, "Replaced.", Provider)])
async def put_oauth_provider(call: Call, body: ProviderBody) -> web.Response:
    """Configure a provider for the project (replacing its configuration).

    ``google``, ``github``, ``microsoft`` and ``apple`` are those providers; any other name is a
    generic OpenID Connect provider and needs ``issuer``. Register ``callback_url`` (answered)
    as the redirect URI at the provider. The client secret is stored encrypted and never
    answered."""
    async with call.connection() as conn:
        provider, created = await service.configure_provider(
            conn, call.actor, name=_name(call, configuring=True), body=body, kms=call.app[KMS],
            settings=call.settings)
    return call.reply(provider, status=201 if created else 200)


@endpoint(routes, "GET", _PROVIDER_PATH, auth=auth.ApiKey(), errors=[UnknownProvider],
          replies=[Reply(200, "The provider's configuration.", Provider)])
async def get_oauth_provider(call: Call) -> web.Response:
    """A provider's configuration in the project (without its client secret)."""
    provider = await service.describe_provider(call.pool, call.actor, name=_name(call),
                                               settings=call.settings)
    return call.reply(provider)


@endpoint(routes, "DELETE", _PROVIDER_PATH, auth=auth.ApiKey(), errors=[UnknownProvider],
          replies=[Reply(200, "Deleted.", DeletedProvider)])
async def delete_oauth_provider(call: Call) -> web.Response:
    """Delete a provider's configuration; sign-ins with it are refused until it is configured
    again (linked identities stay)."""
    async with call.connection() as conn:
        deleted = await service.remove_provider(conn, call.actor, name=_name(call))
    return call.reply(deleted)


@endpoint(routes, "GET", f"/v1/auth/oauth/{_PROVIDER}/start",
          auth=auth.Public(), allow_head=False,
          errors=[UnknownProvider, InvalidRequest, ProjectNotFound, ServiceUnavailable],
          replies=[Reply(302, "To the provider's authorization page (the oauth_browser cookie "
                              "is set).", content_type=None, headers=_LOCATION)])
async def get_oauth_start(call: Call, query: StartQuery) -> web.StreamResponse:
    """Start signing in with a provider: the link behind an application's "Sign in with ..."
    button.

    Redirects the browser to the provider with PKCE S256, a single-use ``state`` and (OpenID
    Connect) a ``nonce``; the state is bound to this browser by an HttpOnly cookie.
    ``redirect_uri`` must be one of the provider's ``redirect_uris``."""
    started = await service.start_authorization(
        call.pool, call.actor, name=_name(call), redirect_uri=query.redirect_uri,
        browser_binding=call.request.cookies.get(service.BROWSER_COOKIE),
        client=call.app[OAUTH], kms=call.app[KMS], settings=call.settings)
    response = web.Response(status=302, headers={"Location": started.url,
                                                 "Cache-Control": "no-store"})
    # A provider that answers by a cross-site POST (form_post) is followed only by a
    # SameSite=None cookie, which browsers take only when Secure (localhost counts as secure).
    cross_site = started.cross_site_post
    response.set_cookie(service.BROWSER_COOKIE, started.browser_binding,
                        max_age=call.settings.oauth_state_ttl_seconds,
                        path=service.BROWSER_COOKIE_PATH, httponly=True,
                        samesite="None" if cross_site else "Lax",
                        secure=cross_site or secure_cookies(call.settings))
    return response


_CALLBACK_PATH: Final = f"/v1/auth/oauth/{_PROVIDER}/callback"
_CALLBACK_ERRORS: Final = [InvalidRequest, UnknownProvider, VerificationFailed, MissingEmail,
                           IdentityConflict, NoSession, ServiceUnavailable, StepUpRequired,
                           BlockedByRiskPolicy]
_CALLBACK_REPLIES: Final = [
    Reply(302, "Signed in: to the application's redirect_uri (the service_session cookie is "
               "set).", content_type=None, headers=_LOCATION),
    Reply(200, "Signed in (Accept: application/json; the service_session cookie is set too).",
          Grant)]
_ACCEPT: Final = {"Accept": "application/json to be answered the session envelope instead of a "
                            "redirect."}


@endpoint(routes, "GET", _CALLBACK_PATH, auth=auth.Anonymous(), allow_head=False,
          headers=_ACCEPT, errors=_CALLBACK_ERRORS, replies=_CALLBACK_REPLIES)
async def get_oauth_callback(call: Call, query: CallbackQuery) -> web.StreamResponse:
    """Where the provider sends the browser back: sign in.

    Register ``{public base URL}/v1/auth/oauth/{provider}/callback`` at the provider. On
    success the ``service_session`` cookie is set and the browser goes to the ``redirect_uri``
    given to ``start``, or, with ``Accept: application/json``, the session envelope is answered
    as ``POST /v1/auth/magic-link/verify`` answers it. No refusal sets a cookie."""
    return await _signed_in(call, query)


@endpoint(routes, "POST", _CALLBACK_PATH, auth=auth.Anonymous(), headers=_ACCEPT,
          errors=_CALLBACK_ERRORS, replies=_CALLBACK_REPLIES)
async def post_oauth_callback(call: Call) -> web.StreamResponse:
    """The callback of a provider answering with ``response_mode=form_post`` (Apple): the same
    parameters as the ``GET`` form (``state``, ``code``, ``error``, ...), as an
    ``application/x-www-form-urlencoded`` body (OAuth 2.0 Form Post Response Mode). Answers as
    the ``GET`` form does."""
    try:
        form = await call.request.post() if call.request.content_type == _FORM else {}
    except (UnicodeDecodeError, LookupError, ValueError):  # bytes not in the named charset
        raise InvalidRequest.field("body", "must be form fields in the charset it names") from None
    fields = MultiDict((k, v) for k, v in form.items() if isinstance(v, str))
    return await _signed_in(call, parse_query(fields, CallbackQuery))


async def _signed_in(call: Call, query: CallbackQuery) -> web.StreamResponse:
    iat = int(time.time())
    signed_in = await service.complete_sign_in(
        call.pool, call.actor, name=_name(call), query=query,
        browser_binding=call.request.cookies.get(service.BROWSER_COOKIE),
        device=client_device(call.request), client=call.app[OAUTH], kms=call.app[KMS],
        settings=call.settings, iat=iat, risk_engine=call.app[RISK])
    grant = await sessions.grant(call.app[TOKENS], call.settings, project_id=signed_in.project_id,
                                 session=signed_in.session, user=signed_in.user, iat=iat,
                                 refresh_token=signed_in.refresh_token)
    if "application/json" in call.request.headers.get("Accept", ""):
        return call.reply_signed_in(grant, access_token=grant.access_token,
                                    max_age=grant.expires_in)
    # A 302 after a form_post is followed with a GET by every browser (RFC 9110 15.4.3).
    response = web.Response(status=302, headers={"Location": signed_in.redirect_uri,
                                                 "Cache-Control": "no-store"})
    set_session_cookie(response, grant.access_token, max_age=grant.expires_in,
                       settings=call.settings)
    return response
