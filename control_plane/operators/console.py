"""The operator console (``/console``): server-rendered pages where a tenant's dashboard
operators look after what people would rather see than script (issue 23): the recovery queue,
device sign-ins of ``authio login``, API keys, and the audit log with its filters and exports.

Signing in: ``GET /console/sign-in`` takes the operator's address and sends a magic link in
each tenant whose operator it is (``POST /console/sign-in``). The link is an ordinary one of the
tenant's operator project; its landing page hands it to ``GET /console/verify``, whose button
redeems it (``POST /v1/auth/magic-link/verify``) and opens the console session with the tokens
it answered (``POST /console/session``). By passkey: a signed-in operator adds passkeys to
their operator-project user on ``/console/passkeys`` (the ``passkeys`` rules, the operator
project's relying party set by ``operators.ensure_relying_party``: discoverable credentials);
the sign-in page's passkey button needs no address: ``POST /console/sign-in/passkey`` answers
options for any console passkey, ``POST /console/sign-in/passkey/verify`` finds the operator
project by the chosen credential's user handle and signs in there, and the page opens the
console session the same way, with ``POST /console/session``. A sign-in the risk engine
challenges (``step_up_required``) is finished on the same page by the public step-up calls of
the operator project (a passkey of the challenged user, or a step-up link, which lands on
``/console/verify`` as every link of an operator project does).

The console session is a session of the operator project, nothing of its own: its access token
in the cookie ``authio_console`` and its refresh token in ``authio_console_refresh`` (both
HttpOnly, SameSite=Strict, Path=/console, Secure unless on plain-HTTP localhost). Each request
verifies the token (``web.auth.verify_access``), refreshes it with the refresh token once it has
expired (``sessions.refresh``, the new pair set on the answer), and checks that the session is
active and its user still an operator (``operators.console_operator``): a removed operator's
session stops at once. Actions are POSTs of JSON from the pages' script that must come from this
origin (``web.auth.check_same_origin``) and carry the session's CSRF token (``X-CSRF-Token``,
given to the page in a ``<meta>``); the cookie's SameSite=Strict keeps it off other sites'
requests besides. Each action acts in one project of the operator's tenant (``project_id``)
as an actor of type ``operator`` with the operator's id, which is what the audit log records.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from common.access_tokens import SESSION_COOKIE, AccessClaims
from common.appkeys import AUTHENTICATOR, PG_POOL, SETTINGS, SIGNING_KEYS
from common.errors import (
    BlockedByRiskPolicy,
    EmailInUse,
    Forbidden,
    InvalidEmail,
    InvalidRequest,
    NoSession,
    NotFound,
    PhoneInUse,
    RateLimited,
    RecoveryRequestNotFound,
    RecoveryRequestNotPending,
    ServiceError,
    ServiceUnavailable,
    StepUpRequired,
    UnknownOrExpiredChallenge,
    UserNotFound,
    VerificationFailed,
)
from common.routing import Reply, RouteTable, Security
from common.schemas import parse_model
from common.settings import Settings
from control_plane.appkeys import CURSOR_SECRET, KMS, RISK, SEND_LIMITS, TOKENS
from control_plane.audit import service as audit
from control_plane.audit.schemas import EventsQuery, ExportQuery
from control_plane.imports import service as devices
from control_plane.imports.schemas import Approval, ApproveBody
from control_plane.operators import pages, service
from control_plane.operators.schemas import (
    ActionQuery,
    AuditPageQuery,
    ConsolePageQuery,
    ConsoleSession,
    DevicePageQuery,
    Operator,
    SessionBody,
    SignedOut,
    SignInBody,
    SignInSent,
)
from control_plane.passkeys import service as passkeys
from control_plane.passkeys.schemas import (
    AuthenticationResponseBody,
    CreationOptions,
    Passkey,
    RegistrationOptionsBody,
    RegistrationResponseBody,
    RequestOptions,
)
from control_plane.recovery import service as recovery
from control_plane.recovery.schemas import DecisionBody, RecoveryQuery, RecoveryRequest
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import Grant
from control_plane.tenancy import service as tenancy
from control_plane.tenancy.schemas import ApiKey, ProjectRef
from control_plane.web import auth
from control_plane.web.actor import Actor, Call, client_device
from control_plane.web.auth import SAFE_METHODS, check_same_origin, request_actor, verify_access
from control_plane.web.cookies import secure_cookies
from control_plane.web.endpoint import endpoint
from control_plane.web.pages import page
from control_plane.web.pagination import Listing, PageQuery
from control_plane.web.streaming import stream_body, streamed_response

log = logging.getLogger("authio.console")

routes = RouteTable("console", "The operator console: pages for a tenant's dashboard operators "
                               "and the calls their script makes. Authentication: the console "
                               "session's cookies, set when an operator signs in.")

ACCESS_COOKIE: Final = "authio_console"
REFRESH_COOKIE: Final = "authio_console_refresh"
COOKIE_PATH: Final = "/console"
CSRF_HEADER: Final = "X-CSRF-Token"
SIGN_IN: Final = "/console/sign-in"
HOME: Final = "/console/recovery"
_HTML: Final = "text/html"
_PAGE: Final = Reply(200, "The page.", content_type=_HTML)
_TO_SIGN_IN: Final = Reply(303, "Not signed in (or no longer an operator): to the sign-in page "
                                "(the console's own page, /console, for a signed-in one).",
                           content_type="text/plain",
                           headers={"Location": "Where to go: /console/sign-in."})


# --- the console session --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsoleCall(Call):
    """A call of a signed-in operator: ``operator``, and ``renewed``, the pair a refresh of an
    expired access token answered (set as the cookies of the answer, :func:`finish`)."""

    operator: Operator | None = None
    renewed: Grant | None = None

    @property
    def signed_in(self) -> Operator:
        assert self.operator is not None
        return self.operator

    def acting_in(self, project: ProjectRef) -> Actor:
        """The operator as the actor of a rule in ``project``."""
        return self.actor.as_operator(self.signed_in.id, project_id=project.id)


def set_console_cookies(response: web.StreamResponse, *, access_token: str,
                        refresh_token: str | None, settings: Settings) -> None:
    """Set the console's cookies on ``response``. Both last as long as a session may: an
    expired access token is refreshed, not dropped by the browser first."""
    secure = secure_cookies(settings)
    response.set_cookie(ACCESS_COOKIE, access_token, max_age=settings.session_ttl_seconds,
                        path=COOKIE_PATH, httponly=True, samesite="Strict", secure=secure)
    if refresh_token is not None:
        response.set_cookie(REFRESH_COOKIE, refresh_token, max_age=settings.session_ttl_seconds,
                            path=COOKIE_PATH, httponly=True, samesite="Strict", secure=secure)


def clear_console_cookies(response: web.StreamResponse) -> None:
    for name in (ACCESS_COOKIE, REFRESH_COOKIE):
        response.del_cookie(name, path=COOKIE_PATH)


def finish(call: ConsoleCall, response: web.StreamResponse) -> web.StreamResponse:
    """``response`` with the renewed session's cookies, when the call refreshed it."""
    if call.renewed is not None:
        set_console_cookies(response, access_token=call.renewed.access_token,
                            refresh_token=call.renewed.refresh_token, settings=call.settings)
    return response


