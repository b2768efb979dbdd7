"""Edge session validation (DESIGN.md "edge validation"): is this session valid, and may its
user do this? Asked by edge proxies (nginx ``auth_request``, Caddy/Traefik forward auth, Envoy
``ext_authz``) on every request, so answered from memory.

Routes:

* ``GET/POST /v1/edge/validate``: a JSON body ``{"user_id", "session_id", "org_id",
  "org_role", "project_id"}`` and the same as ``Service-User-Id``, ``Service-Session-Id``,
  ``Service-Org-Id``, ``Service-Org-Role``, ``Service-Project-Id`` headers (the org ones null
  and absent when no organization is selected). Bad parameters are 400 ``invalid_request``.
* ``/v1/edge/auth`` and ``/v1/edge/auth/{tail}`` (any method, any tail: the forward-auth
  form; :func:`mount` adds the methods the document does not list): the same headers and
  body, but only ever 200, 401 or 403, since nginx treats anything else as a 500 and Envoy
  allows only exactly 200. Bad permission parameters, another project's store, a check the
  engine cannot answer (loading, depth cap, PostgreSQL away) all deny with 403.

Where the parameters come from, and why every one given applies: the permission
(``store_id``, ``object``, ``relation``) may come from the query string (DESIGN.md) and, on the
forward-auth form, from the ``Service-Check-Store``, ``Service-Check-Object`` and
``Service-Check-Relation`` headers; the project pin from the ``project_id`` query parameter and
the ``Service-Project`` header. Each one given must hold (a conjunction: every check allowed,
every pin the token's project), never one instead of another. That matters because the query
string of a forward-auth call can be the client's: Envoy's HTTP ext_authz appends the original
path and query to its ``path_prefix``, and Caddy's ``forward_auth`` keeps the original query
when its ``uri`` has none. Had one source replaced the other, a client could add
``?store_id=...&object=...&relation=...`` to swap the proxy's check for one it passes, or
``?project_id=`` to replace its pin; as a conjunction, what the client adds can only refuse the
client's own request. The headers are for proxies that cannot keep the client's query away
(each proxy's own header replaces the client's: nginx ``proxy_set_header``, Caddy
``header_up``, Envoy ``headers_to_add``); behind nginx the ``auth_request`` subrequest carries
the query written in its configuration and none of the client's. Ory Oathkeeper's
``/decisions`` likewise keeps what to check in its own rules; oauth2-proxy's
``/oauth2/auth?allowed_groups=`` reads the query and holds only behind nginx.

The token: ``Authorization: Bearer`` (wins), else the ``service_session`` cookie. None is 401
``no_session``; one that does not hold is 401 ``invalid_session`` with ``details.reason``:
``signature`` (not a well-formed JWT, unknown key, bad signature or claims), ``expired``,
``project`` (the ``project_id`` query parameter or the ``Service-Project`` header names
another project), ``revoked`` (in the revocation set). The session is judged before the
permission: with ``store_id``, ``object`` and ``relation`` (query parameters, or the JSON body
of a POST to ``validate``; also the ``Service-Check-*`` headers on the forward-auth form; all
three or none from each source) the call also checks ``user:<sub>`` in the in-memory graph and
answers 403 ``forbidden`` when denied.

State (``engine.appkeys``): :data:`~engine.appkeys.REVOCATIONS`, the revocation set mirrored
from Redis by :func:`follow_session_revocations` (loaded in full at start and after every
(re)subscription, kept current from the channel, pruned past the scores), and
:data:`~engine.appkeys.JUDGE`, the request-free judgement of ``engine.sessions`` with the
tokens it verified remembered until they expire, so a repeated token costs a dict lookup, the
key's publication test and the revocation test. Keys
come from :data:`~engine.appkeys.KEYS`, every project's keys in memory (``engine.keys``): a
cached token whose key has been retired past its ``publish_until`` (or deleted) is refused with
``signature`` like a fresh one. No audit event per validation: it is a hot path; counters and
the revocation lag are OpenTelemetry metrics (``engine.edge_metrics``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Final

import orjson
from aiohttp import web
from multidict import MultiMapping
from redis.asyncio import Redis

from common.access_tokens import (
    SESSION_COOKIE,
    AccessClaims,
)
from common.appkeys import REDIS, SETTINGS
from common.db import follow_channel
from common.errors import (
    Forbidden,
    InvalidRequest,
    InvalidSession,
    NoSession,
    NotReady,
    ResolutionTooComplex,
    ServiceError,
)
from common.http import REQUEST_ID, OneWriteResponse, deny_only_under, read_json
from common.ids import is_id
from common.revocations import LEEWAY_SECONDS as REVOCATION_LEEWAY_SECONDS
from common.revocations import RevocationMirror, channel, parse_message, set_key
from common.routing import METHODS, Operation, Reply, RouteTable, summary_of
from common.runtime import every, stop_tasks
from common.tuples import TupleFormatError, validate_object, validate_relation
from engine import edge_metrics, graph
from engine.appkeys import JUDGE, KEYS, REVOCATIONS, STORES
from engine.schemas import EdgeIdentity, EdgeQuery, EdgeValidateBody
from engine.sessions import SessionJudge

__all__ = ["edge_ctx", "follow_session_revocations", "forward_auth", "mount", "routes",
           "validate"]

log = logging.getLogger(__name__)

routes = RouteTable("edge", "Session validation for edge proxies, answered from memory.")

PRUNE_SECONDS: Final = 60.0
"""How often revocation entries past their score are dropped."""

_HEADERS: Final = {
    "Service-User-Id": "The session's user id.",
    "Service-Session-Id": "The session id.",
    "Service-Org-Id": "The selected organization's id; absent when none is selected.",
    "Service-Org-Role": "The user's role in the selected organization; absent when none.",
    "Service-Project-Id": "The project the session belongs to.",
}
_REQUEST_HEADERS: Final = {
    "Service-Project": "Pins the project: a token of another project is refused (reason "
                       "`project`). With the `project_id` query parameter too, both must "
                       "name the token's project.",
}
_FORWARD_HEADERS: Final = {
    "Service-Project": "Pins the project: a token of another project is refused (reason "
                       "`project`). Set by the proxy (replacing the client's); with the "
                       "`project_id` query parameter too, both must name the token's project.",
    "Service-Check-Store": "With `Service-Check-Object` and `Service-Check-Relation` (all three "
                           "or none), the store of a permission checked for `user:<sub>` in the "
                           "same call (403 when denied). Set by the proxy, which replaces any "
                           "the client sent; a permission in the query string is checked as "
                           "well (every one given must be allowed), since the query may be the "
                           "client's.",
    "Service-Check-Object": "The object of the permission check (`type:id`).",
    "Service-Check-Relation": "The relation of the permission check.",
}
_PERMISSION: Final = ("store_id", "object", "relation")
_CHECK_STORE, _CHECK_OBJECT, _CHECK_RELATION = (
    "Service-Check-Store", "Service-Check-Object", "Service-Check-Relation")
_CHECK_HEADERS: Final = dict(zip(_PERMISSION, (_CHECK_STORE, _CHECK_OBJECT, _CHECK_RELATION),
                                 strict=True))


# -- the revocation mirror, kept from Redis ------------------------------------------------------


async def _load(redis: Redis, key: str, mirror: RevocationMirror) -> None:
    """Merge the whole sorted set ``key`` into ``mirror`` (entries past their score skipped)."""
    now = time.time()
    entries: list[Any] = await redis.zrangebyscore(key, now, "+inf", withscores=True)
    mirror.merge((m.decode() if isinstance(m, bytes) else str(m), float(s)) for m, s in entries)


class _ReloadOnReconnect:
    """A connect callback for the pub/sub connection (redis-py keeps it as a weak method):
    redis-py reconnects and subscribes again by itself, and anything announced while it was away
    was missed, so the whole set is read again each time (in a task: the callback is sync)."""

    def __init__(self, redis: Redis, key: str, mirror: RevocationMirror) -> None:
        self.redis, self.key, self.mirror = redis, key, mirror
        self.tasks: set[asyncio.Task[None]] = set()

    def connected(self, _connection: object) -> None:
        task = asyncio.get_running_loop().create_task(self._reload())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _reload(self) -> None:
        try:
            await _load(self.redis, self.key, self.mirror)
        except Exception as exc:  # the feed's own loop reads it again when it resubscribes
            log.warning("revocation set not re-read after a reconnect (%s: %s)",
                        type(exc).__name__, exc)


async def follow_session_revocations(redis: Redis, prefix: str, mirror: RevocationMirror, *,
                                     horizon_seconds: float,
                                     loaded: asyncio.Event | None = None) -> None:
    """Run forever: keep ``mirror`` equal to the revocation set (``common.revocations``).

    Subscribes to the channel first, then reads the whole set (so nothing falls between the
    two), and reads it again after every reconnection redis-py makes by itself and every
    resubscription made here after a failure (retried every second or sooner). A session heard
    on the channel is revoked for ``horizon_seconds`` (the longest an access token lives, plus
    leeway: its real score is no later); ``loaded`` is set after the first full read."""
    key = set_key(prefix)
    hook = _ReloadOnReconnect(redis, key, mirror)

    async def subscribed() -> None:
        await _load(redis, key, mirror)
        if loaded is not None:
            loaded.set()

    def revoked(text: str) -> None:
        session_id, revoked_at = parse_message(text)
        now = time.time()
        if mirror.add(session_id, now + horizon_seconds) and revoked_at is not None:
            edge_metrics.revocation_lag(now - revoked_at)

    await follow_channel(redis, channel(prefix), on_message=revoked, on_subscribed=subscribed,
                         on_reconnect=hook.connected, what="session revocation feed", logger=log)


async def edge_ctx(app: web.Application) -> AsyncIterator[None]:
    """The cleanup context of edge validation: the mirror, its feed and pruning, the cache.
    Waits (up to 2 s) for the first full read of the set, so a revoked session is refused from
    the first request on whenever Redis answers."""
    settings = app[SETTINGS]
    mirror = RevocationMirror()
    app[REVOCATIONS] = mirror
    app[JUDGE] = SessionJudge({}, app[KEYS], settings.public_base_url, mirror)
    loaded = asyncio.Event()
    horizon = settings.access_token_ttl_seconds + REVOCATION_LEEWAY_SECONDS
    feed = asyncio.create_task(follow_session_revocations(
        app[REDIS], settings.redis_prefix, mirror, horizon_seconds=horizon, loaded=loaded))

    async def prune() -> None:
        mirror.prune()

    pruner = asyncio.create_task(every(PRUNE_SECONDS, prune, what="revocation pruning",
                                       logger=log, first_after=PRUNE_SECONDS))
    try:
        async with asyncio.timeout(2.0):  # not wait_for: see tests/messages/test_outbox.py
            await loaded.wait()
    except TimeoutError:
        log.warning("revocation set not read yet; edge validation starts without it")
    try:
        yield
    finally:
        await stop_tasks(feed, pruner)


# -- judging a request -------------------------------------------------------------------------


def _token(request: web.Request) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and (value := value.strip()):
        return value
    return request.cookies.get(SESSION_COOKIE) or None


def _session(request: web.Request) -> Awaitable[AccessClaims]:
    """Judge the request's session (:meth:`engine.sessions.SessionJudge.session`) against the
    projects it pins (:func:`_pins`); the judge's own coroutine, to be awaited (no layer of
    its own on the edge's hot path)."""
    return request.app[JUDGE].session(_token(request), _pins(request))


