"""How a route authenticates its caller: one object per kind, which both authenticates a
request into a :class:`~control_plane.web.actor.Call` and tells the OpenAPI document how.

* ``ApiKey(*scopes)``: ``Authorization: Bearer sk_...`` holding one of ``scopes`` (none: any
  key; DESIGN.md "API keys"). The actor is the key. Raises MissingApiKey, InvalidApiKey,
  InsufficientScope.
* ``Session(check)``: the access token as ``Authorization: Bearer`` or the ``service_session``
  cookie (SPEC.md 3 "S"), verified by ``common.access_tokens``; with ``check``, the session
  itself must still be active before the body is read. The actor is the user. Raises NoSession;
  an unsafe method authenticated by the cookie alone raises Forbidden when a browser says the
  request came from another origin (``check_same_origin``).
* ``Bootstrap()``: ``x-service-bootstrap-token`` (SPEC.md 4 rule 1), compared in constant time.
  The actor is the operator. Raises BootstrapDisabled, MissingBootstrapToken.
* ``Public()``: a public route naming its project (DESIGN.md "project of public endpoints").
  The actor is anonymous, in that project. Raises InvalidRequest, ProjectNotFound.
* ``Anonymous()``: nobody in particular; the actor is anonymous.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import urlsplit

import asyncpg
from aiohttp import web

from common.access_tokens import AccessClaims, InvalidToken, KeySource, verify_access_token
from common.appkeys import AUTHENTICATOR, PG_POOL, SETTINGS, SIGNING_KEYS
from common.auth import Principal
from common.errors import (
    BootstrapDisabled,
    Forbidden,
    InsufficientScope,
    MissingBootstrapToken,
    NoSession,
)
from common.http import ALLOWED_ORIGIN, client_ip
from common.routing import Security
from common.settings import Settings
from control_plane.web.actor import Actor, ActorType, Call
from control_plane.web.cookies import SESSION_COOKIE
from control_plane.web.public_project import resolve_project

BOOTSTRAP_HEADER: Final = "x-service-bootstrap-token"

SessionCheck = Callable[[asyncpg.Connection, AccessClaims], Awaitable[None]]
"""Raises NoSession unless the session of the claims is still active (``sessions.service``)."""


class Auth(Protocol):
    """A way to authenticate a route's caller."""

    @property
    def security(self) -> tuple[Security, ...]: ...

    @property
    def scopes(self) -> tuple[str, ...]: ...

    @property
    def names_project(self) -> bool: ...

    async def __call__(self, request: web.Request) -> Call: ...


def request_actor(request: web.Request, type: ActorType, id: str | None, *,
                  project_id: str | None = None, api_key: Principal | None = None) -> Actor:
    """An actor of ``request``: ``type`` and ``id``, with the client's IP (behind
    ``SERVICE_TRUSTED_PROXIES``) and user agent."""
    return Actor(type=type, id=id, project_id=project_id, api_key=api_key,
                 ip=client_ip(request, request.app[SETTINGS].trusted_proxy_networks),
                 user_agent=request.headers.get("User-Agent"))


class ApiKey:
    """An API key holding at least one of ``scopes`` (none given: any key); with
    ``full_access``, only a key created without scopes (for what no scope is enough for, such
    as reading live sign-in links; ``refusal`` says why)."""

    security: Final[tuple[Security, ...]] = ("api_key",)
    names_project: Final = False

    def __init__(self, *scopes: str, full_access: str | None = None) -> None:
        self.scopes: Final = scopes
        self.full_access: Final = full_access

    async def __call__(self, request: web.Request) -> Call:
        principal = await request.app[AUTHENTICATOR].authenticate(
            request.headers.get("Authorization"))
        if self.full_access is not None and principal.scopes:
            raise InsufficientScope(self.full_access, details={"requires": "full_access"})
        if self.scopes and not any(principal.allows(s) for s in self.scopes):
            raise InsufficientScope(
                f"This API key needs one of the scopes {', '.join(self.scopes)}.",
                details={"required_scopes": list(self.scopes)},
            )
        return Call(request, request_actor(request, "api_key", principal.key_id,
                                           project_id=principal.project_id, api_key=principal))


