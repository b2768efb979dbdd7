"""Magic-link routes: send a sign-in link, the landing page the link opens, and the redemption
the page posts (SPEC.md 3, 4, 5, 7)."""

from __future__ import annotations

import time
from typing import Annotated, Final
from urllib.parse import urlencode

from aiohttp import web
from pydantic import Field

from common.errors import (
    BlockedByRiskPolicy,
    InvalidDestination,
    InvalidEmail,
    InvalidRequest,
    InvitationNotFound,
    InvitationNotPending,
    NoSession,
    RateLimited,
    ServiceUnavailable,
    StepUpRequired,
    TokenConsumed,
    TokenExpired,
    TokenInvalidOrExpired,
    UnknownOrExpiredChallenge,
    UserNotFound,
)
from common.routing import Reply, RouteTable
from common.schemas import QueryModel
from control_plane.appkeys import KMS, RISK, SEND_LIMITS, TOKENS
from control_plane.magic_links import service, signin
from control_plane.magic_links.schemas import SendBody, Sent, VerifyBody
from control_plane.operators import service as operators
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import Grant
from control_plane.web import auth
from control_plane.web.actor import Call, client_device
from control_plane.web.endpoint import endpoint
from control_plane.web.pages import page
from control_plane.web.public_project import HEADER as PROJECT_HEADER

routes = RouteTable("magic_links", "Passwordless sign-in by a link sent by email or SMS.")


class VerifyQuery(QueryModel):
    """The project the link belongs to (the link carries it)."""

    project_id: Annotated[str | None, Field(description="The link's project.")] = None


@endpoint(routes, "POST", "/v1/auth/magic-link/send", auth=auth.Public(),
          errors=[InvalidDestination, InvalidEmail, InvalidRequest, RateLimited,
                  ServiceUnavailable],
          replies=[Reply(200, "The link is on its way.", Sent)])
async def post_magic_link_send(call: Call, body: SendBody) -> web.Response:
    """Send a sign-in link to an email address or phone number.

    The same answer whether or not a user has that destination; a new user is created when the
    link is redeemed. The link lands on this service's page, or on ``redirect_url``, a page of
    the application on one of the project's allowed origins. Rate limited per destination and
    per client IP (429 with ``Retry-After``)."""
    sent = await service.send_link(
        call.pool, project_id=call.project_id, destination=body.destination, ip=call.actor.ip,
        limits=call.app[SEND_LIMITS], kms=call.app[KMS], settings=call.settings,
        redirect_url=body.redirect_url)
    return call.reply(sent)


@endpoint(routes, "POST", service.VERIFY_PATH, auth=auth.Anonymous(), json_only=True,
          headers={PROJECT_HEADER: "The link's project, when the query does not name it."},
          errors=[TokenConsumed, TokenExpired, TokenInvalidOrExpired, InvitationNotPending,
                  InvitationNotFound, UserNotFound, NoSession, StepUpRequired,
                  BlockedByRiskPolicy, UnknownOrExpiredChallenge],
          replies=[Reply(200, "Signed in (the service_session cookie is set too).", Grant)])
async def post_magic_link_verify(call: Call, query: VerifyQuery, body: VerifyBody) -> web.Response:
    """Redeem a magic link: sign in.

    Answers the session envelope and sets the ``service_session`` cookie (SPEC.md 3). A link
    works once; an invitation's link also makes the membership and selects the organization.
    The sign-in is scored by the risk engine: 401 ``step_up_required`` (``details.challenge_id``)
    or 403 ``blocked_by_risk_policy`` set no cookie. A step-up link
    (``POST /v1/auth/step-up/magic-link/send``) satisfies its challenge and signs in."""
    iat = int(time.time())
    named = query.project_id or call.request.headers.get(PROJECT_HEADER)
    async with call.connection() as conn:
        s = await signin.redeem(conn, call.actor, token=body.token, named_project=named,
                                device=client_device(call.request), settings=call.settings, iat=iat,
                                risk_engine=call.app[RISK])
    grant = await sessions.grant(call.app[TOKENS], call.settings, project_id=s.project_id,
                                 session=s.session, user=s.user, iat=iat,
                                 refresh_token=s.refresh_token)
    return call.reply_signed_in(grant, access_token=grant.access_token, max_age=grant.expires_in)


_LANDING: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Sign in</title>
<style nonce="{nonce}">
body {{ font-family: system-ui, sans-serif; max-width: 28rem; margin: 4rem auto; padding: 0 1rem; }}
button {{ font-size: 1.1rem; padding: .6rem 1.4rem; cursor: pointer; }}
</style></head>
<body><main>
<h1>Sign in</h1>
<p id="status" role="status" aria-live="polite">Press the button to finish signing in.</p>
<button id="signin" type="button">Sign in</button>
</main>
<script nonce="{nonce}">
document.getElementById("signin").addEventListener("click", async (event) => {{
  const button = event.currentTarget, status = document.getElementById("status");
  const params = new URLSearchParams(window.location.search);
  const token = new URLSearchParams(window.location.hash.slice(1)).get("token") || "";
  button.disabled = true;
  status.textContent = "Signing in…";
  try {{
    const response = await fetch(window.location.pathname + "?" + new URLSearchParams(
        {{project_id: params.get("project_id") || ""}}), {{
      method: "POST", credentials: "same-origin",
      headers: {{"Content-Type": "application/json"}},
      body: JSON.stringify({{token: token}}),
    }});
    const body = await response.json();
    if (response.ok) {{
      status.textContent = "You are signed in" + (body.user.email ? " as " + body.user.email : "") + ".";
      button.hidden = true;
    }} else {{
      status.textContent = body.error.message;
    }}
  }} catch (err) {{
    status.textContent = "Could not reach the server; try again.";
    button.disabled = false;
  }}
}});
</script></body></html>
"""


@endpoint(routes, "GET", service.VERIFY_PATH, auth=auth.Anonymous(), allow_head=False,
          replies=[Reply(200, "The page.", content_type="text/html"),
                   Reply(303, "A link of a tenant's operator project: to the operator "
                              "console's landing page, which signs in there.",
                         content_type="text/plain",
                         headers={"Location": "/console/verify with the link's project_id (the "
                                              "browser keeps the fragment)."})])
async def get_magic_link_verify(call: Call) -> web.Response:
    """The landing page a magic link opens: a button that redeems the link.

    Opening it never uses the link up (mail scanners fetch links; people press buttons). The
    token is in the URL's fragment, so the server never receives it with the page. The links of
    a tenant's operator project (`project_id` in the query) land on the operator console's own
    page instead, by a redirect that keeps the query (and, in the browser, the fragment)."""
    project_id = call.request.query.get("project_id", "")
    landing = await operators.landing_path(call.pool, project_id)
    if landing is not None:
        return web.Response(status=303, text="303: See Other", headers={
            "Location": f"{landing}?{urlencode({'project_id': project_id})}"})
    return page(lambda nonce: _LANDING.format(nonce=nonce))