def _pins(request: web.Request) -> tuple[str, ...]:
    """Every project the caller pins: each ``project_id`` query parameter and each
    ``Service-Project`` header (every one must be the token's: a repeated pin cannot be
    replaced by the client's value that comes first)."""
    pins = request.headers.getall("Service-Project", ())
    if request.query_string:  # a malformed one is refused by _check_pin, after the session
        pins = (*pins, *(p for p in request.query.getall("project_id", ()) if is_id(p, "proj")))
    elif not pins:  # the usual forward-auth call pins nothing
        return ()
    return tuple(p for p in pins if p)


def _check_pin(request: web.Request) -> None:
    """Raises InvalidRequest when a ``project_id`` query parameter is not a project id."""
    for pinned in request.query.getall("project_id", ()):
        if not is_id(pinned, "proj"):
            raise InvalidRequest.field("project_id", "not a project id")


def _one_each(values: MultiMapping[str], names: dict[str, str]) -> dict[str, str]:
    """``{field: value}`` for each ``names`` item (field -> name in ``values``) given once, or
    given repeatedly with one value. Raises InvalidRequest when a name carries two different
    values: which one the caller meant cannot be told, and taking the first would let a value
    placed before a proxy's (a client's query, an appended header) replace it."""
    out: dict[str, str] = {}
    for field, name in names.items():
        given = values.getall(name, ())
        if not given:
            continue
        if len(given) > 1 and len(set(given)) > 1:
            raise InvalidRequest.field(field, f"{name} given more than once with different "
                                              "values")
        out[field] = given[0]
    return out


