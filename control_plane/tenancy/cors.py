"""CORS for the public routes (DESIGN.md "the browser (CORS)"; the Fetch standard's "CORS
protocol", https://fetch.spec.whatwg.org/#http-cors-protocol).

A web application on its own origin calls ``/v1/auth/*`` and ``/v1/sessions/*`` from its pages.
A project allows the origins of its relying party (``webauthn.origins``) and its
``cors_origins`` (``PATCH /v1/projects/me``). The request names its project as the call would
without headers: the ``project_id`` query parameter, else the request's host among the
project's ``domains`` (a preflight carries no ``Service-Project`` header: it is what the
preflight asks permission for).

* A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) from an
  allowed origin answers 204 with ``Access-Control-Allow-Origin`` echoing it,
  ``Access-Control-Allow-Credentials: true``, ``Access-Control-Allow-Methods`` (the path's
  methods), ``Access-Control-Allow-Headers`` (what was asked among :data:`ALLOWED_HEADERS`),
  ``Access-Control-Max-Age`` (:data:`MAX_AGE` seconds) and ``Vary: Origin``. From any other
  origin (or naming no project, or an unknown one) it answers 403 ``forbidden``
  (``details.reason`` ``origin_not_allowed``) with no ``Access-Control-Allow-*`` header, so the
  browser refuses the call. An ``OPTIONS`` that is no preflight answers 204 with ``Allow``.
* Every other answer of a public route to a request with an allowed ``Origin`` (errors and
  redirects too) carries ``Access-Control-Allow-Origin``, ``Access-Control-Allow-Credentials:
  true``, ``Access-Control-Expose-Headers`` (``X-Request-Id``, ``Retry-After``) and
  ``Vary: Origin``; to any other origin, only ``Vary: Origin``.
* A call presenting a session token (Bearer, else the ``service_session`` cookie) whose
  (unverified) ``pid`` is another project's than the one the request names gets no CORS header
  either: a page allowed by project A never reads the answer to a session of project B (a
  cookie a same-site page's call carries along, say).
* An unsafe call from an allowed origin authenticated by the session cookie alone passes the
  cookie's CSRF check (``web.auth.check_same_origin``): the project trusts that origin as its
  own (a page on ``app.example.com`` with authio on ``auth.example.com``, the same site).
* Management routes get no ``OPTIONS`` route (405 as before) and no CORS header ever.

The allowed origins of a project (and the project of a host) are cached per process for
:data:`CACHE_SECONDS`: ``PATCH /v1/projects/me`` forgets them in the process that served it at
once; another process follows within :data:`CACHE_SECONDS`. The layer costs nothing to a
request without ``Origin`` (servers, the engine's checks) beyond one header lookup on the
public routes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

from aiohttp import web

from common.access_tokens import SESSION_COOKIE, unverified_pid
from common.appkeys import PG_POOL
from common.errors import Forbidden
from common.http import ALLOWED_ORIGIN, REFUSAL_HEADERS, Handler
from common.ids import is_id
from common.routing import Operation
from control_plane.tenancy import service

PUBLIC_PREFIXES: Final = ("/v1/auth/", "/v1/sessions/")
"""The public routes a browser may call from another origin (DESIGN.md)."""
ALLOWED_HEADERS: Final = ("content-type", "authorization", "service-project", "x-request-id")
"""The request headers a preflight may be granted (lower case, as browsers ask for them)."""
EXPOSED_HEADERS: Final = "X-Request-Id, Retry-After"
MAX_AGE: Final = 600
"""Seconds a browser may keep a preflight's answer (Chromium caps it at 7200, Firefox 86400)."""
CACHE_SECONDS: Final = 10.0
"""How long a process keeps a project's allowed origins: the bound on how late another process
follows a ``PATCH /v1/projects/me``."""
CACHE_ENTRIES: Final = 10_000
"""Entries per cache (projects, hosts); it starts over when full (a flood of made-up
``project_id`` values costs a query each, as the call itself would)."""
_K = TypeVar("_K")
_V = TypeVar("_V")


def is_public(path: str) -> bool:
    """Whether ``path`` (a route's template or a request's path) is a public route."""
    return path.startswith(PUBLIC_PREFIXES)