async def _claims(request: web.Request, actor: Actor) -> tuple[AccessClaims, Grant | None]:
    """The verified claims of the console session, refreshed first when its access token has
    expired (or its cookie is gone) and a refresh token is there. Raises NoSession."""
    app = request.app
    settings = app[SETTINGS]
    token = request.cookies.get(ACCESS_COOKIE) or None
    refresh = request.cookies.get(REFRESH_COOKIE) or None
    if token is not None:
        try:
            return await verify_access(app[SIGNING_KEYS], settings, token), None
        except NoSession:
            if refresh is None:
                raise
    if refresh is None:
        raise NoSession(details={"reason": "missing"})
    grant = await sessions.refresh(app[PG_POOL], actor, token=refresh, tokens=app[TOKENS],
                                   kms=app[KMS], settings=settings, iat=int(time.time()))
    return await verify_access(app[SIGNING_KEYS], settings, grant.access_token), grant


@dataclass(frozen=True)
class Console:
    """The console session (module docstring). An action without one answers 401
    ``no_session``, and 403 ``forbidden`` from another origin or without the session's CSRF
    token. A ``page`` without one is still called, with no ``operator``: :func:`page_route`
    parses its query first (a malformed one is refused whoever asks) and then answers a
    redirect to the sign-in page."""

    page: bool = False
    security: tuple[Security, ...] = ()
    scopes: tuple[str, ...] = ()
    names_project: bool = False

    async def __call__(self, request: web.Request) -> ConsoleCall:
        app = request.app
        unsafe = request.method not in SAFE_METHODS
        if unsafe:
            check_same_origin(request, app[SETTINGS])
        actor = request_actor(request, "anonymous", None)
        try:
            claims, renewed = await _claims(request, actor)
            async with app[PG_POOL].acquire() as conn:
                operator = await service.console_operator(conn, claims)
        except NoSession:
            if not self.page:
                raise
            return ConsoleCall(request, actor)
        if unsafe:
            service.check_csrf(app[KMS], claims.sid, request.headers.get(CSRF_HEADER))
        return ConsoleCall(request, actor.as_operator(operator.id, project_id=claims.pid), claims,
                           operator=operator, renewed=renewed)


