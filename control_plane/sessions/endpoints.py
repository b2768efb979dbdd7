"""Session routes (SPEC.md 3): the caller's session by its access token (``Authorization:
Bearer`` or the ``service_session`` cookie), and refresh by the refresh token alone (the access
token may have expired, RFC 6749 6)."""

from __future__ import annotations

import time
from typing import Final

from aiohttp import web

from common.errors import NoOrgSelected, NoSession, NotAMember, OrgAlreadySelected
from common.http import read_json
from common.routing import Reply, RouteTable
from common.schemas import parse_model
from control_plane.appkeys import KMS, TOKENS
from control_plane.sessions import service
from control_plane.sessions.schemas import (
    CurrentSession,
    Grant,
    OrgBody,
    RefreshBody,
    RevokedSession,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.cookies import clear_session_cookie
from control_plane.web.endpoint import endpoint, require_json

routes = RouteTable("sessions", "The caller's session: organization context, refresh, sign-out.")
SESSION: Final = auth.Session()
LIVE_SESSION: Final = auth.Session(check=service.ensure_active)
_GRANT: Final = Reply(200, "A new access token (also set as the service_session cookie).", Grant,
                      headers={"Set-Cookie": "service_session=<access token>; HttpOnly; "
                                             "SameSite=Lax; Path=/"})


async def _change_org(call: Call, body: OrgBody, *, switch: bool) -> web.Response:
    grant = await service.change_organization(
        call.pool, call.actor, claims=call.session_claims, organization_id=body.organization_id,
        switch=switch, tokens=call.app[TOKENS], settings=call.settings, iat=int(time.time()))
    return call.reply_signed_in(grant, access_token=grant.access_token, max_age=grant.expires_in)


@endpoint(routes, "POST", "/v1/sessions/select-org", auth=LIVE_SESSION, json_only=True,
          errors=[NotAMember, OrgAlreadySelected], replies=[_GRANT])
async def post_session_select_org(call: Call, body: OrgBody) -> web.Response:
    """Select the session's organization, once (the user needs an active membership there)."""
    return await _change_org(call, body, switch=False)


@endpoint(routes, "POST", "/v1/sessions/switch-org", auth=LIVE_SESSION, json_only=True,
          errors=[NotAMember, NoOrgSelected], replies=[_GRANT])
async def post_session_switch_org(call: Call, body: OrgBody) -> web.Response:
    """Switch the session to another organization the user is an active member of."""
    return await _change_org(call, body, switch=True)


@endpoint(routes, "POST", "/v1/sessions/refresh", auth=auth.Anonymous(), body=RefreshBody,
          errors=[NoSession], replies=[_GRANT])
async def post_session_refresh(call: Call) -> web.Response:
    """Rotate the refresh token: a new access token and a new refresh token.

    A rotated refresh token presented again revokes the session (reuse detection), except the
    one just replaced within the grace period (a retry after a lost response)."""
    request = call.request
    data = await read_json(request) if request.body_exists else {}
    if not data.get("refresh_token"):
        raise NoSession('Send the refresh token as {"refresh_token": "rt_..."}.',
                        details={"reason": "missing"})
    require_json(request)
    body = parse_model(RefreshBody, data)
    grant = await service.refresh(call.pool, call.actor, token=body.refresh_token,
                                  tokens=call.app[TOKENS], kms=call.app[KMS],
                                  settings=call.settings, iat=int(time.time()))
    return call.reply_signed_in(grant, access_token=grant.access_token, max_age=grant.expires_in)


@endpoint(routes, "POST", "/v1/sessions/revoke", auth=SESSION,
          replies=[Reply(200, "The session, revoked; the cookie is cleared.", RevokedSession)])
async def post_session_revoke(call: Call) -> web.Response:
    """Sign out: revoke the session everywhere, at once."""
    async with call.connection() as conn:
        revoked = await service.revoke_current(conn, call.actor, claims=call.session_claims)
    response = call.reply(revoked)
    clear_session_cookie(response)
    return response


@endpoint(routes, "GET", "/v1/sessions/me", auth=SESSION,
          replies=[Reply(200, "The session and its user.", CurrentSession)])
async def get_session(call: Call) -> web.Response:
    """The caller's session and user."""
    async with call.connection() as conn:
        current = await service.describe(conn, call.session_claims)
    return call.reply(current)
