"""Store and tuple routes. Writes need ``authz:write``; reads accept ``authz:write`` or
``authz:check``. Checks themselves are the engine's (``engine.app``)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import IdempotencyKeyReused, StoreNotFound
from common.routing import Reply, RequestHeader, RouteTable
from control_plane.appkeys import CURSOR_SECRET
from control_plane.authz import repository, service
from control_plane.authz.schemas import (
    IDEMPOTENCY_KEY,
    IDEMPOTENCY_KEY_PATTERN,
    CreateStore,
    Store,
    StoredTuple,
    TuplesQuery,
    WriteBody,
    Written,
    idempotency_key,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page, PageQuery, page_by_id

routes = RouteTable("authz", "Stores of relationship tuples, and writing them.")
READ: Final = auth.ApiKey("authz:write", "authz:check")
WRITE: Final = auth.ApiKey("authz:write")


@endpoint(routes, "POST", "/v1/stores", auth=WRITE,
          replies=[Reply(201, "The store, at revision 0.", Store)])
async def post_stores(call: Call, body: CreateStore) -> web.Response:
    """Create a store; engines load it ahead of its first check."""
    async with call.connection() as conn:
        store = await service.create_store(conn, call.actor, name=body.name)
    return call.reply(store, status=201)


@endpoint(routes, "GET", "/v1/stores", auth=READ,
          replies=[Reply(200, "A page of stores in creation order.", Page[Store])])
async def get_stores(call: Call, query: PageQuery) -> web.Response:
    """List the project's stores."""
    page = await page_by_id(call.pool, Listing("stores", call.project_id, call.app[CURSOR_SECRET]),
                            query, table="stores", columns=repository.STORE_COLUMNS,
                            row=repository.store)
    return call.reply(page)


@endpoint(routes, "GET", "/v1/stores/{store_id}", auth=READ, errors=[StoreNotFound],
          replies=[Reply(200, "The store.", Store)])
async def get_store(call: Call) -> web.Response:
    """Show a store and its current revision."""
    return call.reply(await service.find_store(call.pool, call.project_id, call.path("store_id")))


@endpoint(routes, "POST", "/v1/stores/{store_id}/write", auth=WRITE,
          errors=[StoreNotFound, IdempotencyKeyReused], operation_id="write_tuples",
          headers={IDEMPOTENCY_KEY: RequestHeader(
              "Optional, 1 to 255 printable ASCII characters (a UUID will do), remembered per "
              "store for 24 hours: a write sent again with the same key is not applied again "
              "but answered with the first outcome (and `Idempotent-Replayed: true`); the same "
              "key with other tuples is `idempotency_key_reused`.", IDEMPOTENCY_KEY_PATTERN)},
          replies=[Reply(200, "What changed, and the revision to check at.", Written,
                         headers={"Idempotent-Replayed": (
                             "`true` when this is the recorded answer of an earlier request "
                             "with the same `Idempotency-Key`.")})])
async def post_store_write(call: Call, body: WriteBody) -> web.Response:
    """Write and delete tuples atomically (1 to 1,000 in all).

    Writing an existing tuple or deleting an absent one is a no-op; a bad or repeated tuple
    refuses the whole call, naming it (``writes.3.object``). An effective write takes the
    store's next revision: pass it as ``consistency.at_least_revision`` to check at it.

    Retrying is always safe: the same write applied twice leaves the same tuples, so a retry
    without a key answers ``written: 0`` for what the first try wrote. To get the first answer
    itself, counts and revision, send an ``Idempotency-Key``. A 503 ``db_unavailable`` means
    nothing was written, except with ``details.outcome: "unknown"``: the database went away
    while the write was committing and did not come back in time to tell; a retry with the same
    key tells. When the connection is lost while the write commits and the database answers
    again within seconds, the service reads the outcome back itself."""
    key = idempotency_key(call.request.headers.get(IDEMPOTENCY_KEY))
    written, replayed = await service.write_tuples(
        call.pool, call.actor, store_id=call.path("store_id"), body=body, idempotency_key=key)
    return call.reply(written, headers={"Idempotent-Replayed": "true"} if replayed else None)


@endpoint(routes, "GET", "/v1/stores/{store_id}/tuples", auth=READ, errors=[StoreNotFound],
          operation_id="list_tuples",
          replies=[Reply(200, "A page of tuples in (object, relation, user) order.",
                         Page[StoredTuple])])
async def get_store_tuples(call: Call, query: TuplesQuery) -> web.Response:
    """List a store's tuples, filtered by exact ``object``, ``relation`` and ``user``."""
    store_id = call.path("store_id")
    page = await service.list_tuples(
        call.pool, Listing(f"tuples:{store_id}", call.project_id, call.app[CURSOR_SECRET]),
        store_id, query)
    return call.reply(page)