PAGE: Final = Console(page=True)  # no security in the document: without it, a 303, not a 401
ACTION: Final = Console(security=("console_session",))


async def _projects(call: ConsoleCall, project_id: str | None) -> tuple[list[ProjectRef],
                                                                        ProjectRef | None]:
    projects = await service.console_projects(call.pool, call.signed_in.tenant_id)
    return projects, service.chosen_project(projects, project_id)


async def _project(call: ConsoleCall, project_id: str) -> ProjectRef:
    """The project of an action, one of the operator's tenant. Raises NotFound."""
    _, project = await _projects(call, project_id)
    assert project is not None
    return project


def _page(call: ConsoleCall, *, title: str, section: str, projects: list[ProjectRef],
          project: ProjectRef | None, main: str, script: str = "") -> web.StreamResponse:
    csrf = service.csrf_token(call.app[KMS], call.session_claims.sid)
    return finish(call, page(lambda nonce: pages.layout(
        nonce, title=title, section=section, operator=call.signed_in, projects=projects,
        project=project, csrf=csrf, main=main, script=script), forms=True))


def _reply(call: ConsoleCall, data: Any) -> web.StreamResponse:
    return finish(call, call.reply(data))


def _parse(model: type[Any], values: dict[str, str | None]) -> tuple[Any, str | None]:
    """``values`` (those given) as ``model``, or None and why not (shown on the page)."""
    try:
        return parse_model(model, {k: v for k, v in values.items() if v is not None}), None
    except InvalidRequest as err:
        return None, err.message


def see_other(location: str) -> web.Response:
    """A 303 to ``location`` (the body as aiohttp's own redirects write it)."""
    return web.Response(status=303, text="303: See Other", headers={"Location": location})


PageHandler = Callable[..., Awaitable[web.StreamResponse]]


def page_route(path: str, *, replies: list[Reply],
               errors: tuple[type[ServiceError], ...] = ()) -> Callable[[PageHandler], PageHandler]:
    """Register the page ``GET path`` (``endpoint`` with :data:`PAGE`): called for a signed-in
    operator; anyone else is sent to the sign-in page (the console's cookies cleared), once the
    query has been parsed."""
    def register(handler: PageHandler) -> PageHandler:
        @functools.wraps(handler)
        async def signed_in_only(call: ConsoleCall, **kwargs: Any) -> web.StreamResponse:
            if call.operator is None:
                response = see_other(SIGN_IN)
                if ACCESS_COOKIE in call.request.cookies or REFRESH_COOKIE in call.request.cookies:
                    clear_console_cookies(response)
                return response
            return await handler(call, **kwargs)

        endpoint(routes, "GET", path, auth=PAGE, allow_head=False, errors=[NotFound, *errors],
                 replies=[*replies, _TO_SIGN_IN])(signed_in_only)
        return handler

    return register