class OriginCache:
    """Per process: the allowed origins of a project and the project of a host, each kept
    :data:`CACHE_SECONDS` (``clock``: seconds, monotonic)."""

    def __init__(self, *, ttl: float = CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl, self._clock = ttl, clock
        self._origins: dict[str, tuple[float, frozenset[str]]] = {}
        self._hosts: dict[str, tuple[float, str | None]] = {}

    async def allowed(self, request: web.Request) -> frozenset[str]:
        """The origins ``request``'s project allows (empty when it names none, or no project
        exists by that name, or the session token it presents is another project's). Raises
        what the pool raises (an outage: 503 as any call)."""
        project_id = await self._project(request)
        if project_id is None:
            return frozenset()
        token = _presented_token(request)
        if token is not None and unverified_pid(token) not in (None, project_id):
            # A session of another project (the cookie of a same-site page, say): that
            # project's answer is not for this project's origins to read.
            return frozenset()
        now = self._clock()
        hit = self._origins.get(project_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        origins = await service.allowed_origins(request.app[PG_POOL], project_id)
        _put(self._origins, project_id, (now + self._ttl, origins))
        return origins

    async def _project(self, request: web.Request) -> str | None:
        named = request.query.get("project_id")
        if named is not None:
            return named if is_id(named, "proj") else None
        host = (request.url.host or "").lower()
        if not host:
            return None
        now = self._clock()
        hit = self._hosts.get(host)
        if hit is not None and hit[0] > now:
            return hit[1]
        project_id = await service.project_of_host(request.app[PG_POOL], host)
        _put(self._hosts, host, (now + self._ttl, project_id))
        return project_id

    def forget(self, project_id: str) -> None:
        """Drop what is kept of ``project_id`` and every host (its domains may have changed)."""
        self._origins.pop(project_id, None)
        self._hosts.clear()


def _presented_token(request: web.Request) -> str | None:
    """The session token the call presents, as ``web.auth`` reads it: Bearer, else the
    ``service_session`` cookie (None: none)."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(SESSION_COOKIE) or None


def _put(cache: dict[_K, _V], key: _K, value: _V) -> None:
    if len(cache) >= CACHE_ENTRIES:
        cache.clear()
    cache[key] = value


def answer_headers(origin: str) -> dict[str, str]:
    """The headers of an answer to an allowed ``origin`` (not a preflight)."""
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true",
            "Access-Control-Expose-Headers": EXPOSED_HEADERS, "Vary": "Origin"}


def _vary(response: web.StreamResponse | web.HTTPException, headers: dict[str, str]) -> None:
    vary = response.headers.get("Vary")
    response.headers.update(headers)
    if vary and "origin" not in vary.lower():
        response.headers["Vary"] = f"{vary}, Origin"


def decorated(handler: Handler, cache: Callable[[web.Request], OriginCache]) -> Handler:
    """``handler`` whose answers (errors and redirects too: the envelope adds the request's
    ``REFUSAL_HEADERS``) carry the CORS headers when the request's ``Origin`` is allowed, and
    ``Vary: Origin`` when it has one."""

    @functools.wraps(handler)
    async def with_cors(request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        allowed = origin in await cache(request).allowed(request)
        headers = answer_headers(origin) if allowed else {"Vary": "Origin"}
        if allowed:
            request[ALLOWED_ORIGIN] = origin
        request[REFUSAL_HEADERS] = headers
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # a redirect, or an error aiohttp raised
            _vary(exc, headers)
            raise
        if not response.prepared:
            _vary(response, headers)
        return response

    return with_cors


def preflight(methods: Iterable[str], cache: Callable[[web.Request], OriginCache]) -> Handler:
    """The ``OPTIONS`` handler of a public path answering ``methods``."""
    allow = ", ".join(sorted({*methods, "OPTIONS"} | ({"HEAD"} if "GET" in methods else set())))

    async def answer_preflight(request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        asked = request.headers.get("Access-Control-Request-Method")
        if origin is None or asked is None:  # a plain OPTIONS: what the path answers
            return web.Response(status=204, headers={"Allow": allow})
        if origin not in await cache(request).allowed(request):
            request[REFUSAL_HEADERS] = {"Vary": "Origin"}
            raise Forbidden(
                "This origin may not call this project's public endpoints: add it to the "
                "project's cors_origins (PATCH /v1/projects/me), and name the project with the "
                "project_id query parameter or one of its domains.",
                details={"reason": "origin_not_allowed", "origin": origin})
        wanted = {h.strip().lower()
                  for h in request.headers.get("Access-Control-Request-Headers", "").split(",")}
        granted = [h for h in ALLOWED_HEADERS if h in wanted]
        headers = {"Access-Control-Allow-Origin": origin,
                   "Access-Control-Allow-Credentials": "true",
                   "Access-Control-Allow-Methods": allow,
                   "Access-Control-Max-Age": str(MAX_AGE),
                   "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"}
        if granted:
            headers["Access-Control-Allow-Headers"] = ", ".join(granted)
        return web.Response(status=204, headers=headers)

    return answer_preflight


def mount(operations: Iterable[Operation], resources: dict[str, web.Resource],
          cache: Callable[[web.Request], OriginCache]) -> None:
    """Add the preflight (``OPTIONS``) route to each public path among ``resources`` (by their
    declared path, as ``RouteTable.mount`` returns them)."""
    methods: dict[str, set[str]] = {}
    for op in operations:
        if is_public(op.path):
            methods.setdefault(op.path, set()).add(op.method)
    for path, its in methods.items():
        resources[path].add_route("OPTIONS", preflight(its, cache))