_QUERY_NAMES: Final = {name: name for name in _PERMISSION}


def _permission(values: dict[str, Any]) -> tuple[str, str, str] | None:
    """``(store_id, object, relation)`` from ``values``, None when none is given; raises
    InvalidRequest (``details.fields``) when some are missing or malformed."""
    given: dict[str, Any] = {k: values[k] for k in _PERMISSION if values.get(k) is not None}
    if not given:
        return None
    fields: list[dict[str, str]] = []
    for name in _PERMISSION:
        value = given.get(name)
        if value is None:
            fields.append({"field": name, "message": "field required with "
                                                     "store_id, object and relation"})
        elif type(value) is not str:
            fields.append({"field": name, "message": "must be a string"})
    if not fields:
        if not is_id(given["store_id"], "store"):
            fields.append({"field": "store_id", "message": "not a store id"})
        for name, check in (("object", validate_object), ("relation", validate_relation)):
            try:
                check(given[name])
            except TupleFormatError as exc:
                fields.append({"field": name, "message": exc.message})
    if fields:
        first = fields[0]
        raise InvalidRequest(f"{first['field']}: {first['message']}", details={"fields": fields})
    return str(given["store_id"]), str(given["object"]), str(given["relation"])


async def _allowed(request: web.Request, claims: AccessClaims,
                   permission: tuple[str, str, str]) -> None:
    """Check ``user:<sub>`` against the store's graph; raises Forbidden when denied (also for a
    missing store or another project's), NotReady while the stores load, ResolutionTooComplex
    at the depth cap."""
    store_id, obj, relation = permission
    registry = request.app[STORES]
    store = registry.peek(store_id)
    if store is None:
        store = await registry.find(store_id, request.app[SETTINGS].consistency_timeout_ms / 1000)
    if store is None or store.project_id != claims.pid:
        raise Forbidden("No such store in the session's project.", details={"reason": "store"})
    try:
        result = graph.check(store.graph, object=obj, relation=relation, user=f"user:{claims.sub}",
                             max_depth=request.app[SETTINGS].check_max_depth)
    except graph.ResolutionTooComplex as exc:
        raise ResolutionTooComplex(details={"max_depth": exc.max_depth}) from None
    if not result.allowed:
        raise Forbidden(f"The user may not {relation} {obj}.",
                        details={"reason": "permission", "object": obj, "relation": relation})