# --- signing in -----------------------------------------------------------------------------------


@page_route("/console", replies=[])
async def get_console(call: ConsoleCall) -> web.StreamResponse:
    """The console: its first page (the recovery queue) for a signed-in operator, else the
    sign-in page."""
    return finish(call, see_other(HOME))


@endpoint(routes, "GET", SIGN_IN, auth=auth.Anonymous(), allow_head=False,
          replies=[Reply(200, "The page.", content_type=_HTML)])
async def get_console_sign_in(call: Call) -> web.Response:
    """The console's sign-in page: the operator's e-mail address, to send a sign-in link to."""
    return page(pages.sign_in)


@endpoint(routes, "POST", SIGN_IN, auth=auth.Anonymous(),
          errors=[InvalidEmail, RateLimited, ServiceUnavailable],
          replies=[Reply(200, "Sent, if the address is an operator's.", SignInSent)])
async def post_console_sign_in(call: Call, body: SignInBody) -> web.Response:
    """Send a console sign-in link to an operator's e-mail address: one for each tenant it is
    an operator of.

    The same answer whether or not the address is an operator's. Rate limited as magic links
    are, per address and per client (429 with `Retry-After`)."""
    sent = await service.send_sign_in_links(
        call.pool, email=body.email, ip=call.actor.ip, limits=call.app[SEND_LIMITS],
        kms=call.app[KMS], settings=call.settings)
    return call.reply(sent)


@endpoint(routes, "GET", service.CONSOLE_LANDING, auth=auth.Anonymous(), allow_head=False,
          replies=[Reply(200, "The page.", content_type=_HTML)])
async def get_console_verify(call: Call) -> web.Response:
    """Where an operator's sign-in link lands: a button that redeems it and opens the console.

    Opening it never uses the link up; the token is in the URL's fragment, which the server
    never receives."""
    return page(pages.verify)


@endpoint(routes, "POST", "/console/session", auth=auth.Anonymous(), json_only=True,
          errors=[NoSession, Forbidden],
          replies=[Reply(200, "Signed in: the console's cookies are set.", ConsoleSession)])
async def post_console_session(call: Call, body: SessionBody) -> web.Response:
    """Open a console session from a sign-in to the tenant's operator project (the tokens
    `POST /v1/auth/magic-link/verify` answered).

    401 `no_session` unless the access token is valid, its session active and its user an
    operator. The tokens go into HttpOnly, SameSite=Strict cookies of path `/console`; the
    sign-in's own `service_session` cookie is cleared."""
    check_same_origin(call.request, call.settings)
    claims = await verify_access(call.app[SIGNING_KEYS], call.settings, body.access_token)
    async with call.connection() as conn:
        operator = await service.console_operator(conn, claims)
    response = call.reply(ConsoleSession(operator, service.csrf_token(call.app[KMS], claims.sid)))
    set_console_cookies(response, access_token=body.access_token,
                        refresh_token=body.refresh_token, settings=call.settings)
    if call.request.cookies.get(SESSION_COOKIE) == body.access_token:
        response.del_cookie(SESSION_COOKIE, path="/")  # the console's cookies carry it now
    return response


@endpoint(routes, "POST", "/console/sign-out", auth=ACTION, errors=[NoSession, Forbidden],
          replies=[Reply(200, "Signed out: the session is revoked, the cookies cleared.",
                         SignedOut)])
