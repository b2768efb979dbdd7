"""Stores: the per-project containers of tuples (POST/GET /v1/stores, GET /v1/stores/{id}).

A store belongs to one project; any store of another project is ``store_not_found`` for this
project's keys, exactly like a store that does not exist.
"""

from __future__ import annotations

from typing import Any, Final

import asyncpg
from aiohttp import web

from common import changes
from common.appkeys import PG_POOL
from common.errors import StoreNotFound
from common.http import json_response
from common.ids import new_id
from common.schemas import DisplayName, RequestModel, parse_body
from control_plane.appkeys import CURSOR_SECRET
from control_plane.pagination import project_page_by_id
from control_plane.principal import authenticate

_COLUMNS: Final = "id, name, revision, created_at, updated_at"
READ_SCOPES: Final = ("authz:write", "authz:check")


class CreateStoreBody(RequestModel):
    name: DisplayName


async def create_store(conn: asyncpg.Connection, project_id: str, name: str) -> dict[str, Any]:
    """Insert a store at revision 0 and tell engines about it (they load it ahead of checks)."""
    async with conn.transaction():
        row = await conn.fetchrow(
            f"INSERT INTO stores (id, project_id, name) VALUES ($1, $2, $3) RETURNING {_COLUMNS}",
            new_id("store"), project_id, name,
        )
        assert row is not None
        await conn.execute("SELECT pg_notify($1, $2)", changes.CHANNEL, changes.payload(row["id"], 0))
    return dict(row)


async def get_store(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                    store_id: str) -> dict[str, Any]:
    """The store, or StoreNotFound when it is absent or another project's."""
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM stores WHERE id = $1 AND project_id = $2", store_id, project_id
    )
    if row is None:
        raise StoreNotFound()
    return dict(row)


async def post_store(request: web.Request) -> web.Response:
    principal = await authenticate(request, "authz:write")
    body = await parse_body(request, CreateStoreBody)
    async with request.app[PG_POOL].acquire() as conn:
        store = await create_store(conn, principal.project_id, body.name)
    return json_response(request, store, status=201)


async def list_stores(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    body = await project_page_by_id(request.app[PG_POOL], request.query, table="stores",
                                    columns=_COLUMNS, project_id=principal.project_id,
                                    secret=request.app[CURSOR_SECRET])
    return json_response(request, body)


async def show_store(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    store = await get_store(request.app[PG_POOL], principal.project_id,
                            request.match_info["store_id"])
    return json_response(request, store)
