"""Admin portal routes (DESIGN.md "admin portal, SCIM, recovery, operators"; issue 23).

* ``POST /v1/portal/links`` (API key, ``organizations:write``): a one-time setup link.
* ``GET /portal?token=``: the page; opening it uses the link up and starts the portal session.
  Its two files are served beside it (``/portal/static/...``), so the page runs no inline code.
* ``GET /v1/portal/state`` and ``POST /v1/portal/...``: what the page calls, authenticated by the
  portal session.

The portal session travels in a cookie, ``service_portal_session``: HttpOnly (the page's script
never holds it, so no script injected into the page could send it elsewhere), SameSite=Strict
and scoped to ``/v1/portal`` (no other site's page can make a browser send it, and no other
route of the service ever receives it), Secure unless the service runs on plain-HTTP localhost.
A Bearer token held by the script would have to be written into the page or kept in storage a
script can read; the cookie also lets a reload of ``/portal`` resume the session after the
setup token is spent. Unsafe calls carrying it must still come from this origin
(``control_plane.web.auth.check_same_origin``), and take JSON only, which a cross-origin form
cannot send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.errors import (
    DomainInUse,
    Forbidden,
    InvalidRequest,
    NotFound,
    OrganizationNotFound,
    TokenConsumed,
    TokenExpired,
    TokenInvalidOrExpired,
)
from common.http import request_id
from common.routing import Reply, RouteTable, Security
from control_plane.appkeys import CURSOR_SECRET, KMS, TXT_RESOLVER
from control_plane.portal import service
from control_plane.portal.page import (
    SCRIPT,
    SCRIPT_PATH,
    STYLE,
    STYLE_PATH,
    asset_response,
    portal_page,
    prefers_html,
    refusal_page,
)
from control_plane.portal.schemas import (
    CreateLink,
    DomainBody,
    DomainVerification,
    LinkRefusal,
    OrganizationDomain,
    PortalLink,
    PortalQuery,
    PortalScimToken,
    PortalState,
    ScimTokenBody,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.cookies import secure_cookies
from control_plane.web.endpoint import endpoint

routes = RouteTable("portal", "The admin portal: one-time setup links, and the page they open for "
                              "an organization's IT administrator (domain verification by DNS, "
                              "directory sync by SCIM) with the calls it makes.")

PORTAL_COOKIE: Final = "service_portal_session"
COOKIE_PATH: Final = "/v1/portal"
LINKS: Final = auth.ApiKey("organizations:write")
_SESSION_ERRORS: Final = [TokenInvalidOrExpired]
_SAVE_ERRORS: Final = [TokenInvalidOrExpired, Forbidden]
_REFUSALS: Final = (TokenConsumed, TokenExpired, TokenInvalidOrExpired)


@dataclass(frozen=True, slots=True, kw_only=True)
class PortalCall(Call):
    """A call of the portal's page: its live ``session``; the actor is the session's
    (``service.portal_actor``)."""

    session: service.PortalSession


@dataclass(frozen=True)
class PortalSessionCookie:
    """The portal session's cookie (``service_portal_session``). Raises TokenInvalidOrExpired
    (no cookie, an unknown or ended session), Forbidden (an unsafe call a browser says came
    from another origin)."""

    security: tuple[Security, ...] = ()
    scopes: tuple[str, ...] = ()
    names_project: bool = False

    async def __call__(self, request: web.Request) -> PortalCall:
        token = request.cookies.get(PORTAL_COOKIE) or None
        if token is not None:
            auth.check_same_origin(request, request.app[SETTINGS])
        session = await service.find_session(request.app[PG_POOL], session_token=token)
        actor = service.portal_actor(auth.request_actor(request, "anonymous", None), session)
        return PortalCall(request, actor, session=session)


SESSION: Final = PortalSessionCookie(security=("portal_session",))


# --- links -------------------------------------------------------------------------------------


@endpoint(routes, "POST", "/v1/portal/links", auth=LINKS,
          errors=[InvalidRequest, OrganizationNotFound],
          replies=[Reply(201, "The link, shown this once.", PortalLink)])
async def post_portal_links(call: Call, body: CreateLink) -> web.Response:
    """Make a one-time setup link to the admin portal for an organization of the project.

    The link opens the portal once, within `ttl_seconds` (5 minutes by default), for the
    `intent` it names; its token is kept only as a SHA-256 digest. Redirect the organization's
    IT administrator to it when they ask for it in your application (e-mail scanners open
    links, which would use them up). 404 `organization_not_found` for an organization that is
    not the project's."""
    async with call.connection() as conn:
        link = await service.create_link(conn, call.actor, body=body, settings=call.settings)
    return call.reply(link, status=201)


# --- the page ----------------------------------------------------------------------------------


@endpoint(routes, "GET", service.PAGE_PATH, auth=auth.Anonymous(), allow_head=False,
          replies=[
              Reply(200, "The portal page. With `token`, the link is used up and the portal "
                         "session starts: its cookie is set.", content_type="text/html",
                    headers={"Set-Cookie": "service_portal_session: the portal session (HttpOnly, "
                                           "SameSite=Strict, Path=/v1/portal), with a token"}),
              Reply(410, "The link cannot be opened: `token_consumed` (opened before), "
                         "`token_expired` (past its lifetime) or `token_invalid_or_expired` (no "
                         "link has that token). A client that prefers `text/html` (a browser) "
                         "gets a page saying so, with the same status.", LinkRefusal),
              Reply(410, "The same refusal as a page.", content_type="text/html"),
          ])