async def post_console_sign_out(call: ConsoleCall) -> web.Response:
    """Sign out of the console: its session is revoked."""
    async with call.connection() as conn:
        await service.sign_out(conn, call.actor, claims=call.session_claims)
    response = call.reply(SignedOut(True))
    clear_console_cookies(response)
    return response


@endpoint(routes, "POST", SIGN_IN + "/passkey", auth=auth.Anonymous(), errors=[InvalidRequest],
          replies=[Reply(200, "Request options for navigator.credentials.get: any passkey of the "
                              "console.", RequestOptions)])
async def post_console_sign_in_passkey(call: Call) -> web.Response:
    """Start signing in to the console with a passkey, without an address (usernameless).

    The options name no credential (`allowCredentials` empty): the browser offers the
    operator's console passkeys (discoverable credentials of the service's own relying party),
    and the one chosen says who signs in, and in which tenant. The page sends the credential to
    `POST /console/sign-in/passkey/verify` and the tokens it answers to `POST /console/session`.
    No body. 400 `invalid_request` naming `webauthn` when the service's base URL can be no
    relying party's (an IP address, plain HTTP off localhost)."""
    async with call.connection() as conn:
        options = await service.passkey_sign_in_options(conn, settings=call.settings)
    return call.reply(options)


@endpoint(routes, "POST", SIGN_IN + "/passkey/verify", auth=auth.Anonymous(), json_only=True,
          errors=[UnknownOrExpiredChallenge, VerificationFailed, InvalidRequest, StepUpRequired,
                  BlockedByRiskPolicy],
          replies=[Reply(200, "Signed in to the operator project: hand the tokens to "
                              "POST /console/session.", Grant)])
async def post_console_sign_in_passkey_verify(
        call: Call, body: AuthenticationResponseBody) -> web.Response:
    """Finish signing in to the console with a passkey: the browser's
    `PublicKeyCredential.toJSON()` for the options of `POST /console/sign-in/passkey`.

    The credential's user handle names the operator, and so the tenant's operator project,
    where it signs in as any passkey login does (risk scoring, `auth.signin_attempt` with
    method `passkey`). Answers what a sign-in answers, without setting a cookie: the page
    hands the tokens to `POST /console/session`. 400 `verification_failed` (`details.reason`
    `not_an_operator`) for a passkey that is no operator's; 401 `step_up_required` with
    `details.project_id`, the operator project the step-up calls (`/v1/auth/step-up/...`) are
    made in."""
    iat = int(time.time())
    async with call.connection() as conn:
        s = await service.passkey_sign_in(conn, call.actor, credential=body,
                                          device=client_device(call.request),
                                          settings=call.settings, iat=iat,
                                          risk_engine=call.app[RISK])
    grant = await sessions.grant(call.app[TOKENS], call.settings, project_id=s.project_id,
                                 session=s.session, user=s.user, iat=iat,
                                 refresh_token=s.refresh_token)
    return call.reply(grant)


# --- the operator's passkeys ----------------------------------------------------------------------

_PASSKEYS: Final = "/console/passkeys"


@page_route(_PASSKEYS, replies=[_PAGE])
async def get_console_passkeys(call: ConsoleCall, query: ConsolePageQuery) -> web.StreamResponse:
    """The signed-in operator's passkeys (for signing in to the console), with Add and
    Remove."""
    projects, project = await _projects(call, query.project_id)
    error = None
    try:
        async with call.connection() as conn:
            await service.ensure_relying_party(conn, call.session_claims.pid, call.settings)
    except InvalidRequest as err:
        error = err.message
    mine = await passkeys.list_passkeys(call.pool, _own(call),
                                        user_id=call.session_claims.sub)
    return _page(call, title="Your passkeys", section="passkeys", projects=projects,
                 project=project, main=pages.passkeys(mine, error=error),
                 script=pages.PASSKEYS_SCRIPT)


def _own(call: ConsoleCall) -> Actor:
    """The operator's own user in the operator project (``service.passkey_actor``)."""
    return service.passkey_actor(call.actor, call.session_claims)


