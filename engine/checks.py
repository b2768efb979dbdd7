"""Permission checks over HTTP: ``POST /v1/stores/{store_id}/check`` and ``/batch-check``.

The hot path of the product, so the handlers stay thin and cheap: the body is decoded with orjson
and checked by hand (no pydantic), the store comes from memory (:mod:`engine.registry`), the rule
is :func:`engine.graph.check`, and the answer is serialized with orjson directly.

Request (check)::

    {"tuple_key": {"object": "doc:1", "relation": "viewer", "user": "user:7"},
     "consistency": {"at_least_revision": 12}}          # optional

Answer (200)::

    {"allowed": true, "resolution": "direct" | "userset" | "none",
     "resolution_path": ["doc:1#viewer@user:7"], "revision": 12,
     "dispatch_count": 1, "depth": 1, "request_id": "req_..."}

``dispatch_count`` is the number of ``object#relation`` nodes the check visited (the work it
took; SpiceDB's ``dispatch_count``), ``depth`` the number of nodes on the proof (0 when denied).

While the engine cannot follow the change log (PostgreSQL away: :attr:`StoreRegistry.stale`),
checks are still answered from memory at the store's last revision, and say so: the body gets
``"stale": true`` and the response ``X-Authio-Stale: true``. That costs a normal answer one
attribute read.

Batch: ``{"checks": [<check request>, ...], "consistency"?}`` with 1..1000 items, answered in order
in ``{"results": [...], "revision", "request_id"}``; each result is an answer as above (without
``request_id``) or ``{"error": {"code", "message", "details"}}`` for that item alone.

Errors (the envelope of ``common.http``): ``missing_api_key``/``invalid_api_key`` 401,
``insufficient_scope`` 403 (``authz:check``), ``invalid_request`` 400 with ``details.fields``
(unknown fields are rejected), ``store_not_found`` 404 (also for another project's store),
``resolution_too_complex`` 422 with ``details.max_depth``, ``revision_ahead`` 400 and
``revision_not_reached`` 503 (with ``Retry-After``), both with
``details.requested``/``details.current``, ``not_ready`` 503 while the stores are still loading.

``consistency.at_least_revision`` (DESIGN.md's codes): at or below what this engine has, nothing
to do; above it, a revision the store has never reached (beyond ``stores.revision``, its committed
head in PostgreSQL, read by one primary-key lookup unless a notification already said the
revision exists) is ``revision_ahead`` at once, with the head as ``details.current``: no wait
makes it true. A committed one is waited for, on the follower's progress, up to
``SERVICE_CONSISTENCY_TIMEOUT_MS`` in all, then ``revision_not_reached`` with this engine's
revision as ``details.current``: another engine (or this one a moment later) has it. With
PostgreSQL unreachable the head cannot be read, so the wait decides alone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import orjson
from aiohttp import web

from common.appkeys import AUTHENTICATOR, SETTINGS
from common.auth import Principal
from common.errors import (
    InvalidRequest,
    NotReady,
    ResolutionTooComplex,
    RevisionAhead,
    RevisionNotReached,
    ServiceError,
    StoreNotFound,
)
from common.http import REQUEST_ID, OneWriteResponse, read_json
from common.ids import is_id
from common.routing import Reply, RouteTable
from common.schemas import parse_path_param
from common.tuples import (
    TupleFormatError,
    is_valid_tuple,
    validate_object,
    validate_relation,
    validate_user,
)
from engine import graph
from engine.appkeys import STORES
from engine.registry import LoadedStore, StoreRegistry
from engine.schemas import MAX_BATCH, BatchCheckRequest, BatchCheckResult, CheckRequest, CheckResult

__all__ = ["batch_check", "check", "routes"]

log = logging.getLogger("authio.engine.checks")

SCOPE: Final = "authz:check"
routes = RouteTable("checks", "Permission checks, answered from memory by the engine.")
_ERRORS: Final = (StoreNotFound, NotReady, RevisionAhead, RevisionNotReached)

_CHECK_FIELDS: Final = frozenset({"tuple_key", "consistency"})
_BATCH_FIELDS: Final = frozenset({"checks", "consistency"})
_TUPLE_FIELDS: Final = ("object", "relation", "user")
_TUPLE_FIELD_SET: Final = frozenset(_TUPLE_FIELDS)
_CONSISTENCY_FIELDS: Final = frozenset({"at_least_revision"})
_VALIDATORS: Final = (validate_object, validate_relation, validate_user)
_JSON_HEADERS: Final = {"Content-Type": "application/json"}
STALE_HEADER: Final = "X-Authio-Stale"
_STALE_HEADERS: Final = {**_JSON_HEADERS, STALE_HEADER: "true"}
_STALE_TEXT: Final = (
    "`true` when the engine cannot follow the change log (PostgreSQL unreachable) and answers "
    "from memory at the store's last revision, which may be behind; absent otherwise.")

Fields = list[dict[str, str]]
Parsed = tuple[str, str, str, int | None]  # object, relation, user, at_least_revision


# -- parsing (no pydantic on the hot path) ---------------------------------------------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _unknown(data: dict[str, Any], allowed: frozenset[str], prefix: str, fields: Fields) -> None:
    if not allowed.issuperset(data):
        fields.extend({"field": prefix + str(k), "message": "unknown field"}
                      for k in data if k not in allowed)


def _parse_consistency(value: Any, prefix: str, fields: Fields) -> int | None:
    """``{"at_least_revision": int >= 0}`` (or null / absent) -> the revision or None."""
    if value is None:
        return None
    if type(value) is not dict:
        fields.append({"field": prefix, "message": f"must be an object, not {_type_name(value)}"})
        return None
    _unknown(value, _CONSISTENCY_FIELDS, prefix + ".", fields)
    rev = value.get("at_least_revision")
    if rev is None:
        return None
    if type(rev) is float and rev.is_integer():
        rev = int(rev)  # JSON Schema's integer: a number without a fractional part (5.0 too)
    if type(rev) is not int or rev < 0:
        fields.append({"field": prefix + ".at_least_revision",
                       "message": "must be an integer >= 0"})
        return None
    return rev


def _parse_check(data: Any, fields: Fields, where: str = "body") -> Parsed | None:
    """One check request object -> (object, relation, user, at_least_revision).

    Appends ``{"field", "message"}`` entries to ``fields`` (dotted paths relative to the check
    object; ``where`` names the object itself when it is not one) and returns None when anything
    is wrong.
    """
    if type(data) is not dict:
        fields.append({"field": where, "message": f"must be an object, not {_type_name(data)}"})
        return None
    if len(data) == 1:  # the common shape, {"tuple_key": {...}}: validated in one pass
        key = data.get("tuple_key")
        if type(key) is dict and len(key) == 3:
            o: Any
            r: Any
            u: Any
            o, r, u = key.get("object"), key.get("relation"), key.get("user")
            if is_valid_tuple(o, r, u):  # so all three are valid strings
                return o, r, u, None
    _unknown(data, _CHECK_FIELDS, "", fields)
    key = data.get("tuple_key")
    values: list[str] = []
    if type(key) is not dict:
        message = "field required" if key is None else f"must be an object, not {_type_name(key)}"
        fields.append({"field": "tuple_key", "message": message})
    else:
        if not _TUPLE_FIELD_SET.issuperset(key):
            _unknown(key, _TUPLE_FIELD_SET, "tuple_key.", fields)
        for name, validate in zip(_TUPLE_FIELDS, _VALIDATORS, strict=True):
            raw = key.get(name)
            if type(raw) is not str:
                message = "field required" if raw is None else "must be a string"
                fields.append({"field": "tuple_key." + name, "message": message})
                continue
            try:
                values.append(validate(raw))
            except TupleFormatError as exc:
                fields.append({"field": "tuple_key." + name, "message": exc.message})
    at_least = _parse_consistency(data.get("consistency"), "consistency", fields)
    if fields:
        return None
    return values[0], values[1], values[2], at_least


def _invalid(fields: Fields) -> InvalidRequest:
    first = fields[0]
    return InvalidRequest(f"{first['field']}: {first['message']}", details={"fields": fields})


def _parse_batch(data: dict[str, Any]) -> tuple[list[Any], int | None]:
    """The batch envelope -> (raw items, top-level at_least_revision); raises InvalidRequest."""
    fields: Fields = []
    _unknown(data, _BATCH_FIELDS, "", fields)
    checks = data.get("checks")
    if type(checks) is not list:
        message = "field required" if checks is None else "must be an array"
        fields.append({"field": "checks", "message": message})
    elif not 1 <= len(checks) <= MAX_BATCH:
        fields.append({"field": "checks",
                       "message": f"must hold 1 to {MAX_BATCH} items, not {len(checks)}"})
    at_least = _parse_consistency(data.get("consistency"), "consistency", fields)
    if fields:
        raise _invalid(fields)
    assert type(checks) is list
    return checks, at_least


# -- the shared steps ------------------------------------------------------------------------


async def _principal(request: web.Request) -> Principal:
    principal = await request.app[AUTHENTICATOR].authenticate(request.headers.get("Authorization"))
    principal.require(SCOPE)
    return principal


async def _store(request: web.Request, principal: Principal) -> LoadedStore:
    """The caller's store from memory (loaded on demand); StoreNotFound for a missing store and
    for another project's store alike, NotReady while the snapshot is still loading.

    An id that is not a well-formed store id is not found at once (one holding a control
    character is ``invalid_request``, as on the control plane): only a miss on a plausible id
    costs a load task and a query."""
    registry = request.app[STORES]
    store_id = request.match_info["store_id"]
    store = registry.peek(store_id)
    if store is None:
        if not is_id(store_id, "store"):
            parse_path_param("store_id", store_id)
            raise StoreNotFound()
        store = await registry.find(store_id, _timeout_s(request))
    if store is None or store.project_id != principal.project_id:
        raise StoreNotFound()
    return store


def _timeout_s(request: web.Request) -> float:
    return request.app[SETTINGS].consistency_timeout_ms / 1000


async def _committed(registry: StoreRegistry, store: LoadedStore, revision: int,
                     timeout_s: float) -> int | None:
    """A revision of ``store`` known committed that is at least ``revision`` when there is one,
    else the store's committed head (below ``revision``: the caller's ``revision_ahead``), or
    None when PostgreSQL could not tell within ``timeout_s`` seconds (then only the wait can).
    Raises StoreNotFound when the store was deleted meanwhile. Reads PostgreSQL only when
    ``revision`` is above :meth:`StoreRegistry.heard`."""
    heard = registry.heard(store)
    if revision <= heard:
        return heard
    try:
        head = await registry.head(store.id, timeout_s)
    except Exception as exc:  # PostgreSQL unreachable or slow: whether it exists is unknown
        log.debug("head of store %s unknown (%s); waiting for the follower", store.id,
                  type(exc).__name__)
        return None
    if head is None:
        raise StoreNotFound()
    return head


async def _reach(request: web.Request, store: LoadedStore, revision: int | None) -> None:
    """Wait (bounded) until ``store`` reflects ``revision``; raises RevisionAhead at once for a
    revision beyond the store's committed head, RevisionNotReached when the bound ends first."""
    if revision is None or store.revision >= revision:
        return
    registry, timeout_s = request.app[STORES], _timeout_s(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    committed = await _committed(registry, store, revision, timeout_s)
    if committed is not None and committed < revision:
        raise _ahead(revision, committed)
    if not await registry.wait_for(store, revision, max(deadline - loop.time(), 0.0)):
        raise _not_reached(revision, store.revision)


def _ahead(requested: int, head: int) -> RevisionAhead:
    return RevisionAhead(
        f"Revision {requested} does not exist: the store's latest revision is {head}.",
        details={"requested": requested, "current": head},
    )


def _not_reached(requested: int, current: int) -> RevisionNotReached:
    return RevisionNotReached(
        f"Revision {requested} is not available on this engine yet; it is at {current}. Retry.",
        details={"requested": requested, "current": current},
    )


def _answer(store: LoadedStore, parsed: Parsed, max_depth: int) -> dict[str, Any]:
    """Run one check; raises graph.ResolutionTooComplex."""
    result = graph.check(store.graph, object=parsed[0], relation=parsed[1], user=parsed[2],
                         max_depth=max_depth)
    return {"allowed": result.allowed, "resolution": result.resolution,
            "resolution_path": result.resolution_path, "revision": store.revision,
            "dispatch_count": result.dispatch_count, "depth": result.depth}


def _respond(request: web.Request, body: dict[str, Any]) -> web.Response:
    body["request_id"] = request[REQUEST_ID]
    if request.app[STORES].stale:
        body["stale"] = True
        return OneWriteResponse(body=orjson.dumps(body), headers=_STALE_HEADERS)
    return OneWriteResponse(body=orjson.dumps(body), headers=_JSON_HEADERS)


def _item_error(err: ServiceError) -> dict[str, Any]:
    return {"error": {"code": err.code, "message": err.message, "details": err.details}}


# -- handlers ----------------------------------------------------------------------------------


@routes.route("POST", "/v1/stores/{store_id}/check", operation_id="check_permission",
              security=("api_key",), scopes=(SCOPE,), body=CheckRequest, errors=(*_ERRORS, ResolutionTooComplex),
              replies=[Reply(200, "The answer, and how it was reached.", CheckResult,
                             headers={STALE_HEADER: _STALE_TEXT})])
async def check(request: web.Request) -> web.Response:
    """Check one permission: does the user have the relation on the object?

    Answered from the engine's memory at the store's current revision, or at least at
    ``consistency.at_least_revision``: a revision a write returned is waited for up to
    ``SERVICE_CONSISTENCY_TIMEOUT_MS`` (2 s), then ``revision_not_reached`` (503, with
    ``Retry-After``: retry, this engine or another will have it); a revision beyond the store's
    latest is ``revision_ahead`` (400) at once, since no wait makes it exist. Both say
    ``details.requested`` and ``details.current`` (the store's latest revision for
    ``revision_ahead``, this engine's for ``revision_not_reached``). ``resolution_path`` says why
    an answer is yes; a check that hits the depth cap is ``resolution_too_complex``, never a no.
    While PostgreSQL is unreachable the engine keeps answering from memory at the last revision
    it has, marked ``stale`` (and ``X-Authio-Stale: true``); a revision it has not reached is
    ``revision_not_reached``."""
    # The steps of _principal, _store and _reach, with their common case inline: this handler
    # is the product's hot path, and each coroutine call saved is a frame per request.
    app = request.app
    principal = await app[AUTHENTICATOR].authenticate(request.headers.get("Authorization"))
    principal.require(SCOPE)
    fields: Fields = []
    # allow_nul: the tuple rules refuse NUL field by field, so a batch item holding one fails
    # alone, and no text of a check reaches PostgreSQL.
    parsed = _parse_check(await read_json(request, allow_nul=True), fields)
    if parsed is None:
        raise _invalid(fields)
    store = app[STORES].peek(request.match_info["store_id"])
    if store is None or store.project_id != principal.project_id:
        store = await _store(request, principal)
    if parsed[3] is not None and store.revision < parsed[3]:
        await _reach(request, store, parsed[3])
    try:
        body = _answer(store, parsed, app[SETTINGS].check_max_depth)
    except graph.ResolutionTooComplex as exc:
        raise ResolutionTooComplex(details={"max_depth": exc.max_depth}) from None
    return _respond(request, body)


@routes.route("POST", "/v1/stores/{store_id}/batch-check", security=("api_key",),
              scopes=(SCOPE,), body=BatchCheckRequest, errors=_ERRORS,
              replies=[Reply(200, "One result per check, in order.", BatchCheckResult,
                             headers={STALE_HEADER: _STALE_TEXT})])
async def batch_check(request: web.Request) -> web.Response:
    """Check up to 1,000 permissions in one call, answered in order at one revision.

    Authentication, scope, the envelope, the store and the top-level ``consistency`` fail the
    whole call (``revision_ahead`` 400, ``revision_not_reached`` 503 with ``Retry-After``, as for
    a single check); a bad item (invalid tuple or fields, depth cap hit, its own
    ``consistency.at_least_revision`` beyond the store's latest revision or not reached in
    time) only gets an ``error`` result with the same codes. All items are answered at one
    revision, after one bounded wait for the highest revision asked.
    """
    principal = await _principal(request)
    items, at_least = _parse_batch(await read_json(request, allow_nul=True))
    store = await _store(request, principal)
    parsed: list[Parsed | InvalidRequest] = []
    append = parsed.append
    wanted = -1 if at_least is None else at_least
    o: Any
    r: Any
    u: Any
    for i, item in enumerate(items):
        if type(item) is dict and len(item) == 1:  # _parse_check's common shape, inline
            key = item.get("tuple_key")
            if type(key) is dict and len(key) == 3:
                o, r, u = key.get("object"), key.get("relation"), key.get("user")
                if is_valid_tuple(o, r, u):
                    append((o, r, u, None))
                    continue
        fields: Fields = []
        one = _parse_check(item, fields, f"checks[{i}]")
        if one is None:
            append(_invalid(fields))
            continue
        append(one)
        if one[3] is not None and one[3] > wanted:
            wanted = one[3]
    committed = -1  # a revision known committed (the head when one was asked beyond it)
    if wanted > store.revision:  # one bounded wait covers the call's and every item's revision
        registry, timeout_s = request.app[STORES], _timeout_s(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        known = await _committed(registry, store, wanted, timeout_s)
        if known is not None:
            committed = known
            if at_least is not None and at_least > known:
                raise _ahead(at_least, known)
            wanted = min(wanted, known)  # waiting for more would not bring it
        if wanted > store.revision:
            await registry.wait_for(store, wanted, max(deadline - loop.time(), 0.0))
        if at_least is not None and store.revision < at_least:
            raise _not_reached(at_least, store.revision)
    max_depth = request.app[SETTINGS].check_max_depth
    results: list[dict[str, Any]] = []
    add = results.append
    # No await below: every item sees the same revision. The answers are _answer's, built
    # inline; an answer object the graph hands out again (a shared denial, a cached answer)
    # has its item built once per call.
    revision, g, check_ = store.revision, store.graph, graph.check
    built: dict[int, tuple[graph.CheckResult, dict[str, Any]]] = {}
    for p in parsed:
        if isinstance(p, InvalidRequest):
            add(_item_error(p))
        elif p[3] is not None and p[3] > revision:
            add(_item_error(_ahead(p[3], committed) if 0 <= committed < p[3]
                            else _not_reached(p[3], revision)))
        else:
            try:
                res = check_(g, p[0], p[1], p[2], max_depth)  # (by position: no keyword matching)
            except graph.ResolutionTooComplex as exc:
                add(_item_error(ResolutionTooComplex(details={"max_depth": exc.max_depth})))
                continue
            made = built.get(id(res))
            if made is not None and made[0] is res:
                add(made[1])
                continue
            body = {"allowed": res.allowed, "resolution": res.resolution,
                    "resolution_path": res.resolution_path, "revision": revision,
                    "dispatch_count": res.dispatch_count, "depth": res.depth}
            built[id(res)] = (res, body)  # (res kept alive: its id is not reused meanwhile)
            add(body)
    return _respond(request, {"results": results, "revision": revision})