async def get_portal(call: Call, query: PortalQuery) -> web.Response:
    """The admin portal: the page a setup link opens.

    Opening it with the link's `token` uses the link up (a second opening is 410
    `token_consumed`) and starts a portal session of `SERVICE_PORTAL_SESSION_TTL_SECONDS` (an
    hour), carried by an HttpOnly cookie; the page then drops the token from its address.
    Without `token` the page resumes the session its cookie carries (a reload). Served with a
    strict Content-Security-Policy, `Cache-Control: no-store` and `Referrer-Policy:
    no-referrer`."""
    if query.token is None:
        return portal_page()
    try:
        async with call.connection() as conn:
            opened = await service.open_link(conn, call.actor, token=query.token,
                                             settings=call.settings)
    except _REFUSALS as err:
        if prefers_html(call.request):
            return refusal_page(err, request_id(call.request))
        raise
    response = portal_page()
    response.set_cookie(PORTAL_COOKIE, opened.session_token, path=COOKIE_PATH, httponly=True,
                        samesite="Strict", secure=secure_cookies(call.settings),
                        max_age=call.settings.portal_session_ttl_seconds)
    return response


@endpoint(routes, "GET", SCRIPT_PATH, auth=auth.Anonymous(),
          replies=[Reply(200, "The portal page's script.", content_type="text/javascript")])
async def get_portal_script(call: Call) -> web.Response:
    """The admin portal page's script."""
    return asset_response(SCRIPT)


@endpoint(routes, "GET", STYLE_PATH, auth=auth.Anonymous(),
          replies=[Reply(200, "The portal page's style sheet.", content_type="text/css")])
async def get_portal_style(call: Call) -> web.Response:
    """The admin portal page's style sheet."""
    return asset_response(STYLE)


# --- the page's calls --------------------------------------------------------------------------


@endpoint(routes, "GET", "/v1/portal/state", auth=SESSION, errors=_SESSION_ERRORS,
          replies=[Reply(200, "The portal's state.", PortalState)])
async def get_portal_state(call: PortalCall) -> web.Response:
    """What the portal page shows: the organization, the link's intent and its state.

    Authentication: the portal session's cookie (`service_portal_session`, set by `GET
    /portal?token=`); 410 `token_invalid_or_expired` without a live session."""
    return call.reply(await service.portal_state(call.pool, call.session,
                                                 cursor_secret=call.app[CURSOR_SECRET],
                                                 settings=call.settings))


@endpoint(routes, "POST", "/v1/portal/domains", auth=SESSION, json_only=True,
          errors=[*_SAVE_ERRORS, DomainInUse],
          replies=[Reply(201, "Added: the TXT record to publish.", OrganizationDomain),
                   Reply(200, "The organization had the domain already.", OrganizationDomain)])
async def post_portal_domains(call: PortalCall, body: DomainBody) -> web.Response:
    """Add a domain to the organization and get the DNS TXT record proving control of it.

    Authentication: the portal session's cookie, of a `domain_verification` link (403
    `forbidden` for another intent); 410 `token_invalid_or_expired` without a live session.
    409 `domain_in_use` when another organization of the project verified it."""
    async with call.connection() as conn:
        domain, created = await service.claim_domain(conn, call.actor, call.session,
                                                     domain=body.domain)
    return call.reply(domain, status=201 if created else 200)


@endpoint(routes, "POST", "/v1/portal/domains/verify", auth=SESSION, json_only=True,
          errors=[*_SAVE_ERRORS, NotFound, DomainInUse],
          replies=[Reply(200, "The outcome: verified, or why not.", DomainVerification)])
async def post_portal_domain_verify(call: PortalCall, body: DomainBody) -> web.Response:
    """Look up the domain's TXT record and, when it holds the value given, verify the domain.

    Authentication: as `POST /v1/portal/domains`. Not found yet is not an error: the answer says
    `verified: false` and why (`record_missing`, `record_mismatch`, `lookup_failed`). 404 for a
    domain the organization has not added; 409 `domain_in_use` when another organization of
    the project verified it first."""
    return call.reply(await service.verify_domain(call.pool, call.actor, call.session,
                                                  domain=body.domain,
                                                  resolver=call.app[TXT_RESOLVER]))


@endpoint(routes, "POST", "/v1/portal/scim/token", auth=SESSION, json_only=True,
          errors=[*_SAVE_ERRORS, OrganizationNotFound],
          replies=[Reply(201, "The new token, shown this once.", PortalScimToken)])
async def post_portal_scim_token(call: PortalCall, body: ScimTokenBody) -> web.Response:
    """Mint the organization's SCIM token and answer it once, with the SCIM base URL.

    The token replaces the organization's previous one at once, as `POST
    /v1/organizations/{org_id}/scim-token` does (the store its groups write to is kept); the
    body is an empty JSON object. Authentication: the portal session's cookie, of a `scim`
    link (403 `forbidden` for another intent); 410 `token_invalid_or_expired` without a live
    session."""
    async with call.connection() as conn:
        minted = await service.mint_scim_token(conn, call.actor, call.session,
                                               kms=call.app[KMS], settings=call.settings)
    return call.reply(minted, status=201)