@endpoint(routes, "POST", _PASSKEYS + "/options", auth=ACTION, json_only=True,
          errors=[NoSession, Forbidden, InvalidRequest, UserNotFound],
          replies=[Reply(200, "Creation options for navigator.credentials.create.",
                         CreationOptions)])
async def post_console_passkey_options(call: ConsoleCall,
                                       body: RegistrationOptionsBody) -> web.StreamResponse:
    """Start adding a passkey to the signed-in operator (their user in the operator project,
    whose relying party is the service's own host and base URL).

    What `POST /v1/auth/passkey/register/options` does for a signed-in user. 400
    `invalid_request` naming `webauthn` when the service's base URL can be no relying party's."""
    async with call.connection() as conn:
        await service.ensure_relying_party(conn, call.session_claims.pid, call.settings)
        account = await service.operator_project_name(call.pool, call.signed_in.tenant_id)
        options = await passkeys.registration_options(conn, _own(call), name=body.name,
                                                      settings=call.settings, account=account)
    return _reply(call, options)


@endpoint(routes, "POST", _PASSKEYS, auth=ACTION, json_only=True,
          errors=[NoSession, Forbidden, UnknownOrExpiredChallenge, VerificationFailed,
                  InvalidRequest],
          replies=[Reply(201, "The passkey, added.", Passkey)])
async def post_console_passkeys(call: ConsoleCall,
                                body: RegistrationResponseBody) -> web.StreamResponse:
    """Finish adding a passkey to the signed-in operator: the browser's
    `PublicKeyCredential.toJSON()` at top level (`passkey.created` in the operator project)."""
    async with call.connection() as conn:
        passkey = await passkeys.register(conn, _own(call), credential=body)
    return finish(call, call.reply(passkey, status=201))


@endpoint(routes, "POST", _PASSKEYS + "/{passkey_id}/remove", auth=ACTION,
          errors=[NoSession, Forbidden, NotFound, UserNotFound],
          replies=[Reply(200, "The passkey, removed: it signs no one in any more.", Passkey)])
async def post_console_passkey_remove(call: ConsoleCall) -> web.StreamResponse:
    """Remove one of the signed-in operator's passkeys (`passkey.deleted` in the operator
    project)."""
    async with call.connection() as conn:
        passkey = await passkeys.remove_passkey(conn, _own(call), user_id=call.session_claims.sub,
                                                passkey_id=call.path("passkey_id"))
    return _reply(call, passkey)


# --- the recovery queue ---------------------------------------------------------------------------


@page_route(HOME, replies=[_PAGE])
async def get_console_recovery(call: ConsoleCall, query: ConsolePageQuery) -> web.StreamResponse:
    """The recovery queue of a project: its pending requests, oldest first, each with Approve
    and Deny."""
    projects, project = await _projects(call, query.project_id)
    requests: list[RecoveryRequest] = []
    more, error = "", None
    if project is not None:
        listing = Listing(recovery.LISTING, project.id, call.app[CURSOR_SECRET])
        parsed, error = _parse(RecoveryQuery, {"status": "pending", "limit": "50",
                                               "cursor": query.cursor})
        if parsed is not None:
            try:
                found = await recovery.list_requests(call.pool, listing, parsed)
            except InvalidRequest as err:
                error = err.message
            else:
                requests = found.data
                more = pages.next_link(HOME, "Later requests", found.next_cursor,
                                       project_id=project.id)
    main = pages.recovery(requests, error=error, more=more)
    return _page(call, title="Recovery requests", section="recovery", projects=projects,
                 project=project, main=main)


_RECOVERY: Final = "/console/recovery/{recovery_id}"


@endpoint(routes, "POST", _RECOVERY + "/approve", auth=ACTION,
          errors=[NoSession, Forbidden, NotFound, RecoveryRequestNotFound,
                  RecoveryRequestNotPending, EmailInUse, PhoneInUse],
          replies=[Reply(200, "Approved: the recovery link is on its way.", RecoveryRequest)])