def _answer(request: web.Request, claims: AccessClaims) -> web.Response:
    headers = {"Content-Type": "application/json", "Service-User-Id": claims.sub,
               "Service-Session-Id": claims.sid, "Service-Project-Id": claims.pid}
    if claims.act_org is not None:
        headers["Service-Org-Id"] = claims.act_org
        if claims.act_role is not None:
            headers["Service-Org-Role"] = claims.act_role
    body = {"user_id": claims.sub, "session_id": claims.sid, "org_id": claims.act_org,
            "org_role": claims.act_role, "project_id": claims.pid,
            "request_id": request[REQUEST_ID]}
    return OneWriteResponse(body=orjson.dumps(body), headers=headers)


# -- handlers ----------------------------------------------------------------------------------

_REPLY: Final = Reply(200, "The session is valid (and the permission, when asked, allowed).",
                      EdgeIdentity, headers=_HEADERS)
_SECURITY: Final = ("session",)


async def validate(request: web.Request) -> web.Response:
    """Validate a session (and optionally a permission) for an edge proxy.

    The access token comes as ``Authorization: Bearer`` or the ``service_session`` cookie (the
    Bearer token wins). 401 ``no_session`` without one; 401 ``invalid_session`` with
    ``details.reason`` ``signature``, ``expired``, ``project`` (``project_id`` or
    ``Service-Project`` names another project) or ``revoked``. With ``store_id``, ``object``
    and ``relation`` (query parameters, or the JSON body of a POST; all three or none from
    each, and both must be allowed when both are given) the call also checks ``user:<sub>``
    and answers 403 ``forbidden`` when denied; the session is judged first. Bad parameters
    (also a parameter repeated with different values) are 400 ``invalid_request``."""
    permissions = [_permission(_one_each(request.query, _QUERY_NAMES))]
    if request.method == "POST" and request.can_read_body:
        body = await read_json(request)
        unknown = [k for k in body if k not in _PERMISSION]
        if unknown:
            raise InvalidRequest(f"{unknown[0]}: unknown field", details={
                "fields": [{"field": k, "message": "unknown field"} for k in unknown]})
        permissions.append(_permission(body))
    _check_pin(request)
    try:
        claims = await _session(request)
        for permission in dict.fromkeys(p for p in permissions if p is not None):
            await _allowed(request, claims, permission)
    except ServiceError as exc:
        edge_metrics.denied(exc)
        raise
    edge_metrics.valid()
    return _answer(request, claims)