def presented_access_token(request: web.Request) -> str | None:
    """The Bearer access token, else the ``service_session`` cookie (then checked to come from
    this origin, ``check_same_origin``)."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    token = request.cookies.get(SESSION_COOKIE) or None
    if token is not None:
        check_same_origin(request, request.app[SETTINGS])
    return token


SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


def check_same_origin(request: web.Request, settings: Settings) -> None:
    """Refuse a cross-origin unsafe request that a browser sent with the session cookie
    (cross-site request forgery; OWASP's CSRF cheat sheet, "Verifying Origin With Standard
    Headers", in the form Go's ``http.CrossOriginProtection`` takes).

    SameSite=Lax already keeps the cookie off cross-site POSTs; this also refuses a sibling
    origin of the same site (``evil.example.com`` against ``auth.example.com``), and browsers
    that ignore SameSite. Safe methods pass. A browser's ``Sec-Fetch-Site`` decides when sent
    (``same-origin`` or ``none``, a user's own navigation, pass); else an ``Origin`` must be
    the public base URL's origin or the ``Host`` the request was sent to. An origin the
    request's project allows (its WebAuthn ``origins`` and ``cors_origins``, on the public
    routes: ``ALLOWED_ORIGIN``, set by ``control_plane.tenancy.cors``) is trusted as this one.
    A request with neither header comes from no browser (every browser in use sends one of
    them with an unsafe request), and no browser means no ambient cookie to forge with: it
    passes. Raises Forbidden (``details.reason`` ``cross_origin``)."""
    if request.method in SAFE_METHODS:
        return
    fetch_site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if origin is not None and origin == request.get(ALLOWED_ORIGIN):
        return
    if fetch_site is not None:
        allowed = fetch_site in ("same-origin", "none") or _trusted_origin(origin, settings)
    elif origin is not None:
        allowed = _trusted_origin(origin, settings) or urlsplit(origin).netloc == request.host
    else:
        allowed = True
    if not allowed:
        raise Forbidden(
            "A request authenticated by the session cookie must come from this service's own "
            "origin or one the project allows (cors_origins); send the access token as a Bearer "
            "token from other origins.",
            details={"reason": "cross_origin", "origin": origin})


def _trusted_origin(origin: str | None, settings: Settings) -> bool:
    if origin is None or origin == "null":
        return False
    ours = urlsplit(settings.public_base_url)
    theirs = urlsplit(origin)
    return (theirs.scheme, theirs.netloc) == (ours.scheme, ours.netloc)


async def verify_access(keys: KeySource, settings: Settings, token: str) -> AccessClaims:
    """The verified claims of an access token of this deployment (``common.access_tokens``).
    Raises NoSession (``details.reason`` ``token_expired`` or ``token_invalid``)."""
    try:
        return await verify_access_token(token, keys=keys, issuer=settings.public_base_url)
    except InvalidToken as exc:
        raise NoSession(exc.message, details={"reason": f"token_{exc.reason}"}) from None


@dataclass(frozen=True)
class Session:
    """A session's access token; with ``check``, the session must also still be active (a
    route with a body checks before reading it, so a dead session is told so first)."""

    check: SessionCheck | None = None
    security: tuple[Security, ...] = ("session",)
    scopes: tuple[str, ...] = ()
    names_project: bool = False

    async def __call__(self, request: web.Request) -> Call:
        token = presented_access_token(request)
        if token is None:
            raise NoSession(details={"reason": "missing"})
        claims = await verify_access(request.app[SIGNING_KEYS], request.app[SETTINGS], token)
        if self.check is not None:
            async with request.app[PG_POOL].acquire() as conn:
                await self.check(conn, claims)
        return Call(request, request_actor(request, "user", claims.sub, project_id=claims.pid),
                    claims)


@dataclass(frozen=True)
class Bootstrap:
    """The deployment's bootstrap token (``SERVICE_BOOTSTRAP_TOKEN``)."""

    security: tuple[Security, ...] = ("bootstrap_token",)
    scopes: tuple[str, ...] = ()
    names_project: bool = False

    async def __call__(self, request: web.Request) -> Call:
        token = request.app[SETTINGS].bootstrap_token
        check_bootstrap_token(token.get_secret_value() if token else None,
                              request.headers.get(BOOTSTRAP_HEADER))
        return Call(request, request_actor(request, "operator", "bootstrap_token"))


def check_bootstrap_token(configured: str | None, presented: str | None) -> None:
    """Raises BootstrapDisabled when unconfigured, MissingBootstrapToken when wrong (constant
    time compare)."""
    if configured is None:
        raise BootstrapDisabled()
    # Digests of both sides: equal length whatever was sent, and header bytes that are not
    # UTF-8 (aiohttp keeps them as surrogate escapes) cannot make the comparison fail loudly.
    if presented is None or not hmac.compare_digest(
        hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest(),
        hashlib.sha256(configured.encode()).digest(),
    ):
        raise MissingBootstrapToken()


@dataclass(frozen=True)
class Public:
    """A public route of one project, named by the request."""

    security: tuple[Security, ...] = ()
    scopes: tuple[str, ...] = ()
    names_project: bool = True

    async def __call__(self, request: web.Request) -> Call:
        project_id = await resolve_project(request)
        return Call(request, request_actor(request, "anonymous", None, project_id=project_id))


@dataclass(frozen=True)
class Anonymous:
    """No authentication."""

    security: tuple[Security, ...] = ()
    scopes: tuple[str, ...] = ()
    names_project: bool = False

    async def __call__(self, request: web.Request) -> Call:
        return Call(request, request_actor(request, "anonymous", None))