async def post_console_recovery_approve(call: ConsoleCall, query: ActionQuery,
                                        body: DecisionBody) -> web.StreamResponse:
    """Approve a pending recovery request of the project, as the signed-in operator.

    What `POST /v1/recovery/requests/{recovery_id}/approve` does, recorded as the operator's."""
    project = await _project(call, query.project_id)
    async with call.connection() as conn:
        decided = await recovery.approve(conn, call.acting_in(project),
                                         recovery_id=call.path("recovery_id"), note=body.note,
                                         kms=call.app[KMS], settings=call.settings)
    return _reply(call, decided)


@endpoint(routes, "POST", _RECOVERY + "/deny", auth=ACTION,
          errors=[NoSession, Forbidden, NotFound, RecoveryRequestNotFound,
                  RecoveryRequestNotPending],
          replies=[Reply(200, "Denied.", RecoveryRequest)])
async def post_console_recovery_deny(call: ConsoleCall, query: ActionQuery,
                                     body: DecisionBody) -> web.StreamResponse:
    """Deny a pending recovery request of the project, as the signed-in operator."""
    project = await _project(call, query.project_id)
    async with call.connection() as conn:
        decided = await recovery.deny(conn, call.acting_in(project),
                                      recovery_id=call.path("recovery_id"), note=body.note)
    return _reply(call, decided)


# --- device sign-ins (authio login) ---------------------------------------------------------------


@page_route("/console/devices", replies=[_PAGE])
async def get_console_devices(call: ConsoleCall, query: DevicePageQuery) -> web.StreamResponse:
    """Approve or deny the code `authio login` shows, for a project of the tenant."""
    projects, project = await _projects(call, query.project_id)
    return _page(call, title="Device sign-ins", section="devices", projects=projects,
                 project=project, main=pages.devices(user_code=query.user_code, project=project))


@endpoint(routes, "POST", "/console/devices/approve", auth=ACTION,
          errors=[NoSession, Forbidden, NotFound, InvalidRequest],
          replies=[Reply(200, "Decided.", Approval)])
async def post_console_device_approve(call: ConsoleCall, query: ActionQuery,
                                      body: ApproveBody) -> web.StreamResponse:
    """Approve (or, with `"decision": "deny"`, refuse) the device showing `user_code`, for the
    project, as the signed-in operator.

    What `POST /v1/cli/device/approve` does with a full-access key: the device's next poll
    receives a new key of the project."""
    project = await _project(call, query.project_id)
    async with call.connection() as conn:
        approval = await devices.decide(conn, call.acting_in(project), body=body)
    return _reply(call, approval)


# --- API keys -------------------------------------------------------------------------------------


@page_route("/console/api-keys", replies=[_PAGE])
async def get_console_api_keys(call: ConsoleCall, query: ConsolePageQuery) -> web.StreamResponse:
    """The project's API keys (never their secrets), each active one with Revoke."""
    projects, project = await _projects(call, query.project_id)
    keys: list[ApiKey] = []
    more, error = "", None
    if project is not None:
        listing = Listing("api_keys", project.id, call.app[CURSOR_SECRET])
        parsed, error = _parse(PageQuery, {"limit": "100", "cursor": query.cursor})
        if parsed is not None:
            try:
                found = await tenancy.list_api_keys(call.pool, listing, parsed)
            except InvalidRequest as err:
                error = err.message
            else:
                keys = found.data
                more = pages.next_link("/console/api-keys", "More keys", found.next_cursor,
                                       project_id=project.id)
    return _page(call, title="API keys", section="api-keys", projects=projects, project=project,
                 main=pages.api_keys(keys, error=error, more=more))


@endpoint(routes, "POST", "/console/api-keys/{key_id}/revoke", auth=ACTION,
          errors=[NoSession, Forbidden, NotFound],
          replies=[Reply(200, "The key, revoked.", ApiKey)])