async def forward_auth(request: web.Request) -> web.Response:
    """Forward auth for an edge proxy: 200 with the identity headers, 401, or 403.

    The proxy calls this for each request it guards (any method; ``X-Forwarded-Method``,
    ``X-Forwarded-Uri``, ``X-Original-URI`` and ``X-Forwarded-Host`` describe the original
    request, and any path may follow ``/v1/edge/auth/``). The token and the answers are those
    of ``validate``, except that it only ever answers 200, 401 or 403: what ``validate`` would
    refuse with another status (bad permission parameters, another project's store, stores
    still loading, the depth cap, PostgreSQL unreachable) is denied with 403 ``forbidden``.
    A permission may come from the query string and from the ``Service-Check-Store``,
    ``Service-Check-Object`` and ``Service-Check-Relation`` headers, a pin from ``project_id``
    and ``Service-Project``; every one given must hold, since the query string may be the
    original request's (Envoy ext_authz, Caddy): see the module's docstring."""
    try:
        claims = await _session(request)  # 401 before 403 (DESIGN.md)
        headers = request.headers
        permissions: list[tuple[str, str, str]] = []
        if _CHECK_STORE in headers or _CHECK_OBJECT in headers or _CHECK_RELATION in headers:
            permission = _permission(_one_each(headers, _CHECK_HEADERS))
            if permission is not None:
                permissions.append(permission)
        if request.query_string:  # the common forward-auth call has none: parse only if any
            _check_pin(request)
            permission = _permission(_one_each(request.query, _QUERY_NAMES))
            if permission is not None and permission not in permissions:
                permissions.append(permission)
        for permission in permissions:
            await _allowed(request, claims, permission)
    except ServiceError as exc:
        edge_metrics.denied(exc)
        if exc.status in (401, 403):
            raise
        raise Forbidden(exc.message, details={"reason": exc.code}) from None
    except Exception as exc:  # an outage must not become a 500 the proxy turns into an error
        log.warning("forward auth denied: %s: %s", type(exc).__name__, exc)
        denial = Forbidden("The session cannot be judged now.", details={"reason": "unavailable"})
        edge_metrics.denied(denial)
        raise denial from None
    edge_metrics.valid()
    return _answer(request, claims)


def _add(method: str, path: str, handler: Any, operation_id: str, *, body: type[Any] | None,
         query: type[Any] | None, headers: dict[str, str],
         errors: tuple[type[ServiceError], ...]) -> None:
    summary, description = summary_of(handler)
    routes.add(Operation(method=method, path=path, handler=handler, operation_id=operation_id,
                         tag=routes.tag, summary=summary, description=description,
                         security=_SECURITY, query=query, body=body,
                         headers=headers, replies=(_REPLY,), errors=errors))


_VALIDATE_ERRORS: Final = (NoSession, InvalidSession, Forbidden, NotReady, ResolutionTooComplex)
_add("GET", "/v1/edge/validate", validate, "edge_validate", body=None, query=EdgeQuery,
     headers=_REQUEST_HEADERS, errors=_VALIDATE_ERRORS)
_add("POST", "/v1/edge/validate", validate, "edge_validate_post", body=EdgeValidateBody,
     query=EdgeQuery, headers=_REQUEST_HEADERS, errors=_VALIDATE_ERRORS)
_AUTH_PATHS: Final = ("/v1/edge/auth", r"/v1/edge/auth/{tail:[\s\S]*}")
for _method in sorted(METHODS):
    for _path, _suffix in zip(_AUTH_PATHS, ("", "_tail"), strict=True):
        _add(_method, _path, forward_auth, f"edge_auth{_suffix}_{_method.lower()}", body=None,
             query=EdgeQuery, headers=_FORWARD_HEADERS, errors=(NoSession, InvalidSession, Forbidden))


def mount(router: web.UrlDispatcher) -> None:
    """Register the edge routes with ``router``, and the forward-auth paths for every other
    method too (OPTIONS, TRACE, WebDAV's...): Envoy's ext_authz asks with the original
    request's method, and a 405 would reach the client of a CORS preflight as a refusal (Envoy
    allows only 200; nginx makes a 500 of anything but 200, 401 and 403). The document lists
    the common methods; these answer alike."""
    deny_only_under("/v1/edge/auth")  # what the envelope refuses there too: 401 or 403 only
    resources = routes.mount(router)
    for path in _AUTH_PATHS:  # on the same resources: one match attempt per path
        resources[path].add_route("*", forward_auth)