async def post_console_api_key_revoke(call: ConsoleCall, query: ActionQuery) -> web.StreamResponse:
    """Revoke an API key of the project, as the signed-in operator: every process refuses it at
    once. Idempotent."""
    project = await _project(call, query.project_id)
    async with call.connection() as conn:
        key = await tenancy.revoke_api_key(conn, call.acting_in(project),
                                           key_id=call.path("key_id"),
                                           authenticator=call.app[AUTHENTICATOR])
    return _reply(call, key)


# --- the audit log --------------------------------------------------------------------------------


def _filters(query: AuditPageQuery) -> dict[str, str | None]:
    return {"type": query.type, "actor": query.actor, "user": query.user, "from": query.since,
            "to": query.to, "q": query.q}


@page_route("/console/audit", replies=[_PAGE])
async def get_console_audit(call: ConsoleCall, query: AuditPageQuery) -> web.StreamResponse:
    """The project's audit log, newest first, with the log's filters and links to its exports.

    A filter the log refuses (a time that is not ISO 8601, `to` before `from`) is said on the
    page."""
    projects, project = await _projects(call, query.project_id)
    filters = _filters(query)
    events, more, error = None, "", None
    if project is not None:
        parsed, error = _parse(EventsQuery, {**filters, "cursor": query.cursor, "limit": "50"})
        if parsed is not None:
            try:
                found = await audit.list_events(
                    call.pool, audit.listing(project.id, call.app[CURSOR_SECRET]), parsed)
            except InvalidRequest as err:
                error = err.message
            else:
                events = found.data
                more = pages.next_link("/console/audit", "Older events", found.next_cursor,
                                       project_id=project.id, **filters)
    return _page(call, title="Audit log", section="audit", projects=projects, project=project,
                 main=pages.audit(events, project=project, filters=filters, error=error,
                                  more=more))


async def _export(call: ConsoleCall, query: AuditPageQuery, fmt: audit.ExportFormat,
                  content_type: str) -> web.StreamResponse:
    _, project = await _projects(call, query.project_id)
    if project is None:
        raise NotFound("This tenant has no project.")
    export_query: ExportQuery = parse_model(ExportQuery, {
        k: v for k, v in {**_filters(query), "cursor": query.cursor}.items() if v is not None})
    response = streamed_response(call.request, content_type,
                                 filename=audit.export_filename(project.id, fmt))
    finish(call, response)
    listing = audit.listing(project.id, call.app[CURSOR_SECRET])
    async with audit.open_export(call.pool, listing, export_query, fmt) as export:
        if export.next_cursor is not None:
            response.headers["Service-Next-Cursor"] = export.next_cursor
        return await stream_body(call.request, response, export.chunks,
                                 what="console audit export", logger=log)


_EXPORT_HEADERS: Final = {
    "Content-Disposition": "attachment; filename=audit-events-<project>-<time>.<ext>",
    "Service-Next-Cursor": "Present when more events remain past the cap of 100,000.",
}


@page_route("/console/audit/events.csv", errors=(InvalidRequest,),
            replies=[Reply(200, "RFC 4180 CSV with a header row.", content_type="text/csv",
                           headers=_EXPORT_HEADERS)])
async def get_console_audit_csv(call: ConsoleCall, query: AuditPageQuery) -> web.StreamResponse:
    """Export the project's audit events that pass the page's filters, as CSV (what
    `GET /v1/audit/events.csv` answers)."""
    return await _export(call, query, "csv", "text/csv")


@page_route("/console/audit/events.jsonl", errors=(InvalidRequest,),
            replies=[Reply(200, "One full event (with metadata) per line.",
                           content_type="application/x-ndjson", headers=_EXPORT_HEADERS)])
async def get_console_audit_jsonl(call: ConsoleCall,
                                  query: AuditPageQuery) -> web.StreamResponse:
    """Export the project's audit events that pass the page's filters, as JSON lines."""
    return await _export(call, query, "jsonl", "application/x-ndjson")


__all__ = ["ACCESS_COOKIE", "CSRF_HEADER", "REFRESH_COOKIE", "ConsoleCall", "routes"]
